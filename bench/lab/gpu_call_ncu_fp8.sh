#!/usr/bin/env bash
# Lab: Nsight Compute (full set) on one launch of the Hopper prefill kernel for $CASES (default P4 and P4-e4m3: bf16
# and fp8 K / V), text details under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUINFER_CACHE_DIR=/tmp/cc OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
for c in ${CASES:-P4 P4-e4m3}; do
  timeout 200 ncu --kernel-name regex:batch_prefill_sm90 --launch-skip 3 --launch-count 1 --set full \
    --import-source no python3 -m bench.lab.ncu_case "$c" --backend sm90 > "$OUT/ncu_$c.txt" 2>&1
  echo "$c exit $?"
done
