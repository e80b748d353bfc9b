#!/usr/bin/env bash
# Lab: one GPU call for a change to the fp8 Hopper prefill path: the fp8 test file (-n 8), then a same-machine A/B
# against .ab/base (the commit before; bench/lab/gpu_ab.sh) on $CASES, $ROUNDS rounds. Logs under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-P4-e4m3,P5-e4m3,P6-e4m3}
timeout 150 python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider -rfE -n 8 -o faulthandler_timeout=120 \
  > "$OUT/fp8_all.txt" 2>&1
rc=$?; echo "fp8 file exit $rc at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/fp8_all.txt" | tail -15
[ $rc -eq 124 ] && { echo "hang: stopping"; exit 1; }
AB_BASE=.ab/base AB_WORK=/tmp/ab timeout ${AB_TIMEOUT:-300} bash bench/lab/gpu_ab.sh prefill "$CASES" ${ROUNDS:-2} > "$OUT/ab.txt" 2>&1
echo "A/B exit $? at $(at)"; grep -v "^round" "$OUT/ab.txt" | tail -30
