#!/usr/bin/env bash
# Lab: one GPU call of probes after the Hopper kernel became "auto"'s choice: the row-order probe (bench.lab.order_probe,
# P3 and P6), the soft cap on the sm90 kernel beside plain causal and a probe of one MUFU op per logit
# (bench.lab.variant_bench --lab, P1-P3), and examples/prefill_sm90.py in torch, JAX and CuPy. Logs under $OUT.
. bench/lab/call_start.sh
timeout 200 python3 -m bench.lab.order_probe --cases P3,P6 --rounds 4 > "$OUT/order_probe.txt" 2>&1
echo "order probe exit $? at $(at)"; grep median "$OUT/order_probe.txt"
timeout 200 python3 -m bench.lab.variant_bench --lab --no-decode --backends sm90 --cases P1,P2,P3 \
  --variants "causal,soft cap 30,soft cap 30 (tanh.approx),one MUFU per logit (probe)" > "$OUT/softcap_probe.txt" 2>&1
echo "soft cap probe exit $? at $(at)"; sed -n '/^case/,$p' "$OUT/softcap_probe.txt"
for fw in torch jax cupy; do
  timeout 60 python3 examples/prefill_sm90.py --framework $fw 2>&1 | tail -3
done > "$OUT/examples.txt"; echo "examples at $(at)"; cat "$OUT/examples.txt"
