#!/usr/bin/env bash
# Lab (this machine): the trees the GPU calls' A/B compare, as `git archive` of a revision without docs/ and tests/
# (~2.5 MB each; .ab/ is git-ignored, carry it to the GPU machine).
#   usage: bash bench/lab/ab_trees.sh name=rev [name=rev ...]    e.g.  base=main pp=pending-piece rt=decode-req-table
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for t in "$@"; do
  name=${t%%=*}; rev=${t#*=}
  rm -rf ".ab/$name"; mkdir -p ".ab/$name"
  git archive "$rev" | tar -x -C ".ab/$name"
  rm -rf ".ab/$name/docs" ".ab/$name/tests"
  echo ".ab/$name: $(git rev-parse --short "$rev") ($rev), $(du -sh ".ab/$name" | cut -f1)"
done
