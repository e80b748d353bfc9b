#!/usr/bin/env bash
# Lab: the closing GPU call of 2026-12-03d: the GPU suite (-n 12), a same-machine A/B against .ab/base on the fp8
# prefill cases, then the bf16 prefill cases (cuinfer rows) for the fp8 / bf16 ratios. Logs under $OUT.
. bench/lab/call_start.sh
timeout 200 python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 \
  -o faulthandler_timeout=150 --durations=5 > "$OUT/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite.txt" | tail -12
AB_BASE=.ab/base AB_WORK=/tmp/ab timeout 150 bash bench/lab/gpu_ab.sh prefill "P4-e4m3,P5-e4m3,P6-e4m3" 2 > "$OUT/ab.txt" 2>&1
echo "A/B exit $? at $(at)"; grep -v "^round" "$OUT/ab.txt" | tail -12
timeout 90 python3 -m bench prefill --cases P4,P5,P6 --no-peers --no-plot --out "$OUT/res" > "$OUT/bench.txt" 2>&1
echo "bench exit $? at $(at)"; grep -E "^ +P[0-9](-e4m3)? +cuinfer" "$OUT/bench.txt" | cut -c1-100
