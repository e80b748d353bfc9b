#!/usr/bin/env bash
# Lab: one GPU call for backend="auto" on Hopper (the sm90 kernel where it fits) and the paged sm90 kernel: install,
# the sm90 GPU tests (ragged and paged), the auto crossover (bench.lab.sm90_auto_crossover), then the whole GPU suite
# (every prefill test under "auto" now runs the Hopper kernel where it fits). Logs under $OUT.
#   env: DEADLINE_S (585), SUITE (the test paths: tests/gpu), SUITE_ARGS (extra pytest arguments), SKIP_CROSSOVER=1
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=/tmp/cc
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - t0) )); }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
timeout 150 python3 -m pytest tests/gpu/test_prefill_sm90.py -q -p no:cacheprovider -rfE -n 8 > "$OUT/sm90_tests.txt" 2>&1
echo "sm90 tests exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/sm90_tests.txt" | tail -25
if [ "${SKIP_CROSSOVER:-0}" != 1 ]; then
  timeout 90 python3 -m bench.lab.sm90_auto_crossover > "$OUT/crossover.txt" 2>&1
  echo "crossover exit $? at $(at)"; cat "$OUT/crossover.txt" | tail -12
fi
timeout $(left) python3 -m pytest ${SUITE:-tests/gpu} --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 \
  ${SUITE_ARGS:-} > "$OUT/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite.txt" | tail -40
