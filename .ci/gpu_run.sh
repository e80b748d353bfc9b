#!/usr/bin/env bash
# One GPU-machine session: install, info, demo, GPU tests, selected bench suites. Logs under $OUT.
# usage: bash .ci/gpu_run.sh "<pytest args>" "<bench suites, space separated>" ["<bench args>"]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
if [ -d .peers ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl
  export PYTHONPATH=/tmp/peers:${PYTHONPATH:-} FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
fi
export CUINFER_CACHE_DIR=/tmp/cuinfer-cache
{ python3 -m cuinfer info; python3 -m cuinfer demo; } 2>&1 | tee "$OUT/info_demo.txt"
if [ -n "${1:-}" ]; then
  timeout 420 python -m pytest $1 -q -rf -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
fi
for suite in ${2:-}; do
  python -m bench "$suite" --out "$OUT/bench" ${3:-} 2>&1 | tee "$OUT/bench_$suite.txt" | tail -40
done
