#!/usr/bin/env bash
# Lab: the benches and the FlashInfer parity module in one call, after bench/lab/gpu_fi_warm.sh compiled FlashInfer's
# modules in the background of the previous call (on a cold machine it runs here first). Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install --no-build-isolation --no-deps -e . > /dev/null 2>&1 || { echo "install failed"; exit 1; }
[ -f /tmp/fiwarm/all.done ] || [ -d /tmp/fiwarm ] || bash bench/lab/gpu_fi_warm.sh
for _ in $(seq ${WARM_WAIT_S:-240}); do [ -f /tmp/fiwarm/all.done ] && break; sleep 1; done
ls /tmp/fiwarm; tail -n 2 /tmp/fiwarm/*.log | cut -c1-160
export PYTHONPATH=/tmp/peers:${PYTHONPATH:-} FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 CUINFER_CACHE_DIR=/tmp/cc
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m bench decode --cases D6,D10,D5-e4m3,D9-e4m3 --iters 30 --out "$OUT/b" --no-plot > "$OUT/bench_decode.txt" 2>&1
grep -E "^(case|D[0-9])|^ {20,}[a-z]" "$OUT/bench_decode.txt"
python3 -m bench prefill --cases P4,P5,P6,P4-e4m3,P5-e4m3,P6-e4m3 --no-peers --iters 20 --out "$OUT/b" --no-plot \
  > "$OUT/bench_prefill.txt" 2>&1
grep -E "^(case|P[0-9])|^ {20,}[a-z]" "$OUT/bench_prefill.txt"
python3 -m bench.lab.variant_bench --peers fa2 --iters 30 > "$OUT/variant_bench.txt" 2>&1
sed -n '/^case /,$p' "$OUT/variant_bench.txt"
timeout ${PARITY_S:-200} python3 -m pytest tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE 2>&1 \
  | grep -v "^E  \|^  " | tail -40 > "$OUT/parity_pytest.txt"
tail -15 "$OUT/parity_pytest.txt"
tar -czf "$OUT/fiwarm_logs.tar.gz" -C /tmp/fiwarm . 2>/dev/null
rm -f "$OUT"/b/*-20*.json
