#!/usr/bin/env bash
# Lab: one GPU call that A/Bs the variant bench (P1-P3 causal / soft cap / ALiBi / window / RoPE, D6 RoPE) of this
# checkout (B) against the tree in $AB_BASE (A, e.g. `git archive` of the commit before), in alternating rounds;
# then profiles standard cases with Nsight Compute (ncu --set full, clocks left alone, one launch after three
# warm-ups; reports, details pages and per-SASS-line source counters) and runs GPU test files until the deadline.
# Meanwhile, in the background: FlashInfer parity groups (tests/gpu/test_compat_parity.py as a script) and, with
# FA2=1, FlashInfer's FA2 variant modules, B then running once more beside them if they are ready. Logs under $OUT.
#   env: AB_BASE (.ab/base), ROUNDS (2), ITERS (30), VB_ARGS (more variant_bench options, e.g. "--no-decode
#        --variants causal,alibi"), DEADLINE_S (570), TESTS (test files; none: no tests), TESTS_K (-k),
#        PROFILE (standard case ids for ncu, e.g. "D10 P4"), PARITY (option names, e.g. "alibi": its decode and
#        prefill parity cases), FA2 (1: FlashInfer FA2 beside B)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
left() { echo $(( ${DEADLINE_S:-570} - ($(date +%s) - t0) )); }
at() { echo "$(( $(date +%s) - t0 )) s"; }
AB_BASE=${AB_BASE:-.ab/base}
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install_b.log" 2>&1 || { tail "$OUT/install_b.log"; exit 1; }
python3 -m pip install -q --target /tmp/site-a --no-build-isolation --no-deps "$AB_BASE" > "$OUT/install_a.log" 2>&1 ||
  { tail "$OUT/install_a.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
export FLASHINFER_CUDA_ARCH_LIST=9.0a
mkdir -p /tmp/run-a /tmp/run-b; ln -sfn "$(cd "$AB_BASE" && pwd)/bench" /tmp/run-a/bench; ln -sfn "$PWD/bench" /tmp/run-b/bench
for o in ${PARITY:-}; do
  ( CUINFER_CACHE_DIR=/tmp/cc-parity MAX_JOBS=6 timeout $(( $(left) - 20 )) nice -n 10 python3 tests/gpu/test_compat_parity.py \
      --peers /tmp/peers --cases decode-tc0-$o,prefill_paged-causal-$o,prefill_ragged-causal-$o,decode-tc1-$o \
      > "$OUT/parity_$o.txt" 2>&1; echo "exit $? at $(at)" >> "$OUT/parity_$o.txt" ) &
done
if [ "${FA2:-0}" = 1 ]; then
  ( cd /tmp/run-b && PYTHONPATH=/tmp/peers MAX_JOBS=8 CUINFER_CACHE_DIR=/tmp/cc-fi \
      nice -n 19 python3 -m bench.lab.variant_bench --peers fa2 --iters 1 > "$OUT/fi_warm.txt" 2>&1; touch /tmp/fi.done ) &
fi
vb() {  # side round
  local pp=""; [ "$1" = a ] && pp=/tmp/site-a
  (cd /tmp/run-$1 && PYTHONPATH=$pp CUINFER_CACHE_DIR=/tmp/cc-$1 timeout 200 python3 -m bench.lab.variant_bench \
    --iters "${ITERS:-30}" ${VB_ARGS:-} > "$OUT/variant_$1_r$2.txt" 2>&1)
  echo "== variant_bench side $1 round $2 (at $(at))"; sed -n '/^case /,$p' "$OUT/variant_$1_r$2.txt"
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  if [ $((r % 2)) -eq 1 ]; then vb a $r; vb b $r; else vb b $r; vb a $r; fi
done
for c in ${PROFILE:-}; do
  case $c in D*) k=batch_decode;; *) k=batch_prefill;; esac
  OUT=$OUT bash bench/lab/ncu_one.sh "$c" "$k" "$c"; echo "  at $(at)"
done
if [ -n "${TESTS:-}" ]; then
  CUINFER_CACHE_DIR=/tmp/cc-suite timeout $(( $(left) - 40 )) python3 -m pytest $TESTS ${TESTS_K:+-k "$TESTS_K"} -n 8 -q -p no:cacheprovider -rfE \
    --ignore tests/gpu/test_compat_parity.py > "$OUT/gpu_tests.txt" 2>&1
  echo "tests exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.txt" | tail -20
fi
if [ "${FA2:-0}" = 1 ]; then
  if [ -f /tmp/fi.done ] && [ "$(left)" -gt 60 ]; then
    (cd /tmp/run-b && PYTHONPATH=/tmp/peers CUINFER_CACHE_DIR=/tmp/cc-b timeout $(( $(left) - 30 )) \
      python3 -m bench.lab.variant_bench --peers fa2 --iters "${ITERS:-30}" > "$OUT/variant_b_fa2.txt" 2>&1)
    echo "== variant_bench side b with FlashInfer FA2"; sed -n '/^case /,$p' "$OUT/variant_b_fa2.txt"
  else
    echo "FlashInfer FA2 modules not ready: $(tail -c 300 "$OUT/fi_warm.txt")"
  fi
fi
wait
for o in ${PARITY:-}; do echo "== parity $o"; grep -v "^ok\| ok " "$OUT/parity_$o.txt" | tail -15; done
