#!/usr/bin/env bash
# Lab: one GPU call for the streaming paged producer of the sm90 kernel: FlashInfer's prefill modules compiled in the
# background (niced), the sm90 GPU tests, the GPU suite (BLAS threads limited to one per pytest worker: with one per
# core the workers' float64 references oversubscribe the CPU and stall), the prefill suite P1-P6 with peers, then a
# same-run A/B of bench/lab/sm90/softmax_tree_max.patch on P1-P3 (A = .ab/base, a copy of this tree). Logs under $OUT.
#   env: DEADLINE_S (585), SKIP_AB=1
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - t0) )); }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
( PYTHONPATH=/tmp/peers MAX_JOBS=12 nice -n 19 python3 -m bench warm --cases P1,P2,P3,P4,P5,P6 > "$OUT/fi_warm.log" 2>&1
  touch /tmp/warm.done ) &
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
timeout 120 python3 -m pytest tests/gpu/test_prefill_sm90.py -q -p no:cacheprovider -rfE -n 8 > "$OUT/sm90_tests.txt" 2>&1
echo "sm90 tests exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/sm90_tests.txt" | tail -12
timeout 200 python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 \
  --durations=10 > "$OUT/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite.txt" | tail -20
while [ ! -f /tmp/warm.done ] && [ "$(left)" -gt 200 ]; do sleep 5; done
echo "FlashInfer warm: $( [ -f /tmp/warm.done ] && echo done || echo 'not done') at $(at)"
PYTHONPATH=/tmp/peers timeout $(( $(left) - 20 )) python3 -m bench prefill --cases P1,P2,P3,P4,P5,P6 --no-plot \
  --out "$OUT/res" > "$OUT/bench.txt" 2>&1
echo "bench exit $? at $(at)"; grep -E "^P[0-9]|^case" "$OUT/bench.txt" | cut -c1-200
grep -E "^ +P[0-9] +cuinfer\[(sm90|fa2)\]|flashinfer\[fa3\]" "$OUT/bench.txt" | cut -c1-80
if [ "${SKIP_AB:-0}" != 1 ] && [ "$(left)" -gt 150 ] && git apply bench/lab/sm90/softmax_tree_max.patch; then
  AB_BASE=.ab/base AB_WORK=/tmp/ab timeout $(( $(left) - 5 )) bash bench/lab/gpu_ab.sh prefill P1,P2,P3 3 > "$OUT/ab.txt" 2>&1
  echo "A/B exit $? at $(at)"; tail -12 "$OUT/ab.txt"
fi
