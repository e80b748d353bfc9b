#!/usr/bin/env bash
# Lab: one GPU call for bench/lab/sm90/fp8_tma_staging.patch (fp8 K / V staged by TMA on the Hopper kernel). Before the
# call, on the CPU machine: `rm -rf .ab && mkdir -p .ab/base && git archive HEAD | tar -x -C .ab/base` (the tree
# without the patch) and carry .ab. Here: the cycle probe and its bound probes on the tree as it is, then apply the
# patch: the fp8 GPU tests (a hang stops the call), the cycle probe,
# a same-run A/B on the fp8 prefill cases, the GPU suite. Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=/tmp/cc
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
# the tree without the patch: the cycle probe and its two bound probes (no conversions; no staging copies)
for d in "" -DCUINFER_SM90_PROBE_NO_CONVERT -DCUINFER_SM90_PROBE_NO_STAGE; do
  echo "== probe ${d:-(as shipped)}"; timeout 100 python3 -m bench.lab.sm90_probe P4-e4m3 P6-e4m3 ${d:+--defines $d} 2>&1
done > "$OUT/probe_bounds.txt"; grep -E "^==|producer:|consumer 0:" "$OUT/probe_bounds.txt" | cut -c1-160
git apply bench/lab/sm90/fp8_tma_staging.patch || { echo "patch does not apply"; exit 1; }
timeout 150 python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider -rfE -n 8 -o faulthandler_timeout=120 \
  > "$OUT/fp8_all.txt" 2>&1
rc=$?; echo "fp8 file exit $rc at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/fp8_all.txt" | tail -15
[ $rc -eq 124 ] && { echo "hang: stopping"; exit 1; }
timeout 120 python3 -m bench.lab.sm90_probe P4-e4m3 P6-e4m3 > "$OUT/probe.txt" 2>&1; cat "$OUT/probe.txt"
AB_BASE=.ab/base AB_WORK=/tmp/ab timeout 200 bash bench/lab/gpu_ab.sh prefill "P4-e4m3,P5-e4m3,P6-e4m3" 2 > "$OUT/ab.txt" 2>&1
echo "A/B exit $? at $(at)"; grep -v "^round" "$OUT/ab.txt" | tail -12
timeout 200 python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 \
  -o faulthandler_timeout=150 > "$OUT/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite.txt" | tail -12
