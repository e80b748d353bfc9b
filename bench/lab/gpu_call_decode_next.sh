#!/usr/bin/env bash
# Lab: one GPU call for two decode branches at once, run from a checkout of their combination (branch pp-rt): the
# decode, fp8 and decode-variant GPU tests on the combined kernels, then a same-run A/B/N of four trees ($ROUNDS
# rotating rounds): base (.ab/base, main), pp (.ab/pp, branch pending-piece: carried split pieces), rt (.ab/rt, branch
# decode-req-table: the requests' page_indptr / kv_lens in shared memory at the prologue) and both (this checkout).
# Make the trees first (`bash bench/lab/ab_trees.sh base=main pp=pending-piece rt=decode-req-table`) and carry
# .ab/base, .ab/pp and .ab/rt. Logs under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-D10,D5-e4m3,D9-e4m3,D6,D2,D9}
CUINFER_CACHE_DIR=/tmp/cc-tests timeout ${TEST_TIMEOUT:-200} python3 -m pytest tests/gpu/test_decode.py \
  tests/gpu/test_fp8_gpu.py tests/gpu/test_variants_gpu.py tests/gpu/test_variant_builtins_gpu.py \
  -k "${TEST_K:-decode or Decode or fp8 or e4m3 or e5m2}" -n 8 -q -p no:cacheprovider -rfE > "$OUT/gpu_tests.txt" 2>&1
echo "tests exit $? $(at)"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | tail -12
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-330} bash bench/lab/gpu_abn.sh decode "$CASES" "${ROUNDS:-3}" base=.ab/base \
  pp=.ab/pp rt=.ab/rt both=. > "$OUT/abn.txt" 2>&1; echo "A/B exit $? $(at)"
cat /tmp/abn/compare*.txt 2>/dev/null || tail -20 "$OUT/abn.txt"; cp /tmp/abn/compare*.txt "$OUT/" 2>/dev/null
