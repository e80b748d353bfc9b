#!/usr/bin/env bash
# Lab: one GPU call for fp8 K / V on the Hopper prefill kernel (float16 MMAs, producer conversion K a tile ahead of V):
# the first fp8 sm90 tests alone (a hang stops the call early), the fp8 test file, the prefill suite on $CASES
# (cuinfer rows: auto = sm90, fa2, sm90), then the GPU suite (-n 12). Logs under $OUT.
#   env: CASES (P4,P5,P6,P4-e4m3,P5-e4m3,P6-e4m3), SKIP_SUITE=1
. bench/lab/call_start.sh
CASES=${CASES:-P4,P5,P6,P4-e4m3,P5-e4m3,P6-e4m3}
timeout 120 python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider -rfE -x -o faulthandler_timeout=100 \
  -k "sm90-paged-p16-e4m3 or sm90-ragged-e5m2" > "$OUT/fp8_first.txt" 2>&1
rc=$?; echo "first fp8 sm90 tests exit $rc at $(at)"; tail -15 "$OUT/fp8_first.txt" | grep -v "^$"
[ $rc -eq 124 ] && { echo "hang: stopping"; exit 1; }
timeout 150 python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider -rfE -n 8 -o faulthandler_timeout=120 \
  > "$OUT/fp8_all.txt" 2>&1
echo "fp8 file exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/fp8_all.txt" | tail -15
timeout 200 python3 -m bench prefill --cases "$CASES" --no-peers --no-plot --out "$OUT/res" > "$OUT/bench.txt" 2>&1
echo "bench exit $? at $(at)"; grep -E "^ +P[0-9](-e4m3)? +cuinfer" "$OUT/bench.txt" | cut -c1-110
if [ "${SKIP_SUITE:-0}" != 1 ]; then
  timeout 240 python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 \
    -o faulthandler_timeout=150 --durations=8 > "$OUT/gpu_suite.txt" 2>&1
  echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR|Timeout" "$OUT/gpu_suite.txt" | tail -25
fi
