#!/usr/bin/env bash
# Lab GPU call: the soft cap on the sm90 prefill kernel across the source trees of bench/lab/softcap_poly_trees.py
# (carried as .ab/<name>): P1-P3, causal / built-in soft cap 30 / tanh.approx soft cap 30, ROUNDS rotating rounds.
#   TREES="base mf ..." ROUNDS=2 bash bench/lab/gpu_call_softcap_poly.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TREES=${TREES:-$(ls .ab)}; ROUNDS=${ROUNDS:-2}
VARS=${VARS:-"causal,soft cap 30,soft cap 30 (tanh.approx)"}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
for t in $TREES; do for m in kernel_src planner interop; do ln -sfn ../$m ".ab/$t/cuinfer/$m"; done; done
# compile every tree's kernels in parallel (one timed iteration each, results ignored)
for t in $TREES; do
  (cd ".ab/$t" && PYTHONPATH=. CUINFER_CACHE_DIR=/tmp/cc-$t timeout 400 python3 -m bench.lab.variant_bench --lab \
    --variants "$VARS" --no-decode --backends sm90 --iters 1 --cases P3 > "$OUT/warm_$t.txt" 2>&1) &
done
wait
echo "warm done $(date +%T)"
set -- $TREES; k=$#; names=("$@")
for r in $(seq 1 "$ROUNDS"); do
  for j in $(seq 0 $((k - 1))); do
    t=${names[$(( (j + r - 1) % k ))]}
    (cd ".ab/$t" && PYTHONPATH=. CUINFER_CACHE_DIR=/tmp/cc-$t python3 -m bench.lab.variant_bench --lab \
      --variants "$VARS" --no-decode --backends sm90 --iters ${ITERS:-30} > "$OUT/r${r}_$t.txt" 2>&1)
    echo "round $r $t: $(grep -c cuinfer "$OUT/r${r}_$t.txt") rows"
  done
done
python3 - "$OUT" $TREES <<'PY'
import glob, re, sys, statistics, collections
out, trees = sys.argv[1], sys.argv[2:]
us = collections.defaultdict(list)
for t in trees:
    for f in glob.glob(f"{out}/r*_{t}.txt"):
        for line in open(f):
            m = re.match(r"^(prefill P\d)\s+(.+?)\s+cuinfer-sm90\s+([\d.]+)\s+([\d.]+)", line)
            if m:
                us[(t, m.group(1), m.group(2))].append(float(m.group(3)))
print(f"{'tree':10s} {'case':11s} {'variant':28s} {'us (median of rounds)':>22s} {'x causal':>9s}")
for t in trees:
    for case in ("prefill P1", "prefill P2", "prefill P3"):
        c = statistics.median(us.get((t, case, "causal"), [float("nan")]))
        for v in ("causal", "soft cap 30", "soft cap 30 (tanh.approx)"):
            x = us.get((t, case, v))
            if x:
                m = statistics.median(x)
                print(f"{t:10s} {case:11s} {v:28s} {m:22.1f} {c / m:9.3f}   {' '.join(f'{y:.1f}' for y in x)}")
PY
