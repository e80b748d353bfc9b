#!/usr/bin/env bash
# Lab: one GPU call for fp8 K / V on the Hopper prefill kernel (bench/lab/sm90/fp8_kv.patch, applied here): a first fp8 sm90 test alone (a hang stops the call
# early), the GPU suite (-n 12), the prefill suite on $CASES (cuinfer rows; or an A/B against .ab/base, the tree before),
# then bench.lab.order_probe. Logs under $OUT.
#   env: CASES (P4,P5,P6,P4-e4m3,P5-e4m3,P6-e4m3), AB=1 (an A/B against .ab/base instead of one suite run; AB_ROUNDS),
#        SKIP_PROBE=1
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=/tmp/cc
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CASES=${CASES:-P4,P5,P6,P4-e4m3,P5-e4m3,P6-e4m3}
at() { echo "$(( $(date +%s) - t0 )) s"; }
git apply bench/lab/sm90/fp8_kv.patch || { echo "patch does not apply"; exit 1; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
timeout 90 python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider -rfE -x -k "sm90-paged-p16-e4m3 or sm90-ragged-e5m2" \
  > "$OUT/fp8_first.txt" 2>&1
rc=$?; echo "first fp8 sm90 tests exit $rc at $(at)"; tail -15 "$OUT/fp8_first.txt" | grep -v "^$"
[ $rc -eq 124 ] && { echo "hang: stopping"; exit 1; }
timeout 220 python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 \
  --durations=8 > "$OUT/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite.txt" | tail -25
if [ "${AB:-0}" = 1 ]; then
  AB_BASE=.ab/base AB_WORK=/tmp/ab timeout 240 bash bench/lab/gpu_ab.sh prefill "$CASES" ${AB_ROUNDS:-2} > "$OUT/ab.txt" 2>&1
  echo "A/B exit $? at $(at)"; sed -n '/^suite/,$p' "$OUT/ab.txt"
else
  timeout 200 python3 -m bench prefill --cases "$CASES" --no-peers --no-plot --out "$OUT/res" > "$OUT/bench.txt" 2>&1
  echo "bench exit $? at $(at)"; grep -E "^ +P[0-9](-e4m3)? +cuinfer" "$OUT/bench.txt" | cut -c1-110
fi
if [ "${SKIP_PROBE:-0}" != 1 ]; then
  timeout 120 python3 -m bench.lab.order_probe --cases P3,P6 --rounds 4 > "$OUT/order_probe.txt" 2>&1
  echo "order probe exit $? at $(at)"; grep median "$OUT/order_probe.txt"
fi
