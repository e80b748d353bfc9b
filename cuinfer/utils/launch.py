"""What the utility calls share on the host: a launch described as data (so the GPU path can be checked without a GPU),
grid sizing, and the checks of arrays that the kernels read with vector loads or as int32 indices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType
from cuinfer.jit import KernelSpec, get_kernel

HALF_DTYPES = (DType.FLOAT16, DType.BFLOAT16)
INT32 = (DType.INT32,)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: which instance of which spec, its grid and block, and its by-value parameter struct."""

    spec: KernelSpec
    name_expr: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    params: np.void

    def run(self, device_id: int, stream: int) -> None:
        kernel = get_kernel(self.spec, self.name_expr, device_id)
        kernel.launch(self.grid, self.block, (self.params,), stream=stream)


def sm_count(device_id: int) -> int:
    from cuinfer.runtime.device import device_info

    return device_info(device_id).sm_count


def blocks(needed: int, sms: int, per_sm: int) -> int:
    """Blocks to launch: enough for the work, at most ``per_sm`` resident blocks per SM (the kernels grid-stride)."""
    return max(1, min(needed, sms * per_sm))


def alignment(t: Tensor) -> int:
    """The largest power of two (<= 16) dividing the byte address of element 0 and every byte stride but the last:
    the widest vector that reaches every row of ``t``. (An empty array or a size-1 dimension imposes nothing.)"""
    a = 16
    for v in (t.ptr, *(s * t.dtype.itemsize for n, s in zip(t.shape[:-1], t.strides[:-1], strict=True) if n > 1)):
        while a > 1 and v % a:
            a //= 2
    return a


def check_rows16(name: str, t: Tensor) -> None:
    """The kernels move rows in 16-byte vectors: element 0 and every row must start on 16 bytes."""
    if alignment(t) < 16:
        raise ValueError(
            f"{name} must have rows that start on 16-byte boundaries (element 0 and every stride but the last) but "
            f"starts at 0x{t.ptr:x} with strides {t.strides} (elements of {t.dtype.itemsize} bytes); pass "
            f"{validate.contiguous_fix(name, t.framework)}"
        )


def check_index(name: str, t: Tensor, length: int | None = None, *, dtypes: Sequence[DType] = INT32, hint=None) -> None:
    """A 1-D index array the kernels read directly: an allowed integer dtype, ``length`` entries, contiguous."""
    validate.check_ndim(name, t, 1, hint=hint)
    validate.check_dtype(name, t, dtypes)
    if length is not None:
        validate.check_shape(name, t, (length,), hint=hint)
    if t.shape[0] > 1 and t.strides[0] != 1:
        fix = validate.contiguous_fix(name, t.framework)
        raise ValueError(f"{name} must be contiguous but has stride {t.strides[0]}; pass {fix}")


def check_positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} but is {value!r}")
    return int(value)


def host_values(name: str, t: Tensor, x: Any) -> np.ndarray:
    """The values of an index array on the host as int64: read in place for host arrays, one blocking
    device-to-host copy (made by the array's framework) for device arrays."""
    if not t.is_cuda:
        return np.asarray(t.numpy(), dtype=np.int64)
    return validate.check_index_array(name, x, nonnegative=False).astype(np.int64)


def upload(call: Any, values: np.ndarray, dtype: DType) -> Tensor:
    """A new device array of the call's framework holding ``values`` (copied on the call's stream)."""
    import cupy

    host = np.ascontiguousarray(values, dtype=dtype.numpy)
    out = call.empty(host.shape, dtype)
    if host.nbytes:
        cupy.cuda.runtime.memcpyAsync(out.ptr, host.ctypes.data, host.nbytes, 1, call.stream)  # 1: host to device
    return out
