"""Shared test fixtures.

- Tests marked ``@pytest.mark.gpu`` are skipped (with the reason) when CuPy is missing or sees no CUDA device; the
  check runs only if such tests were collected, so CPU-only runs never import CuPy here.
- ``framework``: parametrises a GPU test over torch, JAX and CuPy; each is skipped when not installed or without a
  GPU. The value is the framework's name (a ``str``, usable as ``interop.empty(framework, ...)``) with helpers to
  move NumPy data in and out: ``framework.asarray(np_array)`` puts it on the GPU (bfloat16 / fp8 included; CuPy holds
  fp8 as uint8) and ``framework.to_numpy(x)`` brings it back.
- ``rng``: a ``numpy.random.Generator`` with a fresh seed per test, printed so a failure shows it; set
  ``CUINFER_SEED=<seed>`` to replay a failure.
"""

from __future__ import annotations

import functools
import os
import secrets
import subprocess
import sys
from typing import Any

# Under pytest-xdist, each worker's float64 references would run OpenBLAS / OpenMP with one thread per core, and N
# workers would oversubscribe the CPU (measured on a 16-core machine: the sm90 GPU tests under -n 8 did not finish in
# 90 s; with one BLAS thread per worker they took 24 s). So a worker runs one, set before NumPy loads its BLAS.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
NUMPY_BEFORE_BLAS_LIMIT = "numpy" in sys.modules
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in BLAS_THREAD_VARS:
        os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# JAX would otherwise take 75 % of the GPU at start, starving torch and CuPy in the same test process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@functools.cache
def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when a CUDA device is usable."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        if not cupy.cuda.is_available():
            return "no CUDA GPU (CuPy sees no device)"
    except Exception as exc:  # a broken driver install raises instead of answering False
        return f"no usable CUDA GPU ({exc})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_skip_reason()
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))


# ---- frameworks ----------------------------------------------------------------------------------------------------


class Framework(str):
    """A framework name with helpers to move NumPy (and ml_dtypes) arrays onto the GPU and back."""

    module: Any

    def asarray(self, a: np.ndarray, device_id: int = 0) -> Any:
        a = np.ascontiguousarray(a)
        if self == "torch":
            torch = self.module
            if a.dtype.kind == "V" or a.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
                # torch.from_numpy does not know ml_dtypes: move the bits and reinterpret them.
                bits = torch.from_numpy(a.view(np.uint16 if a.itemsize == 2 else np.uint8))
                return bits.to(f"cuda:{device_id}").view(getattr(torch, a.dtype.name))
            return torch.from_numpy(a).to(f"cuda:{device_id}")
        if self == "cupy":
            cupy = self.module
            with cupy.cuda.Device(device_id):
                if a.dtype.name.startswith("float8"):
                    return cupy.asarray(a.view(np.uint8))  # CuPy has no fp8 dtype
                return cupy.asarray(a)
        jax = self.module
        return jax.device_put(a, jax.devices("gpu")[device_id])

    def to_numpy(self, x: Any, dtype: Any = None) -> np.ndarray:
        """Back to the host; ``dtype`` reinterprets the bits (e.g. a CuPy uint8 fp8 cache as float8_e4m3fn)."""
        if self == "torch":
            torch = self.module
            if x.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
                import ml_dtypes

                bits = x.view(torch.int16 if x.element_size() == 2 else torch.uint8).cpu().numpy()
                out = bits.view(getattr(ml_dtypes, str(x.dtype).removeprefix("torch.")))
            else:
                out = x.detach().cpu().numpy()
        elif self == "cupy":
            out = x.get()
        else:
            out = np.asarray(x)
        return out.view(dtype) if dtype is not None else out


def _load_framework(name: str) -> Framework:
    reason = gpu_skip_reason()
    if reason is not None:
        pytest.skip(f"gpu test: {reason}")
    fw = Framework(name)
    if name == "torch":
        fw.module = pytest.importorskip("torch")
        if not fw.module.cuda.is_available():
            pytest.skip("torch is installed without CUDA support")
    elif name == "jax":
        fw.module = pytest.importorskip("jax")
        try:
            fw.module.devices("gpu")
        except RuntimeError:
            pytest.skip("JAX is installed without a GPU backend")
    else:
        fw.module = pytest.importorskip("cupy")
    return fw


@pytest.fixture(params=[pytest.param(n, id=n) for n in ("torch", "jax", "cupy")])
def framework(request: pytest.FixtureRequest) -> Framework:
    return _load_framework(request.param)


# ---- randomness ----------------------------------------------------------------------------------------------------


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    seed = int(os.environ.get("CUINFER_SEED", secrets.randbits(32)))
    # Captured output is shown for failing tests, so the seed of a failure is always in the report.
    print(f"rng seed: {seed} (replay with CUINFER_SEED={seed})")
    request.node.user_properties.append(("rng_seed", seed))
    return np.random.default_rng(seed)


def run_canary(script: str, what: str, cases: str) -> None:
    """Run a GPU test module as a child process (its ``__main__``: a few small cases) and fail the module with the
    child's output if it exits non-zero: a kernel fault there cannot poison this process's CUDA context. ``what``
    names the module's tests ("decode"), ``cases`` what the child runs ("one small case per kernel")."""
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.fail(
            f"the {what} canary (a child process running {cases}) failed with exit code {r.returncode}; the {what} "
            f"GPU tests are not run so that a kernel fault cannot poison this process's CUDA context.\n"
            f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}",
            pytrace=False,
        )
