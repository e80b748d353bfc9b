#!/usr/bin/env bash
# Lab GPU call: the soft cap table with FlashInfer's fa3 path in the same run. FlashInfer's fa3 modules (causal,
# soft cap, ALiBi) compiled in parallel first; meanwhile a replay of a GPU test seed (REPLAY_SEED / REPLAY_ID, a node id) on this
# checkout and on .ab/head; then variant_bench rounds (this checkout with fa3, .ab/head without).
. bench/lab/call_start.sh
ROUNDS=${ROUNDS:-2}
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
export FLASHINFER_CUDA_ARCH_LIST=9.0a
for v in "causal" "soft cap 30" "alibi"; do
  (PYTHONPATH=/tmp/peers MAX_JOBS=5 timeout 400 python3 -m bench.lab.variant_bench --peers fa3 --backends "" \
    --variants "$v" --iters 1 --cases P3 --no-decode > "$OUT/fi_warm_${v// /_}.txt" 2>&1) &
done
if [ -n "${REPLAY_ID:-}" ]; then
  CUINFER_SEED=$REPLAY_SEED timeout 200 python3 -m pytest -q -p no:cacheprovider "$REPLAY_ID" \
    > "$OUT/replay_new.txt" 2>&1; echo "replay new: $(tail -1 "$OUT/replay_new.txt") ($(at))"
  for m in kernel_src planner interop; do ln -sfn ../$m ".ab/head/cuinfer/$m"; done
  (cd .ab/head && CUINFER_SEED=$REPLAY_SEED PYTHONPATH=. CUINFER_CACHE_DIR=/tmp/cc-head timeout 200 python3 -m pytest -q \
    -p no:cacheprovider "$REPLAY_ID" > "$OUT/replay_head.txt" 2>&1)
  echo "replay head: $(tail -1 "$OUT/replay_head.txt") ($(at))"
fi
wait
echo "fa3 warm ($(at))"; grep -h "flashinfer" "$OUT"/fi_warm_*.txt | head -6
VARS="causal,soft cap 30,soft cap 30 (accurate),alibi"
for r in $(seq 1 "$ROUNDS"); do
  PYTHONPATH=/tmp/peers python3 -m bench.lab.variant_bench --variants "$VARS" --no-decode --backends sm90 \
    --peers fa3 > "$OUT/new_r$r.txt" 2>&1
  (cd .ab/head && PYTHONPATH=. CUINFER_CACHE_DIR=/tmp/cc-head python3 -m bench.lab.variant_bench \
    --variants "causal,soft cap 30,alibi" --no-decode --backends sm90 > "$OUT/head_r$r.txt" 2>&1)
  echo "round $r ($(at))"
done
for f in "$OUT"/new_r*.txt "$OUT"/head_r*.txt; do echo "== $f"; grep -E "^prefill" "$f"; done
