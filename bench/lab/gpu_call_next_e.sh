#!/usr/bin/env bash
# Lab GPU call (prepared 2026-12-05 (e)): the prepared experiments in one machine start, ~600 s: split it (ROUNDS=1, or one script a call) if the call limit is 600 s (the ncu run last:
# the others' logs are written by then).
#   bash bench/lab/ab_trees.sh base=main tree=5b1fc6d nopp=sm90-nopp clk=b5f0a00 npclk=sm90-nopp-clk nofin=lab-fp8-nofinish noq=lab-fp8-noq
# then run with carry .ab/base .ab/tree .ab/nopp .ab/clk .ab/npclk .ab/nofin .ab/noq (~30 MB). Logs under $OUT.
. bench/lab/call_start.sh
bash bench/lab/gpu_call_softcap_anchor.sh
bash bench/lab/gpu_call_fp8_item_bounds.sh
bash bench/lab/gpu_call_softcap_ncu_sass.sh
echo "done ($(at))"
