"""Locate NVRTC and the CUDA runtime headers, and refuse a mismatch before it turns into a cryptic compile error.

NVRTC ships no CUDA headers: ``cuda_fp16.h``/``cuda_bf16.h``/``cuda_fp8.h`` come from the ``nvidia-cuda-runtime``
wheel of the same CUDA release. Headers of a newer major than NVRTC fail to parse (CUDA 13 headers under NVRTC 12.9),
and ``cuda.pathfinder`` silently falls back to a system toolkit when the wheel is missing, so we read
``CUDART_VERSION`` from the headers we found and compare majors.
"""

from __future__ import annotations

import functools
import glob
import hashlib
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


_CUDART_VERSION = re.compile(rb"#define\s+CUDART_VERSION\s+(\d+)")


@functools.lru_cache(maxsize=8)
def _read_cudart_version(include_dir: str) -> int:
    """``CUDART_VERSION`` of ``cuda_runtime_api.h``: its first 64 KiB hold it (a few ms saved on every process start
    over reading all 650 KB); the whole file is read only when they do not."""
    path = os.path.join(include_dir, "cuda_runtime_api.h")
    try:
        with open(path, "rb") as fh:
            match = _CUDART_VERSION.search(fh.read(1 << 16))
            if not match:
                fh.seek(0)
                match = _CUDART_VERSION.search(fh.read())
    except OSError as exc:
        raise ToolchainError(f"{path} is missing: {include_dir} is not a CUDA runtime include directory") from exc
    if not match:
        raise ToolchainError(f"no CUDART_VERSION in {path}: cannot tell which CUDA release these headers are")
    return int(match.group(1))


@functools.lru_cache(maxsize=1)
def include_dir() -> str:
    return _find_include_dir()


# The CUDA headers the kernels include (kernel_src: ``#include <...>``) and the ones those pull in. Their contents are
# part of every cache key; tests/cpu/test_cache_keys.py fails when a kernel includes a header missing here.
KERNEL_CUDA_HEADERS = ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp", "cuda_fp8.h", "cuda_fp8.hpp")


def header_identity(include_dir_: str) -> str:
    """``CUDART_VERSION`` of the headers plus a digest of the contents of the ones kernels include (no path)."""
    h = hashlib.sha256()
    for name in KERNEL_CUDA_HEADERS:
        try:
            with open(os.path.join(include_dir_, name), "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            continue  # an older release without cuda_fp8.hpp: its absence is part of the identity
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return f"{_read_cudart_version(include_dir_)}:{h.hexdigest()[:16]}"


def _nvrtc_wheels() -> list[str]:
    """``libnvrtc-builtins.so.<major>.<minor>`` of each NVRTC wheel on sys.path, with the wheel's exact version read
    from the name of its ``.dist-info`` beside it (``nvidia_cuda_nvrtc_cu12-12.9.86``): file names only, no path, size
    or mtime, so the identity is the same wherever the wheel is installed."""
    found = set()
    for root in sys.path:
        libs = glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc-builtins.so.*"))
        if not libs:
            continue
        dists = glob.glob(os.path.join(root, "nvidia_cuda_nvrtc*.dist-info"))
        wheel = ",".join(sorted(os.path.basename(d).removesuffix(".dist-info") for d in dists)) or "no-dist-info"
        found.update(f"{os.path.basename(lib)}({wheel})" for lib in libs)
    return sorted(found)


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """Portable identity of the compiler and headers for cache keys, found WITHOUT loading NVRTC.

    Importing ``cuda.bindings.nvrtc`` and loading libnvrtc costs ~90 ms, which would be most of a warm-cache kernel
    load; the versioned file name of the NVRTC builtins library and the name of its wheel's ``.dist-info`` identify
    the compiler as well. Where no NVRTC wheel is on sys.path (a system toolkit), ask NVRTC for its version. The
    headers count by ``CUDART_VERSION`` and content (:func:`header_identity`). No absolute path and no mtime enters:
    a cache copied to another machine or install prefix with the same releases hits.
    """
    wheels = _nvrtc_wheels()
    if wheels:
        nvrtc = "+".join(wheels)
    else:
        major, minor = toolchain().nvrtc_version
        nvrtc = f"{major}.{minor}"
    return f"nvrtc={nvrtc};headers={header_identity(include_dir())}"


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
