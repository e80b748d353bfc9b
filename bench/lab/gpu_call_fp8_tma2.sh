#!/usr/bin/env bash
# Lab: one GPU call for the fp8 TMA staging branch (this checkout): its fp8 and sm90 GPU test files, then
# bench/lab/gpu_abn.sh over base=.ab/base and this checkout on $CASES ($ROUNDS rounds, default 2), then the cycle probe
# of P4-e4m3 on this checkout (TMA staging). Logs under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-P4-e4m3,P5-e4m3,P6-e4m3,P4}
timeout 150 python3 -m pytest tests/gpu/test_fp8_gpu.py tests/gpu/test_prefill_sm90.py -q -p no:cacheprovider -rfE \
  -n 8 -o faulthandler_timeout=120 > "$OUT/tests_checkout.txt" 2>&1
echo "tests (checkout) exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_checkout.txt" | tail -8
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-300} bash bench/lab/gpu_abn.sh prefill "$CASES" ${ROUNDS:-2} base=.ab/base tma=. \
  > "$OUT/abn.txt" 2>&1
echo "A/B exit $? at $(at)"; grep -v "^round" "$OUT/abn.txt" | grep -v " fa2 " | tail -30
for d in /tmp/abn/*/; do n=$(basename "$d");
  for f in "$d"prefill-r*.json; do [ -f "$f" ] && cp "$f" "$OUT/${n}_$(basename "$f")"; done; done
timeout 100 python3 -m bench.lab.sm90_probe P4-e4m3 P4 > "$OUT/probe.txt" 2>&1
echo "probe exit $? at $(at)"; tail -12 "$OUT/probe.txt"
