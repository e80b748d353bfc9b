#!/usr/bin/env bash
# Lab: one GPU call: FlashInfer's prefill modules for $CASES compiled in the background (niced), a same-machine A/B of
# two builds on the prefill suite's cuinfer rows (bench/lab/gpu_ab.sh: A = $AB_BASE, B = this checkout; P1-P3, no
# peers), then the prefill suite on $CASES with FlashInfer fa2 / fa3 and SDPA. Logs under $OUT.
#   env: CASES (P1,P2,P3,P4,P5,P6), AB_CASES (P1,P2,P3), AB_ROUNDS (2), SKIP_AB=1, DEADLINE_S (585)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
C=${CASES:-P1,P2,P3,P4,P5,P6}
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
( PYTHONPATH=/tmp/peers MAX_JOBS=12 nice -n 19 python3 -m bench warm --cases "$C" > "$OUT/fi_warm.log" 2>&1
  touch /tmp/warm.done ) &
if [ "${SKIP_AB:-0}" != 1 ]; then
  AB_WORK=/tmp/ab bash bench/lab/gpu_ab.sh prefill "${AB_CASES:-P1,P2,P3}" "${AB_ROUNDS:-2}" > "$OUT/ab.txt" 2>&1
  echo "A/B exit $? at $(at)"; sed -n '/^case\|^suite\|^ *P[0-9]/p' "$OUT/ab.txt" | tail -30
else
  python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
fi
while [ ! -f /tmp/warm.done ] && [ $(( $(date +%s) - t0 )) -lt 420 ]; do sleep 5; done
echo "FlashInfer warm: $( [ -f /tmp/warm.done ] && echo done || echo 'not done') at $(at)"
PYTHONPATH=/tmp/peers timeout $(( ${DEADLINE_S:-585} - ($(date +%s) - t0) )) python3 -m bench prefill --cases "$C" \
  --out "$OUT/res" > "$OUT/suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "^ *P[0-9]" "$OUT/suite.txt" | cut -c1-200
