"""The GPU we run on: presence, architecture and the limits kernels are sized from (never hard-coded)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cuinfer.errors import NoGPUError


@dataclass(frozen=True)
class DeviceInfo:
    device_id: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block_optin: int  # bytes a block may use after opting in (227 KB on Hopper)
    smem_per_sm: int
    l2_bytes: int
    regs_per_sm: int
    max_threads_per_sm: int

    @property
    def arch(self) -> str:
        return arch_for(self.compute_capability)


def arch_for(cc: tuple[int, int]) -> str:
    """NVRTC target for a compute capability: Hopper needs ``sm_90a`` for wgmma/setmaxnreg; others ``sm_XY``."""
    major, minor = cc
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def _cupy():
    try:
        import cupy
    except ImportError as exc:
        raise NoGPUError(
            "CuPy is not installed, so cuinfer cannot reach a GPU. Install the CUDA extra that matches your driver "
            "(pip install 'cuinfer[cuda12]' or 'cuinfer[cuda13]'), or pass NumPy arrays to use the CPU reference."
        ) from exc
    return cupy


_seen_gpu = False


def gpu_available() -> bool:
    """True when CuPy sees at least one CUDA device (never raises). A positive answer is remembered: it is asked on
    every run() and a GPU does not go away."""
    global _seen_gpu
    if _seen_gpu:
        return True
    try:
        cupy = _cupy()
        _seen_gpu = bool(cupy.cuda.is_available())
    except Exception:
        return False
    return _seen_gpu


def require_gpu() -> None:
    if not gpu_available():
        raise NoGPUError(
            "no CUDA GPU is available (no driver or no device). Pass NumPy arrays to run on the CPU reference "
            "backend, or run on a machine with an NVIDIA GPU."
        )


def current_device_id() -> int:
    require_gpu()
    return int(_cupy().cuda.runtime.getDevice())


@functools.cache
def device_info(device_id: int | None = None) -> DeviceInfo:
    require_gpu()
    cupy = _cupy()
    if device_id is None:
        device_id = int(cupy.cuda.runtime.getDevice())
    p = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    return DeviceInfo(
        device_id=device_id,
        name=name,
        compute_capability=(int(p["major"]), int(p["minor"])),
        sm_count=int(p["multiProcessorCount"]),
        smem_per_block_optin=int(p["sharedMemPerBlockOptin"]),
        smem_per_sm=int(p["sharedMemPerMultiprocessor"]),
        l2_bytes=int(p["l2CacheSize"]),
        regs_per_sm=int(p["regsPerMultiprocessor"]),
        max_threads_per_sm=int(p["maxThreadsPerMultiProcessor"]),
    )
