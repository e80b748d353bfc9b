#!/usr/bin/env bash
# Lab GPU call: the closing tables of a landing in one call. In the background (niced): FlashInfer's decode modules for
# the decode cases and its fa3 prefill modules for the variants; meanwhile every GPU test file (-n 10); then the decode
# suite with FlashInfer (D6, D10, D5-e4m3, D9-e4m3) and the variant bench with FlashInfer fa3 (sm90, P1-P3), each
# while time is left (BUDGET seconds from the start, default 575). Logs under $OUT. Carry .peers.
. bench/lab/call_start.sh
CASES=${CASES:-D6,D10,D5-e4m3,D9-e4m3}; VARS=${VARS:-causal,soft cap 30,alibi}
left() { echo $(( ${BUDGET:-575} - ($(date +%s) - t0) )); }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
export FLASHINFER_CUDA_ARCH_LIST=9.0a
( PYTHONPATH=/tmp/peers MAX_JOBS=4 CUINFER_CACHE_DIR=/tmp/cc-warm nice -n 19 python3 -m bench warm --cases "$CASES" \
  > /tmp/fi_warm_decode.txt 2>&1; touch /tmp/fi_decode.done ) &
IFS=, read -ra vs <<< "$VARS"
for v in "${vs[@]}"; do
  ( PYTHONPATH=/tmp/peers MAX_JOBS=4 CUINFER_CACHE_DIR=/tmp/cc-warm nice -n 19 timeout 450 python3 -m \
    bench.lab.variant_bench --peers fa3 --backends "" --variants "$v" --iters 1 --cases P3 --no-decode \
    > "/tmp/fi_warm_fa3_${v// /_}.txt" 2>&1 ) &
done
CUINFER_CACHE_DIR=/tmp/cc-tests timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/gpu -n 10 -q -p no:cacheprovider \
  -rfE > "$OUT/gpu_tests.txt" 2>&1; echo "tests exit $? ($(at))"
grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | tail -10
for i in $(seq 1 150); do [ -f /tmp/fi_decode.done ] && break; sleep 2; done
echo "FI decode warm: $([ -f /tmp/fi_decode.done ] && echo yes || echo no) ($(at))"
if [ "$(left)" -gt 110 ]; then
  PYTHONPATH=/tmp/peers CUINFER_CACHE_DIR=/tmp/cc-warm timeout $(( $(left) - 60 )) python3 -m bench decode \
    --cases "$CASES" --out /tmp/bench --no-plot > "$OUT/bench_decode.txt" 2>&1
  echo "decode suite exit $? ($(at))"; grep -E "^(D6|D10|D5-e4m3|D9-e4m3) +[0-9]" "$OUT/bench_decode.txt" | head -8
fi
cp /tmp/bench/decode-latest.json "$OUT/" 2>/dev/null; tail -2 /tmp/fi_warm_decode.txt
wait; echo "fa3 warm ($(at))"; grep -h flashinfer /tmp/fi_warm_fa3_*.txt | head -3
if [ "$(left)" -gt 50 ]; then
  PYTHONPATH=/tmp/peers CUINFER_CACHE_DIR=/tmp/cc-warm timeout $(( $(left) - 5 )) python3 -m bench.lab.variant_bench \
    --variants "$VARS" --no-decode --backends sm90 --peers fa3 > "$OUT/variants.txt" 2>&1
  echo "variant bench exit $? ($(at))"; grep -E "^\('prefill" "$OUT/variants.txt"
fi
