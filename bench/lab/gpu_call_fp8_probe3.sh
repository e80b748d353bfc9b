#!/usr/bin/env bash
# Lab: one GPU call for an fp8 Hopper prefill producer variant (this checkout): the fp8 test file (-n 8), then
# bench/lab/gpu_abn.sh over base=.ab/base and $TREES on $CASES ($ROUNDS rounds), then bench.lab.sm90_probe P4-e4m3 on
# this checkout. Logs under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-P4-e4m3,P5-e4m3,P6-e4m3,P4}
timeout 150 python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider -rfE -n 8 -o faulthandler_timeout=120 \
  > "$OUT/fp8_all.txt" 2>&1
rc=$?; echo "fp8 file exit $rc at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/fp8_all.txt" | tail -15
[ $rc -eq 124 ] && { echo "hang: stopping"; exit 1; }
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-300} bash bench/lab/gpu_abn.sh prefill "$CASES" ${ROUNDS:-2} base=.ab/base $TREES \
  > "$OUT/abn.txt" 2>&1
echo "A/B exit $? at $(at)"; grep -v "^round" "$OUT/abn.txt" | grep -v " fa2 " | tail -30
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1
timeout 120 python3 -m bench.lab.sm90_probe P4-e4m3 > "$OUT/probe.txt" 2>&1
echo "probe at $(at)"; tail -8 "$OUT/probe.txt"
