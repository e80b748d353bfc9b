# Lab: sourced by the A/B calls (gpu_abn.sh, gpu_call_variant_abn.sh). ab_install NAME DIR LOG installs the tree DIR
# as build NAME: "." is this checkout (pip -e), another DIR a `git archive` tree (bench/lab/ab_trees.sh) installed with
# pip --target into /tmp/site-NAME; the tree's bench/ is linked from /tmp/run-NAME, a directory that holds nothing else,
# so `import cuinfer` there is the build's. Sets AB_SITE to the PYTHONPATH the build runs with ("" for ".").
ab_install() {
  local name=$1 dir=$2 log=$3
  mkdir -p "/tmp/run-$name"
  if [ "$dir" = "." ]; then
    # (not again where cuinfer already imports from this checkout outside it: call_start.sh installed it)
    local here=$PWD
    if [ "$(cd / && python3 -c 'import cuinfer, os; print(os.path.dirname(os.path.dirname(cuinfer.__file__)))' \
      2>/dev/null)" != "$here" ]; then
      python3 -m pip install -q --no-build-isolation --no-deps -e . > "$log" 2>&1 || { tail "$log"; return 1; }
    fi
    AB_SITE=""
  else
    rm -rf "/tmp/site-$name"
    python3 -m pip install -q --target "/tmp/site-$name" --no-build-isolation --no-deps "$dir" > "$log" 2>&1 ||
      { tail "$log"; return 1; }
    AB_SITE="/tmp/site-$name"
  fi
  ln -sfn "$(cd "$dir" && pwd)/bench" "/tmp/run-$name/bench"
}
