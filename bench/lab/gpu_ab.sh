#!/usr/bin/env bash
# Lab: same-machine A/B of two builds of cuinfer on the GPU machine, in alternating rounds: bench/lab/gpu_abn.sh with
# two trees, a and b.
#   A = the tree in $AB_BASE (a `git archive` of the commit before a change, e.g. .ab/base), installed with
#       `pip --target` into /tmp/site-a and run with PYTHONPATH (a venv of the GPU machine's python lacks its packages)
#   B = this checkout, installed editable into the system python
# usage: bash bench/lab/gpu_ab.sh "<suites>" "<cases>" <rounds>     results under $AB_WORK (default /tmp/ab): rounds in
# a/ and b/, the comparison (python -m bench.lab.ab_compare) printed at the end and in compare.txt.
set -uo pipefail
W=${AB_WORK:-/tmp/ab}
AB_WORK=$W bash "$(dirname "$0")/gpu_abn.sh" "${1:-decode prefill}" "${2:-D1,D2,D3,D4,D5,D6,D7,D8,D9,P1,P2,P3,P4,P5,P6}" \
  "${3:-3}" a="${AB_BASE:-.ab/base}" b=.
rc=$?
cp "$W/compare_b.txt" "$W/compare.txt" 2>/dev/null
exit $rc
