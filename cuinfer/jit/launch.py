"""Load cubins through CuPy and launch their kernels on the caller's stream."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cuinfer.interop.streams import cupy_stream
from cuinfer.jit.cache import get_compiled, spec_key
from cuinfer.jit.compiler import CompiledModule, ResourceUsage
from cuinfer.jit.spec import KernelSpec
from cuinfer.runtime.device import current_device_id, device_info

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

_modules: dict[tuple[str, int], tuple[CompiledModule, object]] = {}
_kernels: dict[tuple[KernelSpec, int, str], Kernel] = {}
_streams: dict[tuple[int, int], object] = {}
_lock = threading.Lock()


@dataclass
class Kernel:
    """One loaded kernel. ``launch`` takes a tuple of arguments, normally one by-value ParamStruct (numpy.void)."""

    name_expr: str
    symbol: str
    function: object  # cupy.cuda.function.Function
    resources: ResourceUsage | None
    device_id: int
    _smem_limit: int = 48 * 1024

    def launch(self, grid, block, args: tuple, *, smem_bytes: int = 0, stream: int = 0) -> None:
        if smem_bytes > self._smem_limit:
            from cupy_backends.cuda.api import driver

            driver.funcSetAttribute(
                self.function.ptr, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(smem_bytes)
            )
            self._smem_limit = int(smem_bytes)
        grid = grid if isinstance(grid, tuple) else (int(grid),)
        block = block if isinstance(block, tuple) else (int(block),)
        key = (int(stream), self.device_id)
        s = _streams.get(key)
        if s is None:  # wrapping a raw handle costs ~10 us: once per (stream, device)
            s = _streams[key] = cupy_stream(key[0], self.device_id)
        self.function(grid, block, args, shared_mem=int(smem_bytes), stream=s)

    def max_active_blocks(self, block_threads: int, smem_bytes: int = 0) -> int:
        """CTAs of this kernel that fit on one SM (CUDA's occupancy calculator), for sizing persistent grids."""
        from cupy_backends.cuda.api import driver

        if smem_bytes > self._smem_limit:
            driver.funcSetAttribute(
                self.function.ptr, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(smem_bytes)
            )
            self._smem_limit = int(smem_bytes)
        return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(self.function.ptr, block_threads, smem_bytes))


def load_module(spec: KernelSpec, device_id: int | None = None) -> tuple[CompiledModule, object]:
    """Compile or fetch from cache, then load into the device's context (once per process and device)."""
    import cupy

    if device_id is None:
        device_id = current_device_id()
    arch = device_info(device_id).arch
    key = (spec_key(spec, arch), device_id)
    entry = _modules.get(key)
    if entry is not None:
        return entry
    compiled = get_compiled(spec, arch)
    with _lock:
        entry = _modules.get(key)
        if entry is None:
            with cupy.cuda.Device(device_id):
                module = cupy.cuda.function.Module()
                module.load(compiled.cubin)
            entry = _modules[key] = (compiled, module)
    return entry


def get_kernel(spec: KernelSpec, name_expr: str, device_id: int | None = None) -> Kernel:
    """A launchable kernel for one template instance of ``spec``; cached per (spec, device, instance)."""
    if device_id is None:
        device_id = current_device_id()
    memo = (spec, device_id, name_expr)  # frozen dataclass: hashed by value (str hashes are cached by Python)
    k = _kernels.get(memo)
    if k is not None:
        return k
    if name_expr not in spec.name_exprs:
        raise ValueError(f"{name_expr!r} is not one of the instances of {spec.name}: {spec.name_exprs}")
    compiled, module = load_module(spec, device_id)
    symbol = compiled.lowered[name_expr]
    k = Kernel(name_expr, symbol, module.get_function(symbol), compiled.resources.get(symbol), device_id)
    _kernels[memo] = k
    return k
