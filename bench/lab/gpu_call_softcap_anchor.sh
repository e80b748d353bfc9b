#!/usr/bin/env bash
# Lab GPU call (prepared 2026-12-05 (d)-(e), not yet run), ~300 s:
# 1. the MUFU chain latencies (mufu_probe --latency, ~10 s), which the issue model of bench/lab/sass_ctrl.py needs;
# 2. variant_bench causal and soft cap 30 on P1-P3, 2 rounds, in five trees:
#    base (main); tree (5b1fc6d, branch sm90-softcap-batch: each row half's exp2s wait for the max of its tanh,
#    `ms = fmaf(0, max, ms)`, the same results, so ptxas issues those tanh first); nopp (branch sm90-nopp): the
#    consumers without turns, both softmaxes side by side, each over its own P V; clk (b6dec33, branch
#    sm90-softcap-clockfold): a clock read between the tanh and exp2 loops, which ptxas does not schedule across
#    (every tanh before the first multiply-add, as in the fast lab bound), its value kept by adding 0 times it to the
#    exp2s' reference (the same results; if it wins, a product version needs only its LAB names and a SASS test);
#    npclk (branch sm90-nopp-clk): both.
#    The issue model rates tree at +1 % or worse and clk at +5 % alone, ~0 with two warps (lab-findings.md,
#    2026-12-05 (e)): this checks it. nopp's softmaxes in lockstep lose least in the model; what the MMAs lose without
#    turns is not modelled.
# Make the trees first and carry .ab/base .ab/tree .ab/nopp .ab/clk .ab/npclk:
#   bash bench/lab/ab_trees.sh base=main tree=5b1fc6d nopp=sm90-nopp clk=b6dec33 npclk=sm90-nopp-clk
. bench/lab/call_start.sh
timeout 120 python3 -m bench.lab.mufu_probe --latency > "$OUT/mufu_latency.txt" 2>&1; echo "latency exit $? ($(at))"
cat "$OUT/mufu_latency.txt"
TREES="base=.ab/base tree=.ab/tree nopp=.ab/nopp clk=.ab/clk npclk=.ab/npclk" VARS="causal,soft cap 30" TESTS="" ROUNDS=${ROUNDS:-2} \
  timeout ${AB_TIMEOUT:-500} bash bench/lab/gpu_call_variant_abn.sh > "$OUT/abn_anchor.txt" 2>&1
echo "abn exit $? ($(at))"; tail -25 "$OUT/abn_anchor.txt"
