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
from cuinfer.utils import specs as S

HALF_DTYPES = (DType.FLOAT16, DType.BFLOAT16)
# Index arrays: int32, or int64 (narrowed to int32 on the device by narrow_indices for the kernels that read int32)
INDEX_DTYPES = (DType.INT32, DType.INT64)


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


def check_index(
    name: str, t: Tensor, length: int | None = None, *, dtypes: Sequence[DType] = INDEX_DTYPES, hint=None
) -> None:
    """A 1-D index array the kernels read: an allowed integer dtype, ``length`` entries, contiguous."""
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
    """The values of an index array on the host as int64, checked to fit in int32: read in place for host arrays,
    one blocking device-to-host copy (made by the array's framework) for device arrays."""
    return validate.check_index_array(name, t.numpy() if not t.is_cuda else x, nonnegative=False).astype(np.int64)


def index_launch(kind: str, src: Tensor, lens: Tensor, out0: Tensor, out1: Tensor, n: int, batch: int, page_size: int,
                 sms: int) -> Launch:  # fmt: skip
    """A launch of one of positions.cu's kernels (4 entries a thread)."""
    params = S.PositionsParams.pack(
        indptr=src.ptr, lens=lens.ptr, out0=out0.ptr, out1=out1.ptr, n=n, batch_size=batch, page_size=page_size
    )
    grid = blocks(-(-n // (4 * S.POSITIONS_THREADS)), sms, 8)
    return Launch(S.positions_spec(), S.positions_instance(kind), (grid,), (S.POSITIONS_THREADS,), params)


def as_int32(call: Any, t: Tensor) -> Tensor:
    """``t`` for a kernel that reads int32 indices: itself, or for int64 a new int32 array of the call's framework
    filled on the call's stream (values are not checked: the host reads none)."""
    if t.dtype is DType.INT32:
        return t
    out = call.empty(t.shape, DType.INT32)
    if t.size:
        index_launch("narrow_indices", t, t, out, out, t.size, 0, 0, sm_count(call.device_id)).run(
            call.device_id, call.stream
        )
    return out


def upload(call: Any, values: np.ndarray, dtype: DType) -> Tensor:
    """A new device array of the call's framework holding ``values`` (copied on the call's stream)."""
    import cupy

    host = np.ascontiguousarray(values, dtype=dtype.numpy)
    out = call.empty(host.shape, dtype)
    if host.nbytes:
        cupy.cuda.runtime.memcpyAsync(out.ptr, host.ctypes.data, host.nbytes, 1, call.stream)  # 1: host to device
    return out
