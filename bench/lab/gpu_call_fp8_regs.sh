#!/usr/bin/env bash
# Lab: one GPU call for fp8 Hopper prefill producer variants: the fp8 test file on this checkout (-n 8), then
# bench/lab/gpu_abn.sh over base=.ab/base and the trees in $TREES (name=dir ...; "." is this checkout) on $CASES,
# $ROUNDS rounds. Logs under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-P4-e4m3,P5-e4m3,P6-e4m3,P4}
timeout 150 python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider -rfE -n 8 -o faulthandler_timeout=120 \
  > "$OUT/fp8_all.txt" 2>&1
rc=$?; echo "fp8 file exit $rc at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/fp8_all.txt" | tail -15
[ $rc -eq 124 ] && { echo "hang: stopping"; exit 1; }
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-360} bash bench/lab/gpu_abn.sh prefill "$CASES" ${ROUNDS:-2} base=.ab/base $TREES \
  > "$OUT/abn.txt" 2>&1
echo "A/B exit $? at $(at)"; cat "$OUT/abn.txt" | tail -40
