#!/usr/bin/env bash
# compute-sanitizer on the GPU machine, in about 9 minutes on an H200:
#   1. memcheck over the GPU suite, one pytest worker (no -n): the selection SELECT below, since the whole suite
#      (~190 tests, ~3.5 min with 8 workers unsanitized) would not fit under memcheck's 10-50x slower kernels;
#   2. racecheck and 3. synccheck over tests/gpu/sanitize_cases.py: one small case of each kernel (decode tensor-core,
#      decode CUDA-core with a split, prefill ragged cross-item, prefill paged split + merge_partials, prefill small
#      tiles, the three merges).
# Each tool's output goes to a log; one summary line per tool is printed (errors / hazards summed over every process
# the tool followed: the suite's canaries run in child processes). The logs come back as $OUT/sanitize_logs.tar.gz,
# the summary as $OUT/sanitize_summary.txt. Exit status 0 only if every tool ran and found nothing.
#
# usage (on the GPU machine, in the repository root):  bash .ci/gpu_sanitize.sh
#   SELECT="<pytest -k expression>"  replaces the memcheck selection ("" runs the whole suite)
#   MEMCHECK_S / RACECHECK_S / SYNCCHECK_S  time limits of the three steps in seconds (defaults 300 / 120 / 60)
#   MEMCHECK_WORKERS=N  runs the memcheck suite with pytest -n N (each xdist worker is a sanitized child process;
#                       on 2026-12-01 with N=8 no test finished within 210 s: give it the full 10 minutes or use one worker)
#   MEMCHECK_SHARDS=N   splits the selected tests into N lists and runs N sanitized pytest processes side by side
#                       (no xdist under the sanitizer); the JAX-parametrised tests go to ceil(N/6) shards of their
#                       own, so only those processes pay for JAX's start under memcheck. Errors are summed over all.
# The memcheck suite runs with -v so a run stopped at its limit still reports how many tests finished and the last one.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
LOGS=$(mktemp -d /tmp/sanitize.XXXXXX)
mkdir -p "$OUT"
SUMMARY="$OUT/sanitize_summary.txt"
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

python3 -m pip install --no-build-isolation --no-deps -e . > "$LOGS/install.log" 2>&1 || { tail -30 "$LOGS/install.log"; exit 1; }
command -v compute-sanitizer > /dev/null || { say "compute-sanitizer is not on the PATH"; exit 1; }
# One kernel cache for every step (kernels are compiled by NVRTC on the host, outside what the sanitizer checks), and
# JAX must not take 75 % of the GPU at start (conftest sets this too; the canaries' child processes inherit it here).
export CUINFER_CACHE_DIR=${CUINFER_CACHE_DIR:-/tmp/cuinfer-cache} XLA_PYTHON_CLIENT_PREALLOCATE=false

# The memcheck selection. Every test file and every kernel: decode tensor-core and CUDA-core, unsplit and split (the
# in-kernel merge), empty requests, single_decode, a CUDA-graph replay; prefill ragged and paged, split (+ the
# merge_partials kernel), small tiles (q16), the cross-item pipeline (one SM), paired blocks, a custom mask,
# single_prefill, the shared tail; the merge kernels on CuPy; the interop tests on CuPy and torch (JAX's own kernels
# under memcheck cost minutes and are not ours); the variant tests; and every "errors before launch" test. The
# test_decode / test_prefill canaries (child processes, one small case per kernel family) run as well.
DEFAULT_SELECT="(test_batch_decode and (b7mix-p16-32x8-d128-nhd-bf16-auto or b7mix-p16-32x8-d128-nhd-bf16-cc \
or b128mix-p16-32x8-bf16-tc-split512 or b128mix-p5-32x32-d128-bf16-cc-split256 or empty-requests-tc)) \
or (test_batch_prefill and (b12mix-32x8-d128-bf16-causal-p16 or b12mix-ragged-split256 or q16-kv128 \
or one-sm-b12mix-ragged or two-sm-paired-p5 or custom-mask-q32)) \
or test_single_decode and cupy or test_single_prefill and cupy \
or test_split_requests_merge_in_kernel_on_every_run or test_cuda_graph_replays_after_replan \
or test_shared_tail_is_taken_once_per_launch or test_gpu_errors_before_launch \
or test_merge_gpu and cupy or test_interop_gpu and not jax or test_variants_gpu"
SELECT=${SELECT-$DEFAULT_SELECT}

# --error-exitcode: a run with any error exits 9. API errors are not reported: torch, JAX and CuPy make calls that
# fail on purpose (probing peer access, querying events), and a failed call of ours raises in Python and fails a test
# anyway. --target-processes all: the canaries run in child processes.
CS=(compute-sanitizer --error-exitcode 9 --target-processes all --report-api-errors no)

sanitize() {  # sanitize <tool> <seconds> <log> <command...>: run the command under the tool; returns its exit status
  local tool=$1 limit=$2 log=$3
  shift 3
  timeout --signal=INT --kill-after=20 "$limit" "${CS[@]}" --tool "$tool" "$@" > "$log" 2>&1
}

count() {  # count <log> <regex with one number>: the sum of that number over every matching line (one per process)
  grep -oE "$2" "$1" | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}'
}

