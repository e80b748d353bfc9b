#!/usr/bin/env bash
# Lab: one GPU call for the fp8 decode trims: same-run A/B of this checkout (B) against .ab/base (the tree before) and
# .ab/c (a tree in between), 2 rounds each (bench/lab/gpu_ab.sh), the fp8 / decode GPU tests, then the decode suite
# with FlashInfer 0.7.2 (its modules compiled in the background meanwhile) if they are ready. Logs under $OUT.
export PYTHONUNBUFFERED=1; t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
( PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=6 CUINFER_CACHE_DIR=/tmp/cc-warm nice -n 19 python3 -m bench warm --cases D6,D10,D5-e4m3,D9-e4m3 > $OUT/fi_warm.txt 2>&1; touch /tmp/fi.done ) &
AB_BASE=.ab/base AB_WORK=/tmp/ab1 bash bench/lab/gpu_ab.sh decode "D10,D5-e4m3,D9-e4m3,D6" 2 > $OUT/ab1.txt 2>&1; echo "== base vs B"; cat /tmp/ab1/compare.txt
AB_BASE=.ab/c AB_WORK=/tmp/ab2 bash bench/lab/gpu_ab.sh decode "D10,D5-e4m3,D9-e4m3" 2 > $OUT/ab2.txt 2>&1; echo "== commit3 vs B"; cat /tmp/ab2/compare.txt
echo "ab done $(( $(date +%s) - t0 )) s"
CUINFER_CACHE_DIR=/tmp/cc-suite timeout 170 python3 -m pytest tests/gpu/test_fp8_gpu.py tests/gpu/test_decode.py -n 8 -q -p no:cacheprovider -rfE > $OUT/gpu_tests.txt 2>&1; echo "tests exit $?"; grep -E "passed|failed|FAILED" $OUT/gpu_tests.txt | tail -8
echo "tests done $(( $(date +%s) - t0 )) s"
if [ -f /tmp/fi.done ]; then PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc-warm timeout $(( 560 - ($(date +%s) - t0) )) python3 -m bench decode --cases D6,D10,D5-e4m3,D9-e4m3 --no-plot --out $OUT/bench > $OUT/bench_decode.txt 2>&1; grep -E "^\s+D|TB/s|µs" $OUT/bench_decode.txt | head -40; else echo "FI not warm"; tail -3 $OUT/fi_warm.txt; fi
cp /tmp/ab1/compare.txt $OUT/ab1_compare.txt; cp /tmp/ab2/compare.txt $OUT/ab2_compare.txt
