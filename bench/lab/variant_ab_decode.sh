#!/usr/bin/env bash
# Lab: the variant bench's decode rows (D6 plain and with fused RoPE, `variant_bench --no-prefill`) of .ab/base (A,
# installed in /tmp/site-a by the caller) and of this checkout (B, installed editable), ROUNDS (default 2) alternating
# rounds; logs $OUT/rope_<side>_r<round>.txt. .ab/base's bench/lab/variant_bench.py must know --no-prefill.
set -uo pipefail
OUT=${OUT:-/tmp/out}; t0=$(date +%s)
mkdir -p /tmp/run-a /tmp/run-b; ln -sfn "$PWD/.ab/base/bench" /tmp/run-a/bench; ln -sfn "$PWD/bench" /tmp/run-b/bench
vb() {  # side round
  local pp=""; [ "$1" = a ] && pp=/tmp/site-a
  (cd /tmp/run-$1 && PYTHONPATH=$pp CUINFER_CACHE_DIR=/tmp/cc-$1 timeout 100 python3 -m bench.lab.variant_bench \
    --no-prefill --iters 30 > "$OUT/rope_$1_r$2.txt" 2>&1)
  echo "== decode variants side $1 round $2 (at $(( $(date +%s) - t0 )) s)"; sed -n '/^case /,$p' "$OUT/rope_$1_r$2.txt" | head -3
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  if [ $((r % 2)) -eq 1 ]; then vb a "$r"; vb b "$r"; else vb b "$r"; vb a "$r"; fi
done
