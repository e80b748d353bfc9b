#!/usr/bin/env bash
# Lab GPU call: MUFU throughput (bench.lab.mufu_probe), then the soft cap's forms on the Hopper kernel
# (variant_bench --lab, P1-P3, 2 rounds): the built-in (MUFU tanh, scaled), the tanh from MUFU ex2 with a Newton or a
# MUFU reciprocal (scaled), the unscaled tanh.approx, and causal.
. bench/lab/call_start.sh
[ "${MUFU:-1}" = 1 ] && python3 -m bench.lab.mufu_probe 2>&1 | tail -5
VARS="causal,soft cap 30,soft cap 30 (ex2 + Newton),soft cap 30 (ex2 + rcp),soft cap 30 (tanh.approx unscaled)"
for r in 1 2; do
  python3 -m bench.lab.variant_bench --lab --variants "$VARS" --no-decode --backends sm90 > "$OUT/forms_r$r.txt" 2>&1
  echo "round $r ($(at))"; grep -E "^prefill" "$OUT/forms_r$r.txt"
done
