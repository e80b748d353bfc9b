"""FlashInfer's mask packing: ``packbits`` and ``segment_packbits`` over cuinfer's (``cuinfer/utils/bits.py``), with
FlashInfer's default ``bitorder="big"`` (cuinfer's own functions default to ``"little"``, the order the attention
masks of ``plan()`` are read in)."""

from __future__ import annotations

from typing import Any

import cuinfer

__all__ = ["packbits", "segment_packbits"]


def packbits(x: Any, bitorder: str = "big") -> Any:
    """Pack a 1-D binary array into uint8 ``[ceil(n / 8)]``, as ``numpy.packbits``. As FlashInfer, ``x`` of any
    dtype is read as ``x != 0``."""
    dtype = getattr(x, "dtype", None)
    if dtype is not None and "bool" not in str(dtype):
        x = x != 0  # (FlashInfer's x.to(torch.bool); the comparison works in every framework)
    return cuinfer.packbits(x, bitorder=bitorder)


def segment_packbits(x: Any, indptr: Any, bitorder: str = "big") -> tuple[Any, Any]:
    """Pack each segment ``x[indptr[i]:indptr[i+1]]`` (``x`` bool) separately, padded to a byte ->
    ``(packed, new_indptr)``."""
    return cuinfer.segment_packbits(x, indptr, bitorder=bitorder)
