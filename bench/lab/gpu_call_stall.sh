#!/usr/bin/env bash
# Lab: find why some sm90 GPU tests stall under `pytest -n 8` (they pass alone). Phase A: the sm90 tests under -n 8
# as before, with GPU / CPU monitors and Python tracebacks of every worker (faulthandler via sitecustomize, on a timer
# and on SIGUSR1); phase B: the same with BLAS / OpenMP threads limited to one per worker; phase C: the GPU suite.
#   env: A_S (90), B_S (90), SUITE_THREADS (1: BLAS threads per worker in phase C), DEADLINE_S (585)
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=/tmp/cc
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/fh /tmp/fhsite
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
cat > /tmp/fhsite/sitecustomize.py <<'PY'
import faulthandler, os, signal
_f = open(f"/tmp/fh/{os.getpid()}.txt", "w")
faulthandler.register(signal.SIGUSR1, file=_f, all_threads=True)
faulthandler.dump_traceback_later(int(os.environ.get("FH_EVERY", "45")), repeat=True, file=_f)
PY
monitor() {  # $1: tag
  ( while true; do echo "== $1 $(at)"; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' '; echo
      ps -eo pid,pcpu,nlwp,stat,etime,args --sort=-pcpu | grep -v "ps -eo" | head -12 | cut -c1-150; sleep 6; done ) >> "$OUT/monitor.txt" 2>&1 &
  echo $!
}
phase() {  # $1: tag, $2: timeout, rest: env
  local tag=$1 lim=$2; shift 2
  local m; m=$(monitor "$tag")
  ( sleep $(( lim - 15 )); echo "== $tag SIGUSR1 $(at)" >> "$OUT/monitor.txt"; pkill -USR1 '^python3' ) &
  local s=$!
  env "$@" PYTHONPATH=/tmp/fhsite timeout "$lim" python3 -m pytest tests/gpu/test_prefill_sm90.py -v -p no:cacheprovider \
    -rfE -n 8 --durations=12 > "$OUT/phase_$tag.txt" 2>&1
  echo "phase $tag exit $? at $(at)"; kill $m $s 2>/dev/null
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/phase_$tag.txt" | grep -c PASSED
  grep -E "passed|failed|FAILED|ERROR" "$OUT/phase_$tag.txt" | tail -12
  for f in /tmp/fh/*.txt; do [ -s "$f" ] && { echo "### $tag $f"; cat "$f"; }; done >> "$OUT/tracebacks.txt"; rm -f /tmp/fh/*.txt
}
phase A ${A_S:-90} FH_EVERY=45
phase B ${B_S:-90} FH_EVERY=45 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
python3 -c "import numpy; numpy.show_config()" > "$OUT/numpy_config.txt" 2>&1
n=${SUITE_THREADS:-1}
OPENBLAS_NUM_THREADS=$n OMP_NUM_THREADS=$n MKL_NUM_THREADS=$n timeout $(( ${DEADLINE_S:-585} - ($(date +%s) - t0) )) \
  python3 -m pytest tests/gpu --ignore tests/gpu/test_compat_parity.py -q -p no:cacheprovider -rfE -n 12 --durations=15 \
  > "$OUT/gpu_suite.txt" 2>&1
echo "suite exit $? at $(at)"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_suite.txt" | tail -30
