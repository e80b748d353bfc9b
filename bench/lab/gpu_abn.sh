#!/usr/bin/env bash
# Lab: same-machine comparison of several builds of cuinfer on the GPU machine, in rotating rounds (gpu_ab.sh for
# more than two trees).
#   usage: bash bench/lab/gpu_abn.sh "<suites>" "<cases>" <rounds> name=dir [name=dir ...]
# Each dir is a `git archive` tree (e.g. .ab/v1), installed with `pip --target` into /tmp/site-<name>; "." is this
# checkout, installed editable. Round r runs the trees starting at tree (r - 1) mod n, so every tree is measured
# early and late. Results under $AB_WORK (default /tmp/abn); each tree is compared with the first
# (python -m bench.lab.ab_compare) at the end. AB_BENCH: the module run instead of bench (e.g. bench.lab.page_cases).
set -uo pipefail
export PYTHONUNBUFFERED=1
W=${AB_WORK:-/tmp/abn}; mkdir -p "$W"
suites=$1; cases=$2; n=$3; shift 3
. bench/lab/ab_install.sh
names=(); dirs=(); paths=()
for t in "$@"; do
  name=${t%%=*}; dir=${t#*=}; names+=("$name"); dirs+=("$dir"); mkdir -p "$W/$name"
  ab_install "$name" "$dir" "$W/install_$name.log" || exit 1
  paths+=("$AB_SITE")
done
k=${#names[@]}
for r in $(seq 1 "$n"); do
  for j in $(seq 0 $((k - 1))); do
    i=$(( (j + r - 1) % k )); name=${names[$i]}
    for s in $suites; do
      (cd "/tmp/run-$name" && PYTHONPATH=${paths[$i]} CUINFER_CACHE_DIR=/tmp/cc-$name python3 -m ${AB_BENCH:-bench} "$s" \
        --cases "$cases" --no-peers --no-plot --out "$W/raw-$name" > "$W/$name/log-$s-r$r.txt" 2>&1) &&
        cp "$W/raw-$name/$s-latest.json" "$W/$name/$s-r$r.json"
      echo "round $r $name $s: $(tail -1 "$W/$name/log-$s-r$r.txt")"
    done
  done
done
for i in $(seq 1 $((k - 1))); do
  echo "== ${names[$i]} (B) against ${names[0]} (A)"
  python3 -m bench.lab.ab_compare "$W/${names[0]}" "$W/${names[$i]}" | tee "$W/compare_${names[$i]}.txt"
done
