#!/usr/bin/env bash
# Lab: one GPU call for issue 18's table: FlashInfer's decode modules compiled in the background, the fp8 and decode
# GPU tests, then the decode suite with FlashInfer on D6, D10, D5-e4m3, D9-e4m3, repeated while time is left (each
# run a full suite: its own inputs, plans and medians). Logs under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-D6,D10,D5-e4m3,D9-e4m3}
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
( PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=6 CUINFER_CACHE_DIR=/tmp/cc-warm nice -n 19 \
  python3 -m bench warm --cases "$CASES" > "$OUT/fi_warm.txt" 2>&1; touch /tmp/fi.done ) &
CUINFER_CACHE_DIR=/tmp/cc-tests timeout 220 python3 -m pytest tests/gpu/test_fp8_gpu.py tests/gpu/test_decode.py \
  -n 8 -q -p no:cacheprovider -rfE > "$OUT/gpu_tests.txt" 2>&1; echo "tests exit $? $(at)"
grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | tail -8
for i in $(seq 1 120); do [ -f /tmp/fi.done ] && break; sleep 2; done
[ -f /tmp/fi.done ] || { echo "FI not warm $(at)"; tail -3 "$OUT/fi_warm.txt"; exit 1; }
echo "FI warm $(at)"
for r in 1 2 3; do
  left=$(( ${BUDGET:-570} - ($(date +%s) - t0) )); [ "$left" -gt 100 ] || break
  PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc-warm timeout "$left" \
    python3 -m bench decode --cases "$CASES" --out "$OUT/bench_r$r" > "$OUT/bench_decode_r$r.txt" 2>&1
  echo "bench run $r exit $? $(at)"; grep -E "^(D6|D10|D5-e4m3|D9-e4m3) +[0-9]" "$OUT/bench_decode_r$r.txt" | head -8
done
