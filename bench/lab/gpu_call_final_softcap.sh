#!/usr/bin/env bash
# Lab GPU call: examples/scaled_logits.py for torch, JAX and CuPy, then the prefill, decode, fp8 and variant GPU test
# files whole (every kernel the variant contract renders into).
. bench/lab/call_start.sh
for fw in torch jax cupy; do timeout 120 python3 examples/scaled_logits.py --framework $fw 2>&1 | tail -2; done
echo "examples ($(at))"
timeout 420 python3 -m pytest -q -n 12 -p no:cacheprovider tests/gpu/test_prefill.py tests/gpu/test_decode.py \
  tests/gpu/test_fp8_gpu.py tests/gpu/test_variants_gpu.py tests/gpu/test_prefill_sm90.py > "$OUT/tests.txt" 2>&1
echo "tests rc=$? ($(at))"; grep -E "^FAILED|passed|failed" "$OUT/tests.txt" | tail -12
