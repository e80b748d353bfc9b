#!/usr/bin/env bash
# Lab GPU call (prepared 2026-12-05 (d), not yet run): the sm90 max-free soft cap with each row half's exp2s made to
# wait for its tanh (branch sm90-softcap-batch: `ms = fmaf(0, max of tanh, ms)`, the same results), so ptxas issues
# those tanh before the multiply-adds. Trees: base (main), a16 (be0b908: the last 16 key pairs' tanh, a serial max),
# a8 (af16be4: the last 8), tree (5b1fc6d: all 32, a tree of maxes). Make them first:
#   bash bench/lab/ab_trees.sh base=main a16=be0b908 a8=af16be4 tree=5b1fc6d
# and carry .ab/base .ab/a16 .ab/a8 .ab/tree. variant_bench causal and soft cap 30 on P1-P3, 2 rounds; logs under $OUT.
# First the MUFU chain latencies (mufu_probe --latency, ~10 s): the issue model of bench/lab/sass_ctrl.py needs them,
# and at latency 24 it predicts a16 / a8 / tree within +1 % of base (lab-findings.md, 2026-12-05 (e)); this call
# checks that prediction.
. bench/lab/call_start.sh
timeout 120 python3 -m bench.lab.mufu_probe --latency > "$OUT/mufu_latency.txt" 2>&1; echo "latency exit $? ($(at))"
cat "$OUT/mufu_latency.txt"
TREES="base=.ab/base a16=.ab/a16 a8=.ab/a8 tree=.ab/tree" VARS="causal,soft cap 30" TESTS="" ROUNDS=${ROUNDS:-2} \
  timeout ${AB_TIMEOUT:-400} bash bench/lab/gpu_call_variant_abn.sh > "$OUT/abn_anchor.txt" 2>&1
echo "abn exit $? ($(at))"; tail -25 "$OUT/abn_anchor.txt"
