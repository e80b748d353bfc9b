#!/usr/bin/env bash
# Lab: one GPU call for the fused-RoPE decode (D6): the decode, fp8 and variant GPU tests, a same-run A/B of
# variant_bench's decode rows against .ab/base (ROUNDS, default 2), then with NCU=1 Nsight Compute (--set full,
# per-SASS-line source counters) on D6 plain and D6 with RoPE. Logs under $OUT. Before the call: .ab/base holds the tree before (with this checkout's
# bench/lab/variant_bench.py for --no-prefill); carry .ab.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
python3 -m pip install -q --target /tmp/site-a --no-build-isolation --no-deps .ab/base > /tmp/install_a.log 2>&1 ||
  { tail /tmp/install_a.log; exit 1; }
CUINFER_CACHE_DIR=/tmp/cc-b timeout 150 python3 -m pytest tests/gpu/test_decode.py tests/gpu/test_fp8_gpu.py \
  tests/gpu/test_variant_builtins_gpu.py tests/gpu/test_variants_gpu.py \
  -q -p no:cacheprovider -rfE -n 12 -o faulthandler_timeout=100 > "$OUT/variant_tests.txt" 2>&1
echo "variant tests exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/variant_tests.txt" | tail -12
mkdir -p /tmp/run-a /tmp/run-b; ln -sfn "$PWD/.ab/base/bench" /tmp/run-a/bench; ln -sfn "$PWD/bench" /tmp/run-b/bench
vb() {  # side round
  local pp=""; [ "$1" = a ] && pp=/tmp/site-a
  (cd /tmp/run-$1 && PYTHONPATH=$pp CUINFER_CACHE_DIR=/tmp/cc-$1 timeout 100 python3 -m bench.lab.variant_bench \
    --no-prefill --iters 30 > "$OUT/rope_$1_r$2.txt" 2>&1)
  echo "== decode variants side $1 round $2 (at $(at))"; sed -n '/^case /,$p' "$OUT/rope_$1_r$2.txt" | head -3
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  if [ $((r % 2)) -eq 1 ]; then vb a $r; vb b $r; else vb b $r; vb a $r; fi
done
[ "${NCU:-0}" = 1 ] || exit 0
for c in plain rope; do
  opt=""; [ $c = rope ] && opt="--pos-encoding rope_llama"
  CUINFER_CACHE_DIR=/tmp/cc-b timeout 150 ncu --clock-control none --kernel-name regex:batch_decode \
    --launch-skip 3 --launch-count 1 --set full --import-source yes --export "$OUT/ncu_D6_$c" -f \
    python3 -m bench.lab.ncu_case D6 $opt > "$OUT/ncu_D6_$c.log" 2>&1
  echo "ncu $c exit $? at $(at)"
  ncu -i "$OUT/ncu_D6_$c.ncu-rep" --page details > "$OUT/ncu_D6_${c}_details.txt" 2>&1
  ncu -i "$OUT/ncu_D6_$c.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_D6_${c}_sass.csv" 2>&1
  grep -E "^ +(Duration|DRAM Throughput|Issue Slots Busy|No Eligible|Achieved Occupancy|Warp Cycles Per Issued|Registers)" \
    "$OUT/ncu_D6_${c}_details.txt" | head -10
done
