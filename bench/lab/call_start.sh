# Lab: the start every gpu_call_*.sh shares, sourced (`. bench/lab/call_start.sh` from the checkout's root): strict
# mode, unbuffered Python, JAX without preallocation, one BLAS thread (pytest-xdist workers), the kernel cache in
# /tmp/cc unless set, $OUT (the device tool's folder, /tmp/out elsewhere), at() (seconds since the start), and this
# checkout installed editable into the machine's python.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CUINFER_CACHE_DIR=${CUINFER_CACHE_DIR:-/tmp/cc}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
at() { echo "$(( $(date +%s) - t0 )) s"; }
python3 -m pip install -q --no-build-isolation --no-deps -e . > /tmp/install.log 2>&1 || { tail /tmp/install.log; exit 1; }
