#!/usr/bin/env bash
# Lab: with bench/lab/sm90/fp8_kv.patch applied, which test stalled the GPU suite of 2026-12-03c call 7: each fp8
# prefill case on the Hopper kernel alone with a short timeout (pass / fail / timeout, GPU utilisation after each),
# then the 16-bit sm90 tests (-n 8; the patch also moves the producer's item walk to shared memory). Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=/tmp/cc
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
git apply bench/lab/sm90/fp8_kv.patch || { echo "patch does not apply"; exit 1; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
for id in sm90-paged-p1-e5m2 sm90-ragged-softcap-window sm90-paged-alibi-noncausal paged-spread-q-head-scales; do
  timeout ${CASE_S:-22} python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider -rfE -k "$id" >> "$OUT/fp8_cases.txt" 2>&1
  echo "$id exit $? at $(at): $(tail -1 "$OUT/fp8_cases.txt") / GPU $(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader)"
done
timeout 45 python3 -m pytest tests/gpu/test_prefill_sm90.py -q -p no:cacheprovider -rfE -n 8 > "$OUT/sm90_tests.txt" 2>&1
echo "sm90 16-bit tests exit $? at $(at)"; tail -2 "$OUT/sm90_tests.txt"