status=0
report() {  # report <tool> <log> <exit status> <what is counted> <summary regex>
  local tool=$1 log=$2 rc=$3 what=$4 regex=$5 n processes
  processes=$(grep -cE "$regex" "$log")
  n=$(count "$log" "$regex")
  if [ "$processes" -eq 0 ]; then
    say "$tool: no summary line (exit $rc): the sanitizer did not finish; see $(basename "$log")"
    grep -m3 -E "Error|error|not supported|Timeout|Killed" "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
    status=1
    return
  fi
  local extra=""
  [ "$rc" -eq 124 ] && extra=", stopped at its time limit"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 9 ] && [ "$rc" -ne 124 ] && extra=", exit $rc"
  say "$tool: $n $what in $processes process(es)$extra"
  if [ "$n" -ne 0 ] || [ "$rc" -ne 0 ]; then status=1; fi
}

# 0. the cases once without a sanitizer: compiles their kernels into the cache and checks that they are right
python3 tests/gpu/sanitize_cases.py > "$LOGS/cases_plain.log" 2>&1
rc=$?
say "cases without a sanitizer: exit $rc; $(grep -c '^ok' "$LOGS/cases_plain.log") ok, $(grep -c '^FAIL' "$LOGS/cases_plain.log") wrong"
[ "$rc" -ne 0 ] && { tail -20 "$LOGS/cases_plain.log"; status=1; }

# 1. memcheck over the GPU suite (the selection)
K=()
[ -n "$SELECT" ] && K=(-k "$SELECT")
PYTEST=(python3 -m pytest -m gpu -v -p no:cacheprovider -p no:benchmark -rfE)
if [ -n "${MEMCHECK_SHARDS:-}" ]; then
  python3 -m pytest -m gpu tests/gpu --co -q -p no:cacheprovider "${K[@]}" 2> /dev/null | grep '::' > "$LOGS/ids.txt"
  python3 - "$LOGS" "$MEMCHECK_SHARDS" <<'PY'
import sys
logs, n = sys.argv[1], int(sys.argv[2])
ids = open(f"{logs}/ids.txt").read().split()
jax = [i for i in ids if "jax" in i]
rest = [i for i in ids if "jax" not in i]
nj = min(len(jax), -(-n // 6)) if jax else 0
shards = [[] for _ in range(n)]
for k, i in enumerate(jax):
    shards[k % nj].append(i)
for k, i in enumerate(rest):
    shards[nj + k % (n - nj)].append(i)
for k, s in enumerate(shards):
    open(f"{logs}/shard{k}.txt", "w").write("\n".join(s) + "\n")
print(f"{len(ids)} tests in {n} shards ({len(jax)} JAX tests in {nj})")
PY
  say "memcheck: $(wc -l < "$LOGS/ids.txt") selected tests, $MEMCHECK_SHARDS sanitized processes"
  pids=()
  for ((k = 0; k < MEMCHECK_SHARDS; k++)); do
    mapfile -t ids < "$LOGS/shard$k.txt"
    sanitize memcheck "${MEMCHECK_S:-300}" "$LOGS/memcheck_shard$k.log" "${PYTEST[@]}" "${ids[@]}" &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do  # the first failure's status, or 124 if any shard ran out of time
    wait "$p"
    r=$?
    if [ "$r" -eq 124 ] || [ "$rc" -eq 0 ]; then rc=$r; fi
  done
  cat "$LOGS"/memcheck_shard*.log > "$LOGS/memcheck_suite.log"
  for ((k = 0; k < MEMCHECK_SHARDS; k++)); do
    say "    shard $k: $(grep -E '[0-9]+ (passed|failed)' "$LOGS/memcheck_shard$k.log" | tail -1 | tr -d '=')"
  done
else
  [ -n "${MEMCHECK_WORKERS:-}" ] && K+=(-n "$MEMCHECK_WORKERS")
  sanitize memcheck "${MEMCHECK_S:-300}" "$LOGS/memcheck_suite.log" "${PYTEST[@]}" tests/gpu "${K[@]}"
  rc=$?
fi
report memcheck "$LOGS/memcheck_suite.log" "$rc" "errors" 'ERROR SUMMARY: [0-9]+ error'
# -v: a run stopped at its time limit still shows how far it got (one line per finished test)
say "    pytest: $(grep -E '[0-9]+ (passed|failed)' "$LOGS/memcheck_suite.log" | tail -1)"
say "    tests finished: $(grep -cE ' (PASSED|FAILED|SKIPPED|ERROR)' "$LOGS/memcheck_suite.log"), the last: $(grep -E ' (PASSED|FAILED|SKIPPED|ERROR)' "$LOGS/memcheck_suite.log" | tail -1 | cut -c1-120)"

# 2. racecheck over the small cases (shared-memory hazards)
sanitize racecheck "${RACECHECK_S:-120}" "$LOGS/racecheck_cases.log" python3 tests/gpu/sanitize_cases.py
rc=$?
report racecheck "$LOGS/racecheck_cases.log" "$rc" "hazards" 'RACECHECK SUMMARY: [0-9]+ hazard'
grep -E '^(ok|FAIL) ' "$LOGS/racecheck_cases.log" | sed 's/^/    /' | tee -a "$SUMMARY"

# 3. synccheck over the small cases (barriers and warp syncs used wrongly)
sanitize synccheck "${SYNCCHECK_S:-60}" "$LOGS/synccheck_cases.log" python3 tests/gpu/sanitize_cases.py
rc=$?
report synccheck "$LOGS/synccheck_cases.log" "$rc" "errors" 'ERROR SUMMARY: [0-9]+ error'

tar -czf "$OUT/sanitize_logs.tar.gz" -C "$LOGS" .
say "logs: $OUT/sanitize_logs.tar.gz ($(ls "$LOGS" | tr '\n' ' '))"
exit $status
