"""Locate NVRTC and the CUDA runtime headers, and refuse a mismatch before it turns into a cryptic compile error.

NVRTC ships no CUDA headers: ``cuda_fp16.h``/``cuda_bf16.h``/``cuda_fp8.h`` come from the ``nvidia-cuda-runtime``
wheel of the same CUDA release. Headers of a newer major than NVRTC fail to parse (CUDA 13 headers under NVRTC 12.9),
and ``cuda.pathfinder`` silently falls back to a system toolkit when the wheel is missing, so we read
``CUDART_VERSION`` from the headers we found and compare majors.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import sys
from dataclasses import dataclass

from cuinfer.errors import ToolchainError


@dataclass(frozen=True)
class Toolchain:
    nvrtc_version: tuple[int, int]
    include_dir: str
    cudart_version: int  # e.g. 12090

    @property
    def headers_major(self) -> int:
        return self.cudart_version // 1000

    def describe(self) -> str:
        major, minor = self.nvrtc_version
        hv = self.cudart_version
        return f"NVRTC {major}.{minor}, CUDA runtime headers {hv // 1000}.{hv % 1000 // 10} at {self.include_dir}"


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ToolchainError(
            "cuinfer compiles its kernels with NVRTC through cuda-python, but `cuda.bindings` is not importable "
            f"({exc}). Install the CUDA extra that matches your driver: pip install 'cuinfer[cuda12]' or "
            "'cuinfer[cuda13]'."
        ) from exc
    return nvrtc


def nvrtc_module():
    """The ``cuda.bindings.nvrtc`` module (raises ToolchainError with the fix when absent)."""
    return _nvrtc()


def _wheel_include_dirs() -> list[str]:
    """Runtime-header directories of NVIDIA wheels on sys.path (``nvidia/cuda_runtime/include`` for CUDA 12,
    ``nvidia/cu13/include`` for CUDA 13): a glob costs well under a millisecond, importing cuda.pathfinder ~30 ms."""
    hits = []
    for root in sys.path:
        hits += glob.glob(os.path.join(root, "nvidia", "*", "include", "cuda_runtime_api.h"))
    return sorted({os.path.dirname(h) for h in hits})


def _find_include_dir() -> str:
    override = os.environ.get("CUINFER_CUDA_INCLUDE")
    if override:
        return override
    wheels = _wheel_include_dirs()
    if len(wheels) == 1:
        return wheels[0]
    try:
        import cuda.pathfinder as pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
    except Exception as exc:  # pragma: no cover - depends on the install
        raise ToolchainError(f"could not look up the CUDA runtime headers with cuda.pathfinder: {exc}") from exc
    if not found:
        raise ToolchainError(
            "the CUDA runtime headers (cuda_fp16.h, cuda_bf16.h) were not found. Install the runtime header wheel of "
            "the same CUDA release as NVRTC: pip install 'cuda-toolkit[nvrtc,cudart]==12.*' (or ==13.*), or set "
            "CUINFER_CUDA_INCLUDE to a CUDA include directory."
        )
    return found


def _read_cudart_version(include_dir: str) -> int:
    path = os.path.join(include_dir, "cuda_runtime_api.h")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        raise ToolchainError(f"{path} is missing: {include_dir} is not a CUDA runtime include directory") from exc
    match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
    if not match:
        raise ToolchainError(f"no CUDART_VERSION in {path}: cannot tell which CUDA release these headers are")
    return int(match.group(1))


@functools.lru_cache(maxsize=1)
def include_dir() -> str:
    return _find_include_dir()


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """Identity of the compiler and headers for cache keys, found WITHOUT loading NVRTC.

    Importing ``cuda.bindings.nvrtc`` and loading libnvrtc costs ~90 ms, which would be most of a warm-cache kernel
    load; the NVRTC builtins library's versioned file name, size and mtime identify the compiler as well. Where that
    file is not found (a system toolkit), fall back to asking NVRTC.
    """
    inc = include_dir()
    parts = [f"headers={_read_cudart_version(inc)}@{inc}"]
    hits = []
    for root in sys.path:
        hits += glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc-builtins.so.*"))
    if hits:
        for path in sorted(hits):
            st = os.stat(path)
            parts.append(f"{os.path.realpath(path)}:{st.st_size}:{int(st.st_mtime)}")
    else:
        major, minor = toolchain().nvrtc_version
        parts.append(f"nvrtc={major}.{minor}")
    return ";".join(parts)


@functools.lru_cache(maxsize=1)
def toolchain() -> Toolchain:
    """Find NVRTC and matching headers once per process."""
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:  # pragma: no cover
        raise ToolchainError(f"nvrtcVersion() failed: {err}")
    include_dir_ = include_dir()
    cudart = _read_cudart_version(include_dir_)
    tc = Toolchain((int(major), int(minor)), include_dir_, cudart)
    if tc.headers_major > tc.nvrtc_version[0]:
        raise ToolchainError(
            f"the CUDA runtime headers are CUDA {tc.headers_major} but NVRTC is {major}.{minor}: headers of a newer "
            f"major do not compile under an older NVRTC ({include_dir}). Install headers of NVRTC's release: "
            f"pip install 'cuda-toolkit[nvrtc,cudart]=={major}.*'."
        )
    return tc
