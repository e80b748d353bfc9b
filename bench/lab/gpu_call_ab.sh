#!/usr/bin/env bash
# Lab: one GPU call that A/Bs this checkout (B) against the tree in $AB_BASE (A, e.g. `git archive main`) on the fp8
# and variant benches, then runs this checkout's GPU suite until the call's deadline. FlashInfer's decode modules
# compile in the background (bench/lab/gpu_fi_warm.sh-style, setsid) for a following call. Logs under $OUT.
#   env: DEADLINE_S (default 560: seconds after start by which the suite must end), ROUNDS (2), SKIP_AB=1, SKIP_SUITE=1
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
left() { echo $(( ${DEADLINE_S:-560} - ($(date +%s) - t0) )); }
if [ ! -d /tmp/fiwarm ]; then
  mkdir -p /tmp/fiwarm
  setsid bash -c '[ -d /tmp/peers/flashinfer ] || python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl
    PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=4 CUINFER_CACHE_DIR=/tmp/cc-warm \
      nice -n 19 python3 -m bench warm --cases D6,D10 > /tmp/fiwarm/bench_decode.log 2>&1; touch /tmp/fiwarm/all.done' \
    < /dev/null > /dev/null 2>&1 &
fi
if [ -z "${SKIP_AB:-}" ]; then
  AB_WORK=/tmp/ab bash bench/lab/gpu_ab.sh "decode prefill" "D6,D10,D5-e4m3,D9-e4m3,P4,P5,P6,P4-e4m3,P5-e4m3,P6-e4m3" \
    "${ROUNDS:-2}" > "$OUT/ab.txt" 2>&1
  cat /tmp/ab/compare.txt
  for side in a b; do
    pp=""; [ $side = a ] && pp=/tmp/site-a
    (cd /tmp/run-$side && PYTHONPATH=$pp CUINFER_CACHE_DIR=/tmp/cc-$side timeout 150 python3 -m bench.lab.variant_bench \
      --iters 30 > "$OUT/variant_$side.txt" 2>&1)
    echo "== variant_bench side $side"; sed -n '/^case /,$p' "$OUT/variant_$side.txt"
  done
fi
echo "A/B done at $(( $(date +%s) - t0 )) s"
if [ -z "${SKIP_SUITE:-}" ]; then
  CUINFER_CACHE_DIR=/tmp/cc-suite timeout $(left) python3 -m pytest tests/gpu -n 8 -q -p no:cacheprovider -rfE \
    --ignore tests/gpu/test_compat_parity.py ${SUITE_ARGS:-} > "$OUT/gpu_suite.txt" 2>&1
  echo "suite exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|error" "$OUT/gpu_suite.txt" | tail -30
fi
ls /tmp/fiwarm; tail -n 3 /tmp/fiwarm/*.log 2>/dev/null | cut -c1-200
