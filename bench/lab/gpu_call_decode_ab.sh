#!/usr/bin/env bash
# Lab: one GPU call for a decode kernel change: same-run A/B of this checkout against .ab/base (ROUNDS rounds,
# bench/lab/gpu_abn.sh) on CASES (default the fp8 decode cases and D6), then the fp8 and decode GPU tests. Logs
# under $OUT.
. bench/lab/call_start.sh
AB_WORK=/tmp/abd bash bench/lab/gpu_abn.sh decode "${CASES:-D10,D5-e4m3,D9-e4m3,D6}" "${ROUNDS:-3}" base=.ab/base new=. \
  > "$OUT/abn.txt" 2>&1
grep -v cuda-cores /tmp/abd/compare_new.txt || tail -20 "$OUT/abn.txt"; cp /tmp/abd/compare_new.txt "$OUT/"
echo "ab done $(at)"
CUINFER_CACHE_DIR=/tmp/cc-tests timeout 200 python3 -m pytest ${TESTS:-tests/gpu/test_fp8_gpu.py tests/gpu/test_decode.py} \
  -n 8 -q -p no:cacheprovider -rfE > "$OUT/gpu_tests.txt" 2>&1; echo "tests exit $?"
grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | tail -8
echo "tests done $(at)"
