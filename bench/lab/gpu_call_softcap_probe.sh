#!/usr/bin/env bash
# Lab GPU call: where the Hopper consumers' cycles go with the soft cap against plain causal and ALiBi
# (bench.lab.sm90_probe --variants: the cycle probe build, thread 0 of each warpgroup; the softmax phase, the turn
# waits, the Q·K^T and P·V retire waits), then the same variants' TFLOP/s (variant_bench, sm90, 2 rounds) so the
# probe's shares sit beside the times of that machine. Logs under $OUT.
. bench/lab/call_start.sh
CUINFER_CACHE_DIR=/tmp/cc-probe timeout ${PROBE_TIMEOUT:-300} python3 -m bench.lab.sm90_probe ${CASES:-P1 P2 P3} \
  --variants causal "soft cap 30" alibi > "$OUT/sm90_probe.txt" 2>&1; echo "probe exit $? ($(at))"
cat "$OUT/sm90_probe.txt" | grep -v "^\s*$" | tail -40
for r in 1 2; do
  timeout 120 python3 -m bench.lab.variant_bench --variants "causal,soft cap 30,alibi" --no-decode --backends sm90 \
    > "$OUT/variants_r$r.txt" 2>&1
  echo "round $r ($(at))"; grep -E "^prefill" "$OUT/variants_r$r.txt"
done
