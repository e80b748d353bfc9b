#!/usr/bin/env bash
# Lab: one GPU call that A/Bs the variant bench (P1-P3 causal / soft cap / ALiBi / window / RoPE, D6 RoPE) of this
# checkout (B) against the tree in $AB_BASE (A, e.g. `git archive` of the commit before), in alternating rounds, then
# runs the GPU test files in $TESTS until the deadline; FlashInfer's FA2 variant modules compile in the background
# meanwhile (niced) and, when they are done in time, B runs once more beside FlashInfer FA2. Logs under $OUT.
#   env: AB_BASE (.ab/base), ROUNDS (2), DEADLINE_S (570), TESTS (test files under tests/gpu), ITERS (30)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
left() { echo $(( ${DEADLINE_S:-570} - ($(date +%s) - t0) )); }
AB_BASE=${AB_BASE:-.ab/base}
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install_b.log" 2>&1 || { tail "$OUT/install_b.log"; exit 1; }
python3 -m pip install -q --target /tmp/site-a --no-build-isolation --no-deps "$AB_BASE" > "$OUT/install_a.log" 2>&1 ||
  { tail "$OUT/install_a.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
mkdir -p /tmp/run-a /tmp/run-b; ln -sfn "$(cd "$AB_BASE" && pwd)/bench" /tmp/run-a/bench; ln -sfn "$PWD/bench" /tmp/run-b/bench
( cd /tmp/run-b && PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=8 CUINFER_CACHE_DIR=/tmp/cc-fi \
    nice -n 19 python3 -m bench.lab.variant_bench --peers fa2 --iters 1 > "$OUT/fi_warm.txt" 2>&1; touch /tmp/fi.done ) &
vb() {  # side round
  local pp=""; [ "$1" = a ] && pp=/tmp/site-a
  (cd /tmp/run-$1 && PYTHONPATH=$pp CUINFER_CACHE_DIR=/tmp/cc-$1 timeout 200 python3 -m bench.lab.variant_bench \
    --iters "${ITERS:-30}" > "$OUT/variant_$1_r$2.txt" 2>&1)
  echo "== variant_bench side $1 round $2 (at $(( $(date +%s) - t0 )) s)"; sed -n '/^case /,$p' "$OUT/variant_$1_r$2.txt"
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  if [ $((r % 2)) -eq 1 ]; then vb a $r; vb b $r; else vb b $r; vb a $r; fi
done
CUINFER_CACHE_DIR=/tmp/cc-suite timeout $(( $(left) - 70 )) python3 -m pytest ${TESTS:-tests/gpu} -n 8 -q -p no:cacheprovider \
  -rfE --ignore tests/gpu/test_compat_parity.py > "$OUT/gpu_tests.txt" 2>&1
echo "tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|error|FAILED|ERROR" "$OUT/gpu_tests.txt" | tail -30
if [ -f /tmp/fi.done ] && [ "$(left)" -gt 60 ]; then
  (cd /tmp/run-b && PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc-b timeout $(( $(left) - 5 )) \
    python3 -m bench.lab.variant_bench --peers fa2 --iters "${ITERS:-30}" > "$OUT/variant_b_fa2.txt" 2>&1)
  echo "== variant_bench side b with FlashInfer FA2"; sed -n '/^case /,$p' "$OUT/variant_b_fa2.txt"
else
  echo "FlashInfer FA2 modules not ready: $(tail -c 300 "$OUT/fi_warm.txt")"
fi
