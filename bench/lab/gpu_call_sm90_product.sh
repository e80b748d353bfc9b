#!/usr/bin/env bash
# Lab: one GPU call for the Hopper prefill backend (BatchPrefill(backend="sm90")): install, FlashInfer's P1-P3 modules
# compiled in the background (niced), the sm90 GPU tests against float64, then (if they pass) the prefill suite on
# P1-P3 beside FlashInfer fa2 / fa3 and the variant bench (fa2 and sm90 rows, FlashInfer fa3 rows). Logs under $OUT.
#   env: SM90_TESTS (tests/gpu/test_prefill_sm90.py), SM90_CASES (P1,P2,P3), SM90_VARIANT_PEERS (fa3; "" for none),
#        SM90_SKIP_SUITE=1 (no prefill suite), SM90_WARM=0 (no FlashInfer), SM90_TEST_S (150), DEADLINE_S (570)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
C=${SM90_CASES:-P1,P2,P3}
if [ "${SM90_WARM:-1}" = 1 ]; then
  ( PYTHONPATH=/tmp/peers MAX_JOBS=12 nice -n 19 python3 -m bench warm --cases "$C" > "$OUT/fi_warm.log" 2>&1
    touch /tmp/warm.done ) &
else
  touch /tmp/warm.done
fi
PYTHONPATH=/tmp/peers timeout ${SM90_TEST_S:-150} python3 -m pytest ${SM90_TESTS:-tests/gpu/test_prefill_sm90.py} -q -p no:cacheprovider -rfE \
  > "$OUT/tests.txt" 2>&1
rc=$?
echo "tests exit $rc at $(at)"; grep -E "passed|failed|FAILED|ERROR|Error" "$OUT/tests.txt" | tail -25
[ $rc -ne 0 ] && [ "${SM90_BENCH_ANYWAY:-0}" != 1 ] && exit $rc
while [ ! -f /tmp/warm.done ] && [ $(( $(date +%s) - t0 )) -lt 330 ]; do sleep 5; done
echo "FlashInfer warm: $( [ -f /tmp/warm.done ] && echo done || echo 'not done') at $(at)"
if [ "${SM90_SKIP_SUITE:-0}" != 1 ]; then
  PYTHONPATH=/tmp/peers python3 -m bench prefill --cases "$C" --no-plot --out "$OUT/res" > "$OUT/suite.txt" 2>&1
  echo "suite exit $? at $(at)"; grep -E "^ *P[0-9]" "$OUT/suite.txt" | cut -c1-170
fi
PYTHONPATH=/tmp/peers timeout $(( ${DEADLINE_S:-570} - ($(date +%s) - t0) )) python3 -m bench.lab.variant_bench \
  --no-decode --backends fa2,sm90 --peers "${SM90_VARIANT_PEERS-fa3}" --variants "causal,soft cap 30,alibi,window 1024" \
  --cases "$C" > "$OUT/variants.txt" 2>&1
echo "variants exit $? at $(at)"; sed -n '/^case/,$p' "$OUT/variants.txt"
