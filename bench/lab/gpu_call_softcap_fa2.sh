#!/usr/bin/env bash
# Lab GPU call: the soft cap on the FA2-class prefill kernel (backend="fa2", P1-P3) of this checkout beside .ab/head
# (the tree before), 2 alternating rounds.
. bench/lab/call_start.sh
for m in kernel_src planner interop; do ln -sfn ../$m ".ab/head/cuinfer/$m"; done
for r in 1 2; do
  python3 -m bench.lab.variant_bench --variants "causal,soft cap 30,soft cap 30 (accurate)" --no-decode \
    --backends fa2 > "$OUT/new_r$r.txt" 2>&1
  (cd .ab/head && PYTHONPATH=. CUINFER_CACHE_DIR=/tmp/cc-head python3 -m bench.lab.variant_bench \
    --variants "causal,soft cap 30" --no-decode --backends fa2 > "$OUT/head_r$r.txt" 2>&1)
  echo "round $r ($(at))"
done
for f in "$OUT"/new_r*.txt "$OUT"/head_r*.txt; do echo "== $f"; grep -E "^prefill" "$f"; done
