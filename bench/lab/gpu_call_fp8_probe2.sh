#!/usr/bin/env bash
# Lab: one GPU call for fp8 Hopper prefill producer variants: bench/lab/gpu_abn.sh over base=.ab/base and $TREES on
# $CASES ($ROUNDS rounds), then bench.lab.sm90_probe on this checkout: P4 and P4-e4m3, and P4-e4m3 under the bound
# probes (no conversion; no staging copies). Logs under $OUT.
. bench/lab/call_start.sh
CASES=${CASES:-P4-e4m3,P5-e4m3,P6-e4m3,P4}
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-300} bash bench/lab/gpu_abn.sh prefill "$CASES" ${ROUNDS:-2} base=.ab/base $TREES \
  > "$OUT/abn.txt" 2>&1
echo "A/B exit $? at $(at)"; grep -v "^round" "$OUT/abn.txt" | grep -v " fa2 " | tail -30
for d in "" "--defines=-DCUINFER_SM90_PROBE_NO_CONVERT" "--defines=-DCUINFER_SM90_PROBE_NO_STAGE"; do
  c="P4 P4-e4m3"; [ -n "$d" ] && c="P4-e4m3"
  echo "== probe $c $d"; timeout 120 python3 -m bench.lab.sm90_probe $c $d 2>&1 | tail -25
done > "$OUT/probe.txt"
echo "probes at $(at)"; cat "$OUT/probe.txt"
