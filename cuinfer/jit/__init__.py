"""NVRTC compile layer: specs, compile to cubin, disk + memory cache, load through CuPy, launch."""

from cuinfer.jit.cache import (
    CacheTrustError,
    CacheWarning,
    cache_dir,
    cache_mode,
    cache_size,
    cache_tiers,
    fetch,
    get_compiled,
    stats,
    user_cache_dir,
)
from cuinfer.jit.compiler import CompiledModule, ResourceUsage, compile_spec
from cuinfer.jit.launch import Kernel, get_kernel, load_module
from cuinfer.jit.params import ParamStruct
from cuinfer.jit.registry import register
from cuinfer.jit.spec import KernelSpec

__all__ = [
    "CacheTrustError",
    "CacheWarning",
    "CompiledModule",
    "Kernel",
    "KernelSpec",
    "ParamStruct",
    "ResourceUsage",
    "cache_dir",
    "cache_mode",
    "cache_size",
    "cache_tiers",
    "compile_spec",
    "fetch",
    "get_compiled",
    "get_kernel",
    "load_module",
    "register",
    "stats",
    "user_cache_dir",
]
