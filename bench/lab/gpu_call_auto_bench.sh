#!/usr/bin/env bash
# Lab: one GPU call: FlashInfer's prefill modules for $CASES compiled in the background (niced) while
# bench/lab/gpu_call_auto.sh runs the tests (sm90 tests, the auto crossover, $SUITE), then the prefill suite on $CASES
# with FlashInfer fa2 / fa3 and SDPA until the deadline. Logs under $OUT.
#   env: CASES (P1,P2,P3,P4,P5,P6), SUITE, DEADLINE_S (590), TEST_DEADLINE_S (380), SKIP_BENCH=1 (tests only)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
C=${CASES:-P1,P2,P3,P4,P5,P6}
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
[ "${SKIP_BENCH:-0}" = 1 ] || ( PYTHONPATH=/tmp/peers MAX_JOBS=8 nice -n 19 python3 -m bench warm --cases "$C" > "$OUT/fi_warm.log" 2>&1
  touch /tmp/warm.done ) &
DEADLINE_S=${TEST_DEADLINE_S:-380} bash bench/lab/gpu_call_auto.sh
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
while [ ! -f /tmp/warm.done ] && [ $(( $(date +%s) - t0 )) -lt 440 ]; do sleep 5; done
echo "FlashInfer warm: $( [ -f /tmp/warm.done ] && echo done || echo 'not done') at $(at)"
PYTHONPATH=/tmp/peers timeout $(( ${DEADLINE_S:-590} - ($(date +%s) - t0) )) python3 -m bench prefill --cases "$C" \
  --out "$OUT/res" > "$OUT/bench.txt" 2>&1
echo "bench exit $? at $(at)"; grep -E "^ *P[0-9]" "$OUT/bench.txt" | cut -c1-220
