"""NVRTC compile layer: specs, compile to cubin, disk + memory cache, load through CuPy, launch."""

from cuinfer.jit.cache import cache_dir, cache_size, get_compiled, stats
from cuinfer.jit.compiler import CompiledModule, ResourceUsage, compile_spec
from cuinfer.jit.launch import Kernel, get_kernel, load_module
from cuinfer.jit.params import ParamStruct
from cuinfer.jit.registry import register
from cuinfer.jit.spec import KernelSpec

__all__ = [
    "CompiledModule",
    "Kernel",
    "KernelSpec",
    "ParamStruct",
    "ResourceUsage",
    "cache_dir",
    "cache_size",
    "compile_spec",
    "get_compiled",
    "get_kernel",
    "load_module",
    "register",
    "stats",
]
