"""Bit packing of boolean masks (``packbits``, ``segment_packbits``), FlashInfer's functions with numpy.packbits'
bit orders: ``"little"`` (the default here, the order cuinfer's kernels read custom masks in: bit k of byte i is
element 8i + k) or ``"big"`` (element 8i + 7 - k, numpy.packbits' default).

GPU arrays run ``kernel_src/utility/packbits.cu``; NumPy arrays the reference (``cuinfer.reference``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.interop.dtypes import DType
from cuinfer.runtime.calls import begin
from cuinfer.utils import specs as S
from cuinfer.utils.launch import Launch, blocks, check_index, sm_count, upload

_BITORDERS = ("little", "big")


def _check_bitorder(bitorder: Any) -> str:
    if bitorder not in _BITORDERS:
        raise ValueError(f"bitorder must be 'little' or 'big' but is {bitorder!r}; 'little' is what cuinfer reads")
    return bitorder


def _check_bits(t: Tensor, *, flat: bool) -> None:
    if flat:
        validate.check_ndim("x", t, 1, hint="one flat bool array: the segments of all requests, concatenated")
    validate.check_dtype("x", t, (DType.BOOL,))
    if not t.is_contiguous:
        raise ValueError(
            f"x must be contiguous (it is packed in row-major order) but has strides {t.strides}; pass "
            f"{validate.contiguous_fix('x', t.framework)}"
        )


def pack_launch(kind: str, bitorder: str, x: Tensor, out: Tensor, indptr: Tensor | None, new_indptr: Tensor | None,
                out_bytes: int, sms: int, chunk_ptr: Tensor | None = None, items: int = 0) -> Launch:  # fmt: skip
    """A packbits launch, or a segment_packbits one (``chunk_ptr``: the first work item of each segment, ``items``
    work items of up to 512 output bytes in all)."""
    segments = 0 if indptr is None else indptr.shape[0] - 1
    params = S.PackParams.pack(
        x=x.ptr, out=out.ptr, indptr=0 if indptr is None else indptr.ptr,
        new_indptr=0 if new_indptr is None else new_indptr.ptr, chunk_ptr=0 if chunk_ptr is None else chunk_ptr.ptr,
        n=x.size, num_segments=segments,
    )  # fmt: skip
    if kind == "segment_packbits":  # a warp per work item, 4 resident blocks per SM (launch bounds)
        grid = blocks(-(-items // (S.PACK_THREADS // 32)), sms, 4)
    elif x.ptr % 16 == 0:  # a warp per 4096 elements (the < 512 bytes left: same grid)
        grid = blocks(-(-x.size // (S.PACK_WARP_ELEMS * S.PACK_THREADS // 32)), sms, 8)
    else:  # a thread per output byte
        grid = blocks(-(-out_bytes // S.PACK_THREADS), sms, 8)
    return Launch(S.pack_spec(), S.pack_instance(kind, bitorder), (grid,), (S.PACK_THREADS,), params)


def _part(t: Tensor, start: int, n: int) -> Tensor:
    """Entries start .. start + n of a 1-D device array: a view (its user object sliced the same way)."""
    return replace(t, ptr=t.ptr + start * t.dtype.itemsize, shape=(n,), obj=t.obj[start : start + n])


def segment_chunks(new_indptr: np.ndarray) -> np.ndarray:
    """int32 ``[num_segments + 1]``: the first work item (512 output bytes of one segment) of each segment."""
    per = (np.diff(new_indptr.astype(np.int64)) + S.PACK_ITEM_BYTES - 1) // S.PACK_ITEM_BYTES
    return np.concatenate([[0], np.cumsum(per)]).astype(np.int32)


def packbits(x: Any, bitorder: str = "little") -> Any:
    """Pack a bool array (flattened row-major) into uint8 ``[ceil(n / 8)]``, 8 elements a byte, as
    ``numpy.packbits(x, bitorder=bitorder)``."""
    order = _check_bitorder(bitorder)
    if isinstance(x, np.ndarray):
        _check_bits(as_tensor(x, "x"), flat=False)
        return reference.packbits(x, bitorder=order)
    call, tx = begin(x, "x")
    _check_bits(tx, flat=False)
    out_bytes = (tx.size + 7) // 8
    out = call.empty((out_bytes,), DType.UINT8)
    if out_bytes:
        pack_launch("packbits", order, tx, out, None, None, out_bytes, sm_count(call.device_id)).run(
            call.device_id, call.stream
        )
    return call.give(out)


def segment_packbits(x: Any, indptr: Any, bitorder: str = "little") -> tuple[Any, Any]:
    """Pack each segment ``x[indptr[i]:indptr[i+1]]`` separately, padded to a whole byte. Returns ``(packed uint8
    [new_indptr[-1]], new_indptr int32 [len(indptr)])`` with ``new_indptr[i+1] - new_indptr[i] = ceil(segment_i / 8)``.

    The output size depends on ``indptr``'s values, so for a GPU ``indptr`` the host reads it once (a blocking
    device-to-host copy, as FlashInfer's ``.item()``); ``new_indptr`` is computed there and copied back (with the
    kernel's work list, in one upload: the returned ``new_indptr`` is a view of that buffer).
    """
    order = _check_bitorder(bitorder)
    host = isinstance(x, np.ndarray)
    if host:
        tx, ti = as_tensor(x, "x"), as_tensor(indptr, "indptr")
    else:
        call, tx = begin(x, "x")
        ti = call.tensor(indptr, "indptr")
    _check_bits(tx, flat=True)
    check_index("indptr", ti, hint="it is [num_segments + 1]")
    validate.check_same_device(("x", "indptr"), (tx, ti))
    if ti.shape[0] < 1:
        raise ValueError("indptr must have num_segments + 1 >= 1 entries but is empty; pass [0] for no segment")
    values = validate.check_indptr("indptr", indptr, hint="segment i is x[indptr[i]:indptr[i+1]]")
    if values[-1] > tx.shape[0]:
        raise ValueError(
            f"indptr must end at most at len(x) = {tx.shape[0]} but ends at {values[-1]}; segment i is "
            "x[indptr[i]:indptr[i+1]]"
        )
    if host:
        return reference.segment_packbits(x, indptr, bitorder=order)
    new_indptr = np.concatenate([[0], np.cumsum((np.diff(values.astype(np.int64)) + 7) // 8)]).astype(np.int32)
    chunks = segment_chunks(new_indptr)
    # one upload (each is a synchronising copy from pageable memory): new_indptr, the work items' chunk_ptr and, for
    # an int64 indptr, its int32 values (the kernel reads int32; the values are on the host already)
    wide = ti.dtype is not DType.INT32
    m = new_indptr.shape[0]
    both = upload(call, np.concatenate([new_indptr, chunks, *([values] if wide else [])]), DType.INT32)
    new, tc = _part(both, 0, m), _part(both, m, m)
    if wide:
        ti = _part(both, 2 * m, m)
    out_bytes = int(new_indptr[-1])
    out = call.empty((out_bytes,), DType.UINT8)
    if out_bytes:
        launch = pack_launch(
            "segment_packbits", order, tx, out, ti, new, out_bytes, sm_count(call.device_id), tc, int(chunks[-1])
        )
        launch.run(call.device_id, call.stream)
    return call.give(out), call.give(new)


__all__ = ["packbits", "segment_packbits"]
