#!/usr/bin/env bash
# Lab: one GPU call for bench/lab/fp8_headpair_probe.py (D10 over its two-heads view against D10 and D6). Logs under $OUT.
. bench/lab/call_start.sh
timeout 300 python3 -m bench.lab.fp8_headpair_probe "${ROUNDS:-5}" > "$OUT/headpair.txt" 2>&1; echo "probe exit $? $(at)"
grep -v Warning "$OUT/headpair.txt" | tail -40
