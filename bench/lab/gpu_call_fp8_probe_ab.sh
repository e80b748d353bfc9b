#!/usr/bin/env bash
# Lab: the sm90 cycle probe on $PROBE_CASES, the fp8 test file, then a same-machine A/B against .ab/base on $CASES.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=/tmp/cc
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
timeout 120 python3 -m bench.lab.sm90_probe ${PROBE_CASES:-P4-e4m3 P6-e4m3} > "$OUT/probe.txt" 2>&1; cat "$OUT/probe.txt"
OUT=$OUT bash bench/lab/gpu_call_fp8_ab.sh
