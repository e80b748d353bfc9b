#!/usr/bin/env bash
# Lab: one GPU call that profiles standard cases with Nsight Compute (ncu --set full, clocks left alone: one launch
# after three warm-ups each) while FlashInfer's modules for the chosen parity groups compile, then runs those parity
# groups (tests/gpu/test_compat_parity.py as a script) and the GPU test files in $TESTS until the deadline.
# Reports (.ncu-rep), their details pages and per-SASS-line source counters under $OUT.
#   env: CASES ("D10 D6 P4-e4m3 P4"), PARITY ("alibi": groups of bench/lab/gpu_call_parity.sh's option names),
#        TESTS (none), DEADLINE_S (570)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
left() { echo $(( ${DEADLINE_S:-570} - ($(date +%s) - t0) )); }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
export FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc
W=/tmp/parity; mkdir -p "$W"
for o in ${PARITY:-alibi}; do
  ( MAX_JOBS=4 timeout $(( $(left) - 40 )) nice -n 10 python3 tests/gpu/test_compat_parity.py --peers /tmp/peers \
      --cases decode-tc0-$o,prefill_paged-causal-$o,prefill_ragged-causal-$o,decode-tc1-$o > "$OUT/parity_$o.txt" 2>&1
    echo "exit $?" >> "$OUT/parity_$o.txt" ) &
done
for c in ${CASES:-D10 D6 P4-e4m3 P4}; do
  case $c in D*) k=batch_decode;; *) k=batch_prefill;; esac
  timeout 150 ncu --clock-control none --kernel-name regex:$k --launch-skip 3 --launch-count 1 --set full \
    --import-source yes --export "$OUT/ncu_$c" -f python3 -m bench.lab.ncu_case "$c" > "$OUT/ncu_$c.log" 2>&1
  echo "ncu $c: exit $? at $(( $(date +%s) - t0 )) s"
  ncu -i "$OUT/ncu_$c.ncu-rep" --page details > "$OUT/ncu_${c}_details.txt" 2>&1
  ncu -i "$OUT/ncu_$c.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_${c}_sass.csv" 2>&1
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Issued Ipc|No Eligible|Achieved Occupancy|Registers Per|Warp Cycles Per Issued" \
    "$OUT/ncu_${c}_details.txt" | head -12
done
if [ -n "${TESTS:-}" ]; then
  CUINFER_CACHE_DIR=/tmp/cc-suite timeout $(( $(left) - 30 )) python3 -m pytest $TESTS -n 8 -q -p no:cacheprovider -rfE \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.txt" | tail -20
fi
wait
for f in "$OUT"/parity_*.txt; do echo "== $f"; grep -v "^ok\| ok " "$f" | tail -15; done
