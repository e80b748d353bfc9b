#!/usr/bin/env bash
# Lab: one GPU call for the FlashInfer parity module and the memcheck re-runs after fixes. FlashInfer's JIT modules
# compile in parallel groups (one module, or a few small ones, per group; each group prints its parity table as it
# goes) while memcheck re-runs the JAX / sigmoid tests; then the whole parity module runs as pytest. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install --no-build-isolation --no-deps -e . > /dev/null 2>&1 || { echo "install failed"; exit 1; }
[ -d /tmp/peers/flashinfer ] || python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl
W=/tmp/parity; mkdir -p "$W"
export FLASHINFER_CUDA_ARCH_LIST=9.0a XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=/tmp/cc
group() {  # group <name> <jobs> <parity script arguments...>
  local name=$1 jobs=$2; shift 2
  ( start=$(date +%s); MAX_JOBS=$jobs timeout ${GROUP_S:-420} python3 tests/gpu/test_compat_parity.py --peers /tmp/peers "$@" > "$W/$name.log" 2>&1
    echo "exit $? after $(( $(date +%s) - start )) s" >> "$W/$name.log" ) &
}
D=decode-tc0-NHD,decode-tc0-HND,decode_graph-tc0
PF='prefill_paged-noncausal,prefill_paged-HND,prefill_ragged-causal$,prefill_ragged-mask,decode-tc1-NHD,decode-tc1-HND,decode_graph-tc1,prefill_lse_forms,prefill_paged-causal$'
group dec16 1 --cases $D --dtypes float16
group decbf 1 --cases $D --dtypes bfloat16
for o in window_left logits_soft_cap rope_llama alibi; do
  group dec_$o 1 --cases decode-tc0-$o
  group pre_$o 2 --cases prefill_paged-causal-$o,prefill_ragged-causal-$o,decode-tc1-$o
done
group pre16 2 --cases "$PF" --dtypes float16
group prebf 2 --cases "$PF" --dtypes bfloat16
group single16 1 --cases 'single$' --dtypes float16
group singlerope 1 --cases 'single-rope_llama$'
group singlebf 1 --cases 'single$' --dtypes bfloat16
group misc 1 --cases merge,errors,utilities
# SUITE=1: the whole GPU suite (parity module aside) meanwhile, niced, plain (no sanitizer)
if [ "${SUITE:-0}" = 1 ]; then
  ( nice -n 10 timeout ${SUITE_S:-420} python3 -m pytest -m gpu tests/gpu -q -n ${SUITE_WORKERS:-6} -p no:cacheprovider \
      --ignore=tests/gpu/test_compat_parity.py -rfE 2>&1 | grep -v "^E  \|^  " | tail -40 > "$OUT/gpu_suite.txt" ) &
fi
[ "${MEMCHECK_RERUN:-1}" = 1 ] || SKIP_SAN=1
# memcheck re-runs meanwhile: the tests that failed or never ran under memcheck in the previous call
[ -n "${SKIP_SAN:-}" ] || ( SELECT="(jax or sigmoid) and not test_compat_parity and not test_input_is_ordered_before_consumer_stream" \
  MEMCHECK_SHARDS=3 MEMCHECK_S=${MEMCHECK_S:-300} RACECHECK_S=1 SYNCCHECK_S=1 OUT=$W/san bash .ci/gpu_sanitize.sh > /dev/null 2>&1
  cp $W/san/sanitize_summary.txt "$OUT/memcheck_rerun_summary.txt"; cp $W/san/sanitize_logs.tar.gz "$OUT/memcheck_rerun_logs.tar.gz" ) &
san=$!
if [ -z "${SKIP_SAN:-}" ]; then
# the test the sanitizer crashed on (compute-sanitizer itself exited 139), alone: plain, then under memcheck
python3 -m pytest -m gpu -q -p no:cacheprovider -p no:benchmark "tests/gpu/test_interop_gpu.py::test_input_is_ordered_before_consumer_stream" \
  > "$W/ordered_plain.log" 2>&1; tail -2 "$W/ordered_plain.log"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 --target-processes all --report-api-errors no \
  python3 -m pytest -m gpu -q -p no:cacheprovider -p no:benchmark "tests/gpu/test_interop_gpu.py::test_input_is_ordered_before_consumer_stream" \
  > "$W/ordered_memcheck.log" 2>&1; echo "ordered under memcheck: exit $?"; tail -4 "$W/ordered_memcheck.log"
wait $san; cat "$OUT/memcheck_rerun_summary.txt"
fi
wait  # (every group: its modules compiled, its table printed; each stops at GROUP_S)
grep -h "FAIL\|exit\|Error" $W/*.log | grep -v " ok" | cut -c1-200 | head -40
PYTHONPATH=/tmp/peers timeout ${PARITY_S:-150} python3 -m pytest tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE 2>&1 \
  | grep -v "^E  \|^  " | tail -40 > "$OUT/parity_pytest.txt"
tail -25 "$OUT/parity_pytest.txt"
tar -czf "$OUT/parity_logs.tar.gz" -C $W --exclude=san .
