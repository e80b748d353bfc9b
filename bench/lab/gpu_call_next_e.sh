#!/usr/bin/env bash
# Lab GPU call (prepared 2026-12-05 (e)): the two prepared experiments in one machine start, ~300 s.
#   bash bench/lab/ab_trees.sh base=main a16=be0b908 tree=5b1fc6d nopp=sm90-nopp nofin=lab-fp8-nofinish noq=lab-fp8-noq
# then run with carry .ab/base .ab/a16 .ab/tree .ab/nopp .ab/nofin .ab/noq (~26 MB). Logs under $OUT.
. bench/lab/call_start.sh
bash bench/lab/gpu_call_softcap_anchor.sh
bash bench/lab/gpu_call_fp8_item_bounds.sh
echo "done ($(at))"
