#!/usr/bin/env bash
# Lab GPU calls (prepared 2026-12-05 (e)): the prepared experiments in two calls on one warm machine.
#   bash bench/lab/ab_trees.sh base=main tree=5b1fc6d nopp=sm90-nopp clk=b6dec33 npclk=sm90-nopp-clk \
#     nofin=lab-fp8-nofinish noq=lab-fp8-noq ipf=decode-index-prefetch
# call 1 (~500 s; carry .ab/base .ab/tree .ab/nopp .ab/clk .ab/npclk .ab/nofin .ab/noq .ab/ipf, ~35 MB):
#   bash bench/lab/gpu_call_next_e.sh 1      the soft-cap trees and MUFU latencies, then the fp8 item bounds
# call 2 (~150 s, no carry):
#   bash bench/lab/gpu_call_next_e.sh 2      Nsight Compute's per-SASS stall samples of P1 causal and soft cap
# Logs under $OUT.
. bench/lab/call_start.sh
case ${1:-1} in
  1) bash bench/lab/gpu_call_softcap_anchor.sh; ROUNDS=2 bash bench/lab/gpu_call_fp8_item_bounds.sh ;;
  2) bash bench/lab/gpu_call_softcap_ncu_sass.sh ;;
esac
echo "done ($(at))"
