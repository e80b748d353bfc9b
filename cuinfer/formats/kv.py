"""The view of K and V a kernel reads: base pointers and element strides of any cache layout, and the alignment the
kernels' 16-byte vector loads need."""

from __future__ import annotations

from dataclasses import dataclass

from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor


@dataclass(frozen=True)
class KV:
    """K and V of a paged cache (or of one request): base pointers and element strides (page, slot, head)."""

    k: Tensor
    v: Tensor
    k_ptr: int
    v_ptr: int
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]
    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int


def check_aligned(name: str, t: Tensor, dims: tuple[int, ...]) -> None:
    """A contiguous last dimension (the API's rule, on both routes), and on the GPU 16-byte vector access: base address
    and the strides of ``dims`` multiples of 16 bytes (an address property of a device allocation, not checked on the
    CPU reference route)."""
    validate.check_last_dim_contiguous(name, t)
    if not t.is_cuda:
        return
    item = t.dtype.itemsize
    bad = False
    for d in dims:
        bad = bad or (t.shape[d] > 1 and (t.strides[d] * item) % 16 != 0)
    if t.ptr % 16 or bad:
        raise ValueError(
            f"{name} must start on a 16-byte boundary with rows 16-byte aligned (the kernels read 16-byte vectors) "
            f"but starts at 0x{t.ptr:x} with strides {t.strides} (elements); pass a contiguous copy of {name}"
        )
