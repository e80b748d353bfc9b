#!/usr/bin/env bash
# Lab GPU call (prepared 2026-12-05 (d)-(e), not yet run), ~120 s:
# 1. the MUFU chain latencies (mufu_probe --latency, ~10 s), which the issue model of bench/lab/sass_ctrl.py needs;
# 2. variant_bench causal and soft cap 30 on P1-P3, 2 rounds, in four trees:
#    base (main); a16 (be0b908) and tree (5b1fc6d), branch sm90-softcap-batch: each row half's exp2s wait for its tanh
#    (`ms = fmaf(0, max of tanh, ms)`, the same results) so ptxas issues those tanh first; nopp (branch sm90-nopp):
#    the consumers without turns, both softmaxes side by side, each over its own P V.
#    The issue model rates a16 / tree at +1 % or worse (lab-findings.md, 2026-12-05 (e)): this checks it. nopp's
#    softmaxes in lockstep lose least in the model (offset 0); what the MMAs lose is not modelled.
# Make the trees first and carry .ab/base .ab/a16 .ab/tree .ab/nopp:
#   bash bench/lab/ab_trees.sh base=main a16=be0b908 tree=5b1fc6d nopp=sm90-nopp
. bench/lab/call_start.sh
timeout 120 python3 -m bench.lab.mufu_probe --latency > "$OUT/mufu_latency.txt" 2>&1; echo "latency exit $? ($(at))"
cat "$OUT/mufu_latency.txt"
TREES="base=.ab/base a16=.ab/a16 tree=.ab/tree nopp=.ab/nopp" VARS="causal,soft cap 30" TESTS="" ROUNDS=${ROUNDS:-2} \
  timeout ${AB_TIMEOUT:-450} bash bench/lab/gpu_call_variant_abn.sh > "$OUT/abn_anchor.txt" 2>&1
echo "abn exit $? ($(at))"; tail -25 "$OUT/abn_anchor.txt"
