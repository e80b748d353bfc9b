#!/usr/bin/env bash
# Lab: the closing GPU call of 2026-12-03e on this checkout, most needed first under a deadline (DEADLINE_S, default
# 280): the decode-side GPU tests (decode, fp8, variants, interop), the RoPE-decode A/B (3 rounds) and the decode
# suite's A/B (2 rounds) against .ab/base (the tree before; carry .ab), then time left the rest of the GPU suite and
# the examples in torch, JAX and CuPy. Logs under $OUT.
. bench/lab/call_start.sh
left() { echo $(( ${DEADLINE_S:-280} - ($(date +%s) - t0) )); }
python3 -m pip install -q --target /tmp/site-a --no-build-isolation --no-deps .ab/base > /tmp/install_a.log 2>&1 ||
  { tail /tmp/install_a.log; exit 1; }
DEC="tests/gpu/test_decode.py tests/gpu/test_fp8_gpu.py tests/gpu/test_variant_builtins_gpu.py tests/gpu/test_variants_gpu.py
  tests/gpu/test_interop_gpu.py"
CUINFER_CACHE_DIR=/tmp/cc-suite timeout 120 python3 -m pytest $DEC -q -p no:cacheprovider -rfE -n 12 \
  -o faulthandler_timeout=100 > "$OUT/decode_tests.txt" 2>&1
echo "decode-side tests exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/decode_tests.txt" | tail -12
ROUNDS=3 timeout 80 bash bench/lab/variant_ab_decode.sh; echo "RoPE A/B at $(at)"
AB_BASE=.ab/base AB_WORK=/tmp/ab timeout 90 bash bench/lab/gpu_ab.sh decode "D1,D2,D4,D6,D7,D10,D5-e4m3" 2 \
  > "$OUT/ab_decode.txt" 2>&1
echo "decode A/B exit $? at $(at)"; grep -v "^round" "$OUT/ab_decode.txt" | tail -24
if [ "$(left)" -gt 60 ]; then
  CUINFER_CACHE_DIR=/tmp/cc-suite timeout $(( $(left) - 10 )) python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py \
    $(for f in $DEC; do echo --ignore "$f"; done) -q -p no:cacheprovider -rfE -n 12 -o faulthandler_timeout=100 \
    > "$OUT/gpu_rest.txt" 2>&1
  echo "rest of the suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_rest.txt" | tail -12
fi
for ex in "examples/fp8_kv_cache.py --framework jax" "examples/prefill_sm90.py --framework jax" \
          "examples/fp8_kv_cache.py --framework torch" "examples/fp8_kv_cache.py --framework cupy" \
          "examples/compat_flashinfer.py"; do
  [ "$(left)" -gt 15 ] || break
  echo "== $ex"; CUINFER_CACHE_DIR=/tmp/cc-suite timeout 30 python3 $ex 2>&1 | tail -3; echo "exit ${PIPESTATUS[0]}"
done > "$OUT/examples.txt" 2>&1; echo "examples at $(at)"; cat "$OUT/examples.txt"
