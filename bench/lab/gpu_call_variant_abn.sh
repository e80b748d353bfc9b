#!/usr/bin/env bash
# Lab GPU call: the Hopper prefill kernel's variants (variant_bench, sm90, P1-P3) across several builds in rotating
# rounds, after the GPU tests of this checkout. Trees are `git archive` trees (bench/lab/ab_trees.sh; carry them) or
# "." (this checkout), each installed with pip into its own site directory and run from a directory that holds only
# its bench/. Prints, per case and variant, each tree's median TFLOP/s, its fraction of the same tree's causal and
# its ratio to the first tree. Logs under $OUT.
#   TREES="base=.ab/base ovl=.ab/ovl int=." ROUNDS=3 bash bench/lab/gpu_call_variant_abn.sh
#   env: VARS (variant_bench names), CASES (P1,P2,P3), ITERS (30), TESTS (test files run first; "" for none),
#        TESTS_K (-k; default "sm90 or prefill": the prefill tests of those files), TEST_TIMEOUT (240; the default set
#        may need more: TESTS=tests/gpu/test_prefill_sm90.py TESTS_K= for a quick check)
. bench/lab/call_start.sh
TREES=${TREES:-"base=.ab/base int=."}; ROUNDS=${ROUNDS:-3}
VARS=${VARS:-"causal,soft cap 30,alibi,window 1024"}; CASES=${CASES:-P1,P2,P3}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
TESTS=${TESTS-tests/gpu/test_prefill_sm90.py tests/gpu/test_prefill.py tests/gpu/test_fp8_gpu.py tests/gpu/test_variant_builtins_gpu.py tests/gpu/test_variants_gpu.py}
TESTS_K=${TESTS_K-sm90 or prefill}
if [ -n "$TESTS" ]; then
  CUINFER_CACHE_DIR=/tmp/cc-tests timeout ${TEST_TIMEOUT:-240} python3 -m pytest $TESTS ${TESTS_K:+-k "$TESTS_K"} -n 8 -q \
    -p no:cacheprovider -rfE > "$OUT/gpu_tests.txt" 2>&1
  echo "tests exit $? ($(at))"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | tail -12
fi
. bench/lab/ab_install.sh
names=(); paths=()
for t in $TREES; do
  name=${t%%=*}; names+=("$name")
  ab_install "$name" "${t#*=}" "$OUT/install_$name.log" || exit 1
  paths+=("$AB_SITE")
done
k=${#names[@]}
vb() {  # tree index, round, iterations
  local name=${names[$1]}
  (cd "/tmp/run-$name" && PYTHONPATH=${paths[$1]} CUINFER_CACHE_DIR=/tmp/cc-$name timeout 300 python3 -m \
    bench.lab.variant_bench --variants "$VARS" --cases "$CASES" --no-decode --backends sm90 --iters "$3" \
    > "$OUT/r$2_$name.txt" 2>&1)
}
for i in $(seq 0 $((k - 1))); do vb "$i" 0 1 & done  # every tree's kernels compiled at once (round 0: not counted)
wait; echo "compiled ($(at))"
for r in $(seq 1 "$ROUNDS"); do
  for j in $(seq 0 $((k - 1))); do
    i=$(( (j + r - 1) % k )); vb "$i" "$r" "${ITERS:-30}"
    echo "round $r ${names[$i]}: $(grep -c cuinfer-sm90 "$OUT/r${r}_${names[$i]}.txt") rows ($(at))"
  done
done
python3 - "$OUT" "${names[@]}" <<'PY'
import collections, glob, re, statistics, sys
out, trees = sys.argv[1], sys.argv[2:]
tf = collections.defaultdict(list)
for t in trees:
    for f in sorted(glob.glob(f"{out}/r[1-9]*_{t}.txt")):
        for line in open(f):
            m = re.search(r"\('(prefill P\d)', '([^']+)', 'cuinfer-sm90', (?:np\.float64\()?([\d.]+)\)?, (?:np\.float64\()?([\d.]+)", line)
            if m:
                tf[(t, m.group(1), m.group(2))].append(float(m.group(4)))
med = {k: statistics.median(v) for k, v in tf.items()}
print(f"{'case':11s} {'variant':14s} {'tree':6s} {'TFLOP/s':>8s} {'x causal':>9s} {'x ' + trees[0]:>9s}  rounds")
for case, variant in sorted({(c, v) for _, c, v in med}):
    for t in trees:
        if (t, case, variant) not in med:
            continue
        x = med[(t, case, variant)]
        c = med.get((t, case, "causal"), float("nan"))
        b = med.get((trees[0], case, variant), float("nan"))
        rounds = " ".join(f"{y:.1f}" for y in tf[(t, case, variant)])
        print(f"{case:11s} {variant:14s} {t:6s} {x:8.1f} {x / c:9.3f} {x / b:9.3f}  {rounds}")
PY
