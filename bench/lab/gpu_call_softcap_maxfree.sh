#!/usr/bin/env bash
# Lab GPU call: the scaled soft cap and the max-free sm90 softmax. The GPU tests that run a soft cap (every kernel),
# then the variant bench (P1-P3, sm90) of this checkout against .ab/head (git archive HEAD, PYTHONPATH=tree) in
# ROUNDS alternating rounds.
. bench/lab/call_start.sh
ROUNDS=${ROUNDS:-2}
VARS="causal,soft cap 30,soft cap 30 (accurate),alibi"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 330 python3 -m pytest -q -n 8 -p no:cacheprovider tests/gpu/test_prefill_sm90.py \
    tests/gpu/test_variant_builtins_gpu.py tests/gpu/test_variants_gpu.py \
    "tests/gpu/test_prefill.py" "tests/gpu/test_decode.py" "tests/gpu/test_fp8_gpu.py" -k "sm90 or soft or cap or builtin or variant" \
    > "$OUT/tests.txt" 2>&1
  echo "tests rc=$? $(tail -1 "$OUT/tests.txt") ($(at))"
fi
for m in kernel_src planner interop; do ln -sfn ../$m ".ab/head/cuinfer/$m"; done
(cd .ab/head && PYTHONPATH=. CUINFER_CACHE_DIR=/tmp/cc-head python3 -m bench.lab.variant_bench --variants "causal,soft cap 30" \
  --no-decode --backends sm90 --iters 1 --cases P3 > "$OUT/warm_head.txt" 2>&1) &
python3 -m bench.lab.variant_bench --variants "$VARS" --no-decode --backends sm90 --iters 1 --cases P3 > "$OUT/warm_new.txt" 2>&1
wait
echo "warm ($(at))"
for r in $(seq 1 "$ROUNDS"); do
  python3 -m bench.lab.variant_bench --variants "$VARS" --no-decode --backends sm90 ${PEERS:+--peers $PEERS} > "$OUT/new_r$r.txt" 2>&1
  (cd .ab/head && PYTHONPATH=. CUINFER_CACHE_DIR=/tmp/cc-head python3 -m bench.lab.variant_bench --variants "$VARS" \
    --no-decode --backends sm90 > "$OUT/head_r$r.txt" 2>&1)
  echo "round $r ($(at))"
done
for f in "$OUT"/new_r*.txt "$OUT"/head_r*.txt; do echo "== $f"; grep -E "^prefill" "$f"; done
