#!/usr/bin/env bash
# Lab: one GPU call for a closing table: the prefill suite on $PREFILL_CASES without peers (FlashInfer's JIT for the
# decode cases compiles meanwhile, niced), then the decode suite on $DECODE_CASES beside FlashInfer, then the GPU test
# suite (the parity module aside) until the deadline. Results (JSON) and logs in $OUT/measure.tar.gz.
#   env: PREFILL_CASES (P4,P5,P6,P4-e4m3,P5-e4m3,P6-e4m3), DECODE_CASES (D6,D10,D5-e4m3,D9-e4m3), DEADLINE_S (560)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/measure; mkdir -p "$W"
left() { echo $(( ${DEADLINE_S:-560} - ($(date +%s) - t0) )); }
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$W/install.log" 2>&1 || { tail "$W/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
export FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc
D=${DECODE_CASES:-D6,D10,D5-e4m3,D9-e4m3}
( PYTHONPATH=/tmp/peers MAX_JOBS=12 nice -n 19 python3 -m bench warm --cases "$D" > "$W/warm.log" 2>&1; touch "$W/warm.done" ) &
python3 -m bench prefill --cases "${PREFILL_CASES:-P4,P5,P6,P4-e4m3,P5-e4m3,P6-e4m3}" --no-peers --no-plot --out "$W/res" \
  > "$W/prefill.txt" 2>&1
echo "prefill done at $(at)"; grep -E "^ *P[0-9]" "$W/prefill.txt" | cut -c1-150
while [ ! -f "$W/warm.done" ] && [ "$(left)" -gt 200 ]; do sleep 5; done
echo "FlashInfer warm: $( [ -f "$W/warm.done" ] && echo done || echo 'not done') at $(at)"
PYTHONPATH=/tmp/peers python3 -m bench decode --cases "$D" --no-plot --out "$W/res" > "$W/decode.txt" 2>&1
echo "decode done at $(at)"; grep -E "^ *D[0-9]" "$W/decode.txt" | cut -c1-170
timeout $(( $(left) - 25 )) python3 -m pytest tests/gpu -n 8 -q -p no:cacheprovider -rfE --ignore tests/gpu/test_compat_parity.py \
  > "$W/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$W/gpu_suite.txt" | tail -15
tar -czf "$OUT/measure.tar.gz" -C "$W" .
