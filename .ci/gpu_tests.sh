#!/usr/bin/env bash
# GPU test pass with diagnostics: the suites, then compute-sanitizer on any canary that fails. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
export CUINFER_CACHE_DIR=/tmp/cuinfer-cache
timeout 480 python3 -m pytest -m gpu ${1:-tests/gpu} -q -rf -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt" | grep -v "^E  \|^  " | tail -60
for t in ${2:-}; do
  if ! python3 "tests/gpu/$t" > "$OUT/canary_$t.txt" 2>&1; then
    echo "== $t canary failed; compute-sanitizer:"
    timeout 120 compute-sanitizer --tool memcheck --show-backtrace device python3 "tests/gpu/$t" 2>&1 | grep -v "^=========     Host Frame" | head -60 | tee "$OUT/sanitizer_$t.txt"
  fi
done
