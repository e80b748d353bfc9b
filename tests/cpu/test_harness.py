"""The test harness itself: a pytest-xdist worker limits BLAS / OpenMP to one thread (tests/conftest.py) before NumPy
loads its BLAS, so that parallel workers do not oversubscribe the CPU."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import conftest

PROBE = (
    "import os, sys; sys.path.insert(0, {tests!r}); import conftest; "
    "print(*(os.environ.get(v) for v in conftest.BLAS_THREAD_VARS), conftest.NUMPY_BEFORE_BLAS_LIMIT)"
)


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in conftest.BLAS_THREAD_VARS and k != "PYTEST_XDIST_WORKER"}
    tests = str(pathlib.Path(conftest.__file__).parent)
    out = subprocess.run([sys.executable, "-c", PROBE.format(tests=tests)], env={**clean, **env}, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def test_xdist_workers_run_one_blas_thread():
    assert _probe(PYTEST_XDIST_WORKER="gw3") == "1 1 1 False"
    assert _probe(PYTEST_XDIST_WORKER="gw3", OMP_NUM_THREADS="4") == "1 4 1 False"  # (a setting of the user's stays)
    assert _probe() == "None None None False"  # (not a worker: untouched)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # (this process, when run under xdist)
        assert not conftest.NUMPY_BEFORE_BLAS_LIMIT
