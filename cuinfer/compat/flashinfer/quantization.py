"""FlashInfer's mask packing: ``packbits`` and ``segment_packbits``, with FlashInfer's default ``bitorder="big"``
(the attention masks of ``plan()`` are packed with ``bitorder="little"``). They call cuinfer's functions of the same
name once cuinfer has them; until then NumPy inputs run ``cuinfer.reference`` and GPU arrays raise
``NotImplementedError``."""

from __future__ import annotations

from typing import Any

from cuinfer.compat.flashinfer import common

__all__ = ["packbits", "segment_packbits"]


def packbits(x: Any, bitorder: str = "big") -> Any:
    """Pack a 1-D binary array into uint8 ``[ceil(n / 8)]``, as ``numpy.packbits``."""
    return common.utility("packbits", x)(x, bitorder=bitorder)


def segment_packbits(x: Any, indptr: Any, bitorder: str = "big") -> tuple[Any, Any]:
    """Pack each segment ``x[indptr[i]:indptr[i+1]]`` separately, padded to a byte -> ``(packed, new_indptr)``."""
    return common.utility("segment_packbits", x)(x, indptr, bitorder=bitorder)
