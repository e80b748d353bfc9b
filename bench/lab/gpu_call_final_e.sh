#!/usr/bin/env bash
# Lab: the closing GPU call of 2026-12-03e on this checkout: the GPU suite (compat parity aside), the RoPE-decode A/B
# (3 rounds) and the decode suite's A/B (2 rounds) against .ab/base (the tree before; carry .ab), then the examples
# in torch, JAX and CuPy. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
CUINFER_CACHE_DIR=/tmp/cc-suite timeout 200 python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py -q \
  -p no:cacheprovider -rfE -n 12 -o faulthandler_timeout=200 > "$OUT/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite.txt" | tail -12
python3 -m pip install -q --target /tmp/site-a --no-build-isolation --no-deps .ab/base > /tmp/install_a.log 2>&1 ||
  { tail /tmp/install_a.log; exit 1; }
ROUNDS=3 timeout 80 bash bench/lab/variant_ab_decode.sh; echo "RoPE A/B at $(at)"
AB_BASE=.ab/base AB_WORK=/tmp/ab timeout 200 bash bench/lab/gpu_ab.sh decode "D1,D2,D3,D4,D5,D6,D7,D8,D9,D10,D5-e4m3" 2 \
  > "$OUT/ab_decode.txt" 2>&1
echo "decode A/B exit $? at $(at)"; grep -v "^round" "$OUT/ab_decode.txt" | tail -40
{ for ex in examples/fp8_kv_cache.py examples/prefill_sm90.py; do
    for fw in torch jax cupy; do
      echo "== $ex --framework $fw"; CUINFER_CACHE_DIR=/tmp/cc-suite timeout 90 python3 "$ex" --framework $fw 2>&1 | tail -4
      echo "exit ${PIPESTATUS[0]}"
    done
  done
  echo "== examples/compat_flashinfer.py (torch)"; CUINFER_CACHE_DIR=/tmp/cc-suite timeout 90 python3 examples/compat_flashinfer.py 2>&1 | tail -6
  echo "exit ${PIPESTATUS[0]}"; } > "$OUT/examples.txt" 2>&1; echo "examples at $(at)"; cat "$OUT/examples.txt"
