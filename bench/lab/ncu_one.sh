#!/usr/bin/env bash
# Lab: Nsight Compute (--set full, clocks left alone, one launch after three warm-ups, per-SASS-line source counters)
# on one run of `python3 -m bench.lab.ncu_case <args>`; writes $OUT/ncu_<name>.ncu-rep, _details.txt, _sass.csv and
# prints the headline metrics.   usage: bash bench/lab/ncu_one.sh <name> <kernel regex> <ncu_case args...>
set -uo pipefail
name=$1 k=$2; shift 2; OUT=${OUT:-/tmp/out}
CUINFER_CACHE_DIR=${CUINFER_CACHE_DIR:-/tmp/cc-b} timeout 150 ncu --clock-control none --kernel-name "regex:$k" \
  --launch-skip 3 --launch-count 1 --set full --import-source yes --export "$OUT/ncu_$name" -f \
  python3 -m bench.lab.ncu_case "$@" > "$OUT/ncu_$name.log" 2>&1
echo "ncu $name: exit $?"
ncu -i "$OUT/ncu_$name.ncu-rep" --page details > "$OUT/ncu_${name}_details.txt" 2>&1
ncu -i "$OUT/ncu_$name.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_${name}_sass.csv" 2>&1
grep -E "^ +(Duration|DRAM Throughput|Issue Slots Busy|Issued Ipc Active|No Eligible|Achieved Occupancy|Warp Cycles Per Issued|Registers Per)" \
  "$OUT/ncu_${name}_details.txt" | head -10
