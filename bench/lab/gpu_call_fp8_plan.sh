#!/usr/bin/env bash
# Lab: one GPU call for the fp8 decode plans (FP8_COST's lane cut): FlashInfer's decode modules compiled in the
# background, a same-run A/B of this checkout against .ab/base on D10, D5-e4m3, D9-e4m3 and D6 (ROUNDS rounds,
# bench/lab/gpu_abn.sh), the fp8 and decode GPU tests, then the decode suite with FlashInfer. Logs under $OUT.
. bench/lab/call_start.sh
ROUNDS=${ROUNDS:-3}
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
( PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=6 CUINFER_CACHE_DIR=/tmp/cc-warm nice -n 19 \
  python3 -m bench warm --cases D6,D10,D5-e4m3,D9-e4m3 > "$OUT/fi_warm.txt" 2>&1; touch /tmp/fi.done ) &
AB_WORK=/tmp/abn bash bench/lab/gpu_abn.sh decode "D10,D5-e4m3,D9-e4m3,D6" "$ROUNDS" base=.ab/base new=. > "$OUT/abn.txt" 2>&1
cat /tmp/abn/compare*.txt 2>/dev/null | grep -v cuda-cores || tail -20 "$OUT/abn.txt"; cp /tmp/abn/compare*.txt "$OUT/" 2>/dev/null
echo "ab done $(at)"
CUINFER_CACHE_DIR=/tmp/cc-tests timeout 200 python3 -m pytest tests/gpu/test_fp8_gpu.py tests/gpu/test_decode.py \
  -n 8 -q -p no:cacheprovider -rfE > "$OUT/gpu_tests.txt" 2>&1; echo "tests exit $?"
grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | tail -8
echo "tests done $(at)"
for i in $(seq 1 60); do [ -f /tmp/fi.done ] && break; sleep 2; done
if [ -f /tmp/fi.done ]; then
  PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc-warm timeout $(( 570 - ($(date +%s) - t0) )) \
    python3 -m bench decode --cases D6,D10,D5-e4m3,D9-e4m3 --out "$OUT/bench" > "$OUT/bench_decode.txt" 2>&1
  echo "bench exit $? $(at)"; grep -E "^\| D|D10|e4m3|D6" "$OUT/bench_decode.txt" | head -30
else echo "FI not warm $(at)"; tail -3 "$OUT/fi_warm.txt"; fi
