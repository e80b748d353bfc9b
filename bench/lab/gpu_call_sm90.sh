#!/usr/bin/env bash
# Lab: one GPU call for the Hopper prefill prototype (bench/lab/sm90_proto.py): install, FlashInfer's ragged prefill
# modules compiled in the background, the prototype's builds checked against the float64 reference (SM90_CHECK_ARGS;
# default: every built-in chain it takes), then (if they pass) the P1-P3 bench (SM90_BENCH_ARGS; default: causal,
# soft cap, ALiBi, window 1024) beside cuinfer's FA2-class kernel and FlashInfer fa3 (SM90_PEERS=0: without). Logs
# under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1
[ -d /tmp/peers/flashinfer ] || python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl
if [ "${SM90_PEERS:-1}" = 1 ] && [ ! -f /tmp/fiwarm_sm90.done ]; then
  ( PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=4 nice -n 19 \
      python3 -m bench warm --cases "${SM90_CASES:-P1,P2,P3}" > "$OUT/fi_warm.log" 2>&1; touch /tmp/fiwarm_sm90.done ) &
fi
# every built-in the prototype takes (the variant contract), alone or chained, against float64
CHECK_DEFAULT="--variants causal=,noncausal=noncausal,softcap=causal+soft_cap:30,alibi=causal+alibi,\
win1024=causal+window:1024,win100=causal+window:100,alibi_softcap=causal+alibi+soft_cap:30,\
softcap_alibi=causal+soft_cap:30+alibi,approx=causal+soft_cap_approx:30,cpasync=-DPROTO_TMA=0,\
dynamic=-DPROTO_DYNAMIC=1"
BENCH_DEFAULT="--variants causal=,dynamic=-DPROTO_DYNAMIC=1,softcap=causal+soft_cap:30,alibi=causal+alibi,\
win1024=causal+window:1024"
python3 -m bench.lab.sm90_proto --check ${SM90_CHECK_ARGS:-$CHECK_DEFAULT} > "$OUT/check.txt" 2>&1
rc=$?
cat "$OUT/check.txt"
if [ $rc -ne 0 ] && [ "${SM90_BENCH_ANYWAY:-0}" != 1 ]; then exit $rc; fi
if [ "${SM90_PEERS:-1}" = 1 ]; then
  while [ ! -f /tmp/fiwarm_sm90.done ]; do sleep 5; done
  PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a python3 -m bench.lab.sm90_proto --bench --peers \
    --cases "${SM90_CASES:-P1,P2,P3}" ${SM90_BENCH_ARGS:-$BENCH_DEFAULT} > "$OUT/bench.txt" 2>&1
else
  PYTHONPATH=/tmp/peers python3 -m bench.lab.sm90_proto --bench --cases "${SM90_CASES:-P1,P2,P3}" \
    ${SM90_BENCH_ARGS:-$BENCH_DEFAULT} > "$OUT/bench.txt" 2>&1
fi
cat "$OUT/bench.txt"
