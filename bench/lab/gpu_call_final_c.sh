#!/usr/bin/env bash
# Lab: the closing GPU call of 2026-12-03c on the committed tree: the GPU suite (pytest -n 12, compat parity aside,
# tests/conftest.py limiting BLAS threads per worker), then bench.lab.order_probe on P3 and P6. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=/tmp/cc
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
git log --oneline -1 > "$OUT/commit.txt" 2>&1
timeout 240 python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 \
  --durations=10 > "$OUT/gpu_suite_final.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite_final.txt" | tail -20
timeout 200 python3 -m bench.lab.order_probe --cases P3,P6 --rounds 4 > "$OUT/order_probe.txt" 2>&1
echo "order probe exit $? at $(at)"; cat "$OUT/order_probe.txt" | tail -12
