#!/usr/bin/env bash
# Lab: same-machine A/B of two builds of cuinfer on the GPU machine, in alternating rounds.
#   A = the tree in $AB_BASE (a `git archive` of the commit before a change, e.g. .ab/base), installed with
#       `pip --target` into /tmp/site-a and run with PYTHONPATH (a venv of the GPU machine's python lacks its packages)
#   B = this checkout, installed editable into the system python
# usage: bash bench/lab/gpu_ab.sh "<suites>" "<cases>" <rounds>     results under $AB_WORK (default /tmp/ab);
# prints the comparison (python -m bench.lab.ab_compare) at the end.
set -uo pipefail
export PYTHONUNBUFFERED=1
AB_BASE=${AB_BASE:-.ab/base}; W=${AB_WORK:-/tmp/ab}; mkdir -p "$W/a" "$W/b"
suites=${1:-"decode prefill"}; cases=${2:-"D1,D2,D3,D4,D5,D6,D7,D8,D9,P1,P2,P3,P4,P5,P6"}; n=${3:-3}
rm -rf /tmp/site-a
python3 -m pip install -q --target /tmp/site-a --no-build-isolation --no-deps "$AB_BASE" > "$W/install_a.log" 2>&1 ||
  { tail "$W/install_a.log"; exit 1; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$W/install_b.log" 2>&1 || { tail "$W/install_b.log"; exit 1; }
# each side runs its own bench/ from a directory that holds nothing else, so `import cuinfer` is its installed build
mkdir -p /tmp/run-a /tmp/run-b; ln -sfn "$(cd "$AB_BASE" && pwd)/bench" /tmp/run-a/bench; ln -sfn "$PWD/bench" /tmp/run-b/bench
run() {  # side pythonpath round
  local side=$1 pp=$2 r=$3
  for s in $suites; do
    (cd /tmp/run-$side && PYTHONPATH=$pp CUINFER_CACHE_DIR=/tmp/cc-$side python3 -m bench $s --cases "$cases" --no-peers --no-plot \
      --out "$W/raw-$side" > "$W/$side/log-$s-r$r.txt" 2>&1) && cp "$W/raw-$side/$s-latest.json" "$W/$side/$s-r$r.json"
    echo "round $r side $side $s: $(tail -1 "$W/$side/log-$s-r$r.txt")"
  done
}
for r in $(seq 1 "$n"); do
  if [ $((r % 2)) -eq 1 ]; then run a /tmp/site-a $r; run b "" $r; else run b "" $r; run a /tmp/site-a $r; fi
done
python3 -m bench.lab.ab_compare "$W/a" "$W/b" | tee "$W/compare.txt"
