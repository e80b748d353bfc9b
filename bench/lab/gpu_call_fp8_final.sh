#!/usr/bin/env bash
# Lab: one GPU call for fp8 Hopper prefill builds, most needed first: the GPU test files on this checkout (fp8 and
# $CHECKOUT_TESTS), then bench/lab/gpu_abn.sh over base=.ab/base and $TREES on $CASES ($ROUNDS rounds, default 1),
# then the fp8 test file of each tree in $TEST_TREES (name=dir, run with its gpu_abn install). Logs under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-P4-e4m3,P5-e4m3,P6-e4m3,P4,P5,P6}
timeout 150 python3 -m pytest tests/gpu/test_fp8_gpu.py $CHECKOUT_TESTS -q -p no:cacheprovider -rfE -n 8 \
  -o faulthandler_timeout=120 > "$OUT/tests_checkout.txt" 2>&1
echo "tests (checkout) exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/tests_checkout.txt" | tail -8
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-150} bash bench/lab/gpu_abn.sh prefill "$CASES" ${ROUNDS:-1} base=.ab/base $TREES \
  > "$OUT/abn.txt" 2>&1
echo "A/B exit $? at $(at)"; grep -v "^round" "$OUT/abn.txt" | grep -v " fa2 " | tail -40
for d in /tmp/abn/*/; do n=$(basename "$d");
  for f in "$d"prefill-r*.json; do [ -f "$f" ] && cp "$f" "$OUT/${n}_$(basename "$f")"; done; done
for t in ${TEST_TREES:-}; do
  name=${t%%=*}; dir=$(cd "${t#*=}" && pwd)
  (cd "/tmp/run-$name" && PYTHONPATH=/tmp/site-$name python3 -c \
    "import cuinfer.jit.spec as s; print('kernel_src of $name:', s.kernel_src_dir())") 2>&1 | tail -1
  (cd "/tmp/run-$name" && PYTHONPATH=/tmp/site-$name CUINFER_CACHE_DIR=/tmp/cc-$name timeout 100 python3 -m pytest \
    "$dir/tests/gpu/test_fp8_gpu.py" --import-mode=append -q -p no:cacheprovider -rfE -n 8 \
    -o faulthandler_timeout=90) > "$OUT/fp8_$name.txt" 2>&1
  echo "fp8 file ($name) exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/fp8_$name.txt" | tail -8
done
