#!/usr/bin/env bash
# The full GPU pass in one call: install, the GPU suite (parallel workers), then every bench suite beside the peers.
# Logs and results under $OUT (at most 8 files come back: keep the list short).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/bench"
python3 -m pip install --no-build-isolation --no-deps -e . > /dev/null 2>&1 || { echo "install failed"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl 2>/dev/null
export PYTHONPATH=/tmp/peers:${PYTHONPATH:-} FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 CUINFER_CACHE_DIR=/tmp/cc
export CUINFER_BENCH_FI_PREFILL=${CUINFER_BENCH_FI_PREFILL:-fa2}
# warm the kernel cache once (16 threads) so the parallel test workers do not all compile the same modules
python3 -m cuinfer warmup --jobs 16 > "$OUT/warmup.txt" 2>&1
{ python3 -m cuinfer info; python3 -m cuinfer demo; } > "$OUT/info_demo.txt" 2>&1
timeout 240 python3 -m pytest -m gpu tests/gpu -q -n 8 -p no:cacheprovider 2>&1 | tail -25 > "$OUT/gpu_tests.txt"
cat "$OUT/gpu_tests.txt" | tail -8
for suite in ${SUITES:-decode merge prefill plan}; do
  extra=""; [ "$suite" = plan ] && extra="--no-peers"
  python3 -m bench "$suite" --out "$OUT/bench" --no-plot $extra >> "$OUT/bench_all.txt" 2>&1
done
grep -E "^(case|D[0-9]|P[0-9]|M1|plan-)|^ {20,}[a-z]|rows:" "$OUT/bench_all.txt"
rm -f "$OUT"/bench/*-2026*.json
