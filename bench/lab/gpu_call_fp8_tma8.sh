#!/usr/bin/env bash
# Lab: one GPU call comparing fp8 Hopper prefill producer builds: bench/lab/gpu_abn.sh over base=.ab/base and $TREES
# on $CASES ($ROUNDS rounds), then the fp8 GPU test file on this checkout and on each tree of $TEST_TREES (name=dir,
# run from the tree with its gpu_abn install on PYTHONPATH); $CHECKOUT_TESTS: more test files for this checkout. Logs
# under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-P4-e4m3,P5-e4m3,P6-e4m3,P4,P5,P6}
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-300} bash bench/lab/gpu_abn.sh prefill "$CASES" ${ROUNDS:-2} base=.ab/base $TREES \
  > "$OUT/abn.txt" 2>&1
echo "A/B exit $? at $(at)"; grep -v "^round" "$OUT/abn.txt" | grep -v " fa2 " | tail -40
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1
timeout 200 python3 -m pytest tests/gpu/test_fp8_gpu.py $CHECKOUT_TESTS -q -p no:cacheprovider -rfE -n 8 -o faulthandler_timeout=120 \
  > "$OUT/fp8_checkout.txt" 2>&1
echo "fp8 file (checkout) exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/fp8_checkout.txt" | tail -8
for t in ${TEST_TREES:-}; do
  name=${t%%=*}; dir=$(cd "${t#*=}" && pwd)
  # (from /tmp/run-<name>, the tree's tests appended to sys.path: `import cuinfer` is its install, kernel_src included)
  (cd "/tmp/run-$name" && PYTHONPATH=/tmp/site-$name python3 -c \
    "import cuinfer.jit.spec as s; print('kernel_src of $name:', s.kernel_src_dir())") 2>&1 | tail -1
  (cd "/tmp/run-$name" && PYTHONPATH=/tmp/site-$name CUINFER_CACHE_DIR=/tmp/cc-$name timeout 150 python3 -m pytest \
    "$dir/tests/gpu/test_fp8_gpu.py" --import-mode=append -q -p no:cacheprovider -rfE -n 8 \
    -o faulthandler_timeout=120) > "$OUT/fp8_$name.txt" 2>&1
  echo "fp8 file ($name) exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/fp8_$name.txt" | tail -8
done
