#!/usr/bin/env bash
# Lab: one GPU-machine call for the variants and utilities issues. Install, the GPU suite (parallel workers; the
# FlashInfer parity module is left to its own call: ~20 FlashInfer JIT modules), FlashInfer's variant modules compiled
# in the background meanwhile, then the variant bench (P1-P3, D6) beside FlashInfer FA2 and the utilities bench.
# Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install --no-build-isolation --no-deps -e . > /dev/null 2>&1 || { echo "install failed"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl 2>/dev/null
export PYTHONPATH=/tmp/peers:${PYTHONPATH:-} FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=12 CUINFER_CACHE_DIR=/tmp/cc
# FlashInfer's FA2 variant modules compile on the CPU while the suite runs (one iteration each, timings discarded)
python3 -m bench.lab.variant_bench --peers fa2 --iters 1 --cases P1 > "$OUT/fi_warm.txt" 2>&1 &
warm=$!
python3 -m cuinfer warmup --jobs 4 > "$OUT/warmup.txt" 2>&1
{ python3 -m cuinfer info; python3 -m cuinfer demo; } > "$OUT/info_demo.txt" 2>&1
timeout ${TEST_S:-300} python3 -m pytest -m gpu tests/gpu -q -n 8 -p no:cacheprovider --ignore=tests/gpu/test_compat_parity.py \
  -rf 2>&1 | grep -v "^E  \|^  " | tail -60 > "$OUT/gpu_tests.txt"
tail -5 "$OUT/gpu_tests.txt"
wait $warm; tail -3 "$OUT/fi_warm.txt"
python3 -m bench.lab.variant_bench --peers fa2 --iters 30 > "$OUT/variant_bench.txt" 2>&1
sed -n '/^case /,$p' "$OUT/variant_bench.txt"
python3 tests/gpu/bench_utilities.py > "$OUT/bench_utilities.txt" 2>&1; tail -25 "$OUT/bench_utilities.txt"
