#!/usr/bin/env bash
# Lab: one GPU call for the fused-RoPE decode (D6): the decode, fp8 and variant GPU tests, a same-run A/B of
# variant_bench's decode rows against .ab/base (ROUNDS, default 2), then with NCU=1 Nsight Compute (--set full,
# per-SASS-line source counters) on D6 plain and D6 with RoPE. Logs under $OUT. Before the call: .ab/base holds the tree before (with this checkout's
# bench/lab/variant_bench.py for --no-prefill); carry .ab.
. bench/lab/call_start.sh
python3 -m pip install -q --target /tmp/site-a --no-build-isolation --no-deps .ab/base > /tmp/install_a.log 2>&1 ||
  { tail /tmp/install_a.log; exit 1; }
CUINFER_CACHE_DIR=/tmp/cc-b timeout 150 python3 -m pytest tests/gpu/test_decode.py tests/gpu/test_fp8_gpu.py \
  tests/gpu/test_variant_builtins_gpu.py tests/gpu/test_variants_gpu.py \
  -q -p no:cacheprovider -rfE -n 12 -o faulthandler_timeout=100 > "$OUT/variant_tests.txt" 2>&1
echo "variant tests exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/variant_tests.txt" | tail -12
bash bench/lab/variant_ab_decode.sh
[ "${NCU:-0}" = 1 ] || exit 0
for c in plain rope; do
  opt=""; [ $c = rope ] && opt="--pos-encoding rope_llama"
  OUT=$OUT bash bench/lab/ncu_one.sh "D6_$c" batch_decode D6 $opt; echo "  at $(at)"
done
