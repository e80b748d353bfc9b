#!/usr/bin/env bash
# Lab: one GPU call for bench/lab/d10_setup_probe.py, then fp8_headpair_probe (2 rounds) for the same machine. Logs under $OUT.
. bench/lab/call_start.sh
timeout 300 python3 -m bench.lab.d10_setup_probe > "$OUT/d10_setup.txt" 2>&1; echo "setup probe exit $? $(at)"
grep -v Warning "$OUT/d10_setup.txt" | tail -30
timeout 200 python3 -m bench.lab.fp8_headpair_probe 2 > "$OUT/headpair.txt" 2>&1; echo "headpair exit $? $(at)"
grep -v Warning "$OUT/headpair.txt" | tail -4
