#!/usr/bin/env bash
# Lab: one GPU call for decode kernel changes: this checkout (B) against .ab/base (A) on the fp8 decode cases and D6
# (bench/lab/gpu_ab.sh, 2 rounds), the decode variant bench (plain and in-kernel RoPE on D6) for A, B and .ab/r (R, a
# third tree) in alternating rounds, B's decode / fp8 / RoPE GPU tests, then the decode suite with FlashInfer 0.7.2
# (its modules compiled in the background meanwhile). Logs under $OUT.
export PYTHONUNBUFFERED=1; t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
( PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=6 CUINFER_CACHE_DIR=/tmp/cc-warm nice -n 19 \
    python3 -m bench warm --cases D6,D10,D5-e4m3,D9-e4m3 > "$OUT/fi_warm.txt" 2>&1; touch /tmp/fi.done ) &
AB_WORK=/tmp/ab bash bench/lab/gpu_ab.sh decode "D10,D5-e4m3,D9-e4m3,D6" 2 > "$OUT/ab.txt" 2>&1
echo "== A vs B (at $(at))"; cat /tmp/ab/compare.txt; cp /tmp/ab/compare.txt "$OUT/ab_compare.txt"
if [ -d .ab/r ]; then
  python3 -m pip install -q --target /tmp/site-r --no-build-isolation --no-deps .ab/r > "$OUT/install_r.log" 2>&1
  mkdir -p /tmp/run-r; ln -sfn "$(cd .ab/r && pwd)/bench" /tmp/run-r/bench
fi
vb() {  # side pythonpath round
  [ -d /tmp/run-$1 ] || return 0
  (cd /tmp/run-$1 && PYTHONPATH=$2 CUINFER_CACHE_DIR=/tmp/cc-$1 timeout 120 python3 -m bench.lab.variant_bench \
    --iters 30 --cases none > "$OUT/vb_$1_r$3.txt" 2>&1)
  echo "== variant_bench decode side $1 round $3 (at $(at))"; grep "decode D6" "$OUT/vb_$1_r$3.txt"
}
vb a /tmp/site-a 1; vb b "" 1; vb r /tmp/site-r 1; vb r /tmp/site-r 2; vb b "" 2; vb a /tmp/site-a 2
CUINFER_CACHE_DIR=/tmp/cc-suite timeout 200 python3 -m pytest tests/gpu/test_fp8_gpu.py tests/gpu/test_decode.py \
  tests/gpu/test_variants_gpu.py tests/gpu/test_variant_builtins_gpu.py -n 8 -q -p no:cacheprovider -rfE \
  > "$OUT/gpu_tests.txt" 2>&1
echo "tests exit $? (at $(at))"; grep -E "passed|failed|FAILED" "$OUT/gpu_tests.txt" | tail -8
wait
PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc-warm timeout $(( 580 - ($(date +%s) - t0) )) \
  python3 -m bench decode --cases D6,D10,D5-e4m3,D9-e4m3 --no-plot --out "$OUT/bench" > "$OUT/bench_decode.txt" 2>&1
echo "bench exit $? (at $(at))"; grep -vE "INFO" "$OUT/bench_decode.txt" | sed -n '/^case /,$p' | head -20
