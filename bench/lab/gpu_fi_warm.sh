#!/usr/bin/env bash
# Lab: compile FlashInfer's JIT modules for the fp8 decode bench, the variant bench and the compat parity module in
# the background of another GPU call (start it with setsid so it outlives that call; the machine keeps
# bench/.peer-cache while it stays warm). Groups run side by side, niced, each with a few nvcc jobs; every group writes
# /tmp/fiwarm/<group>.log and then /tmp/fiwarm/<group>.done. The parity groups print their table as they go.
set -uo pipefail
export PYTHONUNBUFFERED=1
W=/tmp/fiwarm; mkdir -p "$W"
[ -d /tmp/peers/flashinfer ] || python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl
export PYTHONPATH=/tmp/peers:${PYTHONPATH:-} FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-3}
export CUINFER_CACHE_DIR=/tmp/cc-warm XLA_PYTHON_CLIENT_PREALLOCATE=false
group() {  # group <name> <command...>
  local name=$1; shift
  ( start=$(date +%s); nice -n 19 "$@" > "$W/$name.log" 2>&1; echo "exit $? after $(( $(date +%s) - start )) s" >> "$W/$name.log"
    touch "$W/$name.done" ) &
}
P="python3 tests/gpu/test_compat_parity.py --peers /tmp/peers --cases"
group bench_decode python3 -m bench warm --cases D6,D10,D5-e4m3,D9-e4m3
group variants python3 -m bench.lab.variant_bench --peers fa2 --iters 1 --cases P1
group par_dec_a $P decode-tc0-NHD,decode-tc0-HND,decode_graph-tc0,decode-tc0-window_left
group par_dec_b $P decode-tc0-logits_soft_cap,decode-tc0-rope_llama,decode-tc0-alibi
group par_pre_a $P prefill_paged-noncausal,prefill_paged-causal-window_left,prefill_paged-causal-logits_soft_cap
group par_pre_b $P prefill_paged-causal-rope_llama,prefill_paged-causal-alibi
group par_single $P single,prefill_lse_forms
group par_misc $P merge,errors,utilities
wait
touch "$W/all.done"
