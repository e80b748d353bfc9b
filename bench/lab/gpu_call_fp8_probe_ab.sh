#!/usr/bin/env bash
# Lab: the sm90 cycle probe on $PROBE_CASES, the fp8 test file, then a same-machine A/B against .ab/base on $CASES.
. bench/lab/call_start.sh
timeout 120 python3 -m bench.lab.sm90_probe ${PROBE_CASES:-P4-e4m3 P6-e4m3} > "$OUT/probe.txt" 2>&1; cat "$OUT/probe.txt"
OUT=$OUT bash bench/lab/gpu_call_fp8_ab.sh
