#!/usr/bin/env bash
# Lab: one GPU call for the tensor-core decode's padding rows left out of the softmax (G <= 8): the decode GPU tests,
# a same-run A/B of the decode cases and of the fused-RoPE decode (variant_bench, decode rows) against .ab/base (the
# tree before; its bench/lab/variant_bench.py must know --no-prefill), then the fp8 prefill bound probes (sm90_probe) on this tree and, time left, the GPU suite. Logs under
# $OUT. Before the call: `rm -rf .ab && mkdir -p .ab/base && git archive <base> | tar -x -C .ab/base`; carry .ab.
. bench/lab/call_start.sh
CUINFER_CACHE_DIR=/tmp/cc-b timeout 150 python3 -m pytest tests/gpu/test_decode.py tests/gpu/test_fp8_gpu.py \
  tests/gpu/test_variant_builtins_gpu.py tests/gpu/test_variants_gpu.py -q -p no:cacheprovider -rfE -n 12 \
  -o faulthandler_timeout=120 > "$OUT/decode_tests.txt" 2>&1
rc=$?; echo "decode tests exit $rc at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/decode_tests.txt" | tail -12
[ $rc -eq 124 ] && { echo "hang: stopping"; exit 1; }
AB_BASE=.ab/base AB_WORK=/tmp/ab timeout 220 bash bench/lab/gpu_ab.sh decode "D6,D10,D5-e4m3,D9-e4m3,D5,D7" 2 \
  > "$OUT/ab_decode.txt" 2>&1
echo "decode A/B exit $? at $(at)"; grep -v "^round" "$OUT/ab_decode.txt" | tail -14
ROUNDS=2 bash bench/lab/variant_ab_decode.sh  # (the fused-RoPE decode rows, A/B)
for d in "" -DCUINFER_SM90_PROBE_NO_CONVERT -DCUINFER_SM90_PROBE_NO_STAGE; do
  echo "== probe ${d:-(as shipped)}"; CUINFER_CACHE_DIR=/tmp/cc-probe timeout 80 python3 -m bench.lab.sm90_probe P4-e4m3 ${d:+--defines=$d} 2>&1
done > "$OUT/probe_bounds.txt"; grep -E "^==|producer:|consumer 0:" "$OUT/probe_bounds.txt" | cut -c1-200
echo "probes at $(at)"
CUINFER_CACHE_DIR=/tmp/cc-suite timeout $(( 560 - ($(date +%s) - t0) )) python3 -m pytest tests/gpu \
  --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 -o faulthandler_timeout=150 \
  > "$OUT/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite.txt" | tail -12
