"""Bit-packed custom masks on the CPU: packbits / segment_packbits (FlashInfer semantics) and their inverse.

A batch's custom mask is the concatenation of each request's row-major [qo_len, kv_len] bool mask. Packed, each
request's segment is packed separately and padded to a whole byte, so request b starts at byte new_indptr[b].
The contract's default bit order is "little" (bit k of a byte is element 8·i + k), the order the kernels read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.reference.util import as_indptr

_BITORDERS = ("big", "little")


def _bitorder(bitorder: str) -> str:
    if bitorder not in _BITORDERS:
        raise ValueError(f"bitorder must be one of {_BITORDERS} but is {bitorder!r}")
    return bitorder


def packbits(x: Any, bitorder: str = "little") -> np.ndarray:
    """Pack a binary array (flattened row-major, nonzero = 1) into uint8 [ceil(n / 8)], as numpy.packbits."""
    return np.packbits(np.asarray(x).astype(bool).ravel(), bitorder=_bitorder(bitorder))


def segment_packbits(x: Any, indptr: Any, bitorder: str = "little") -> tuple[np.ndarray, np.ndarray]:
    """Pack each segment x[indptr[i]:indptr[i+1]] separately, padded to a byte.

    Returns (packed uint8 [new_indptr[-1]], new_indptr int32 [B+1]) with new_indptr[i+1] - new_indptr[i] =
    ceil(segment_len_i / 8).
    """
    bits = np.asarray(x).astype(bool)
    if bits.ndim != 1:
        raise ValueError(f"x must be 1-D (one flat bool array for the whole batch) but has shape {bits.shape}")
    ind = as_indptr(indptr, "indptr", total=bits.shape[0])
    order = _bitorder(bitorder)
    seg_bytes = (np.diff(ind) + 7) // 8
    new_indptr = np.concatenate([[0], np.cumsum(seg_bytes)]).astype(np.int32)
    parts = [np.packbits(bits[ind[i] : ind[i + 1]], bitorder=order) for i in range(ind.shape[0] - 1)]
    packed = np.concatenate(parts).astype(np.uint8) if parts else np.empty(0, np.uint8)
    return packed, new_indptr


def unpack_custom_mask(packed: Any, qo_indptr: Any, kv_indptr: Any, *, bitorder: str = "little") -> np.ndarray:
    """Inverse of segment_packbits for a batch mask: the flat bool mask, request b being [qo_len_b, kv_len_b].

    qo_indptr and kv_indptr are token-level (for a paged cache, the kv_indptr_tokens of paged_kv_to_ragged).
    """
    qo = as_indptr(qo_indptr, "qo_indptr")
    kv = as_indptr(kv_indptr, "kv_indptr")
    if qo.shape != kv.shape:
        raise ValueError(f"qo_indptr and kv_indptr must have the same length but have {qo.shape[0]}, {kv.shape[0]}")
    seg_bits = np.diff(qo) * np.diff(kv)
    seg_bytes = (seg_bits + 7) // 8
    data = np.asarray(packed)
    if data.ndim != 1 or data.dtype != np.uint8 or data.shape[0] != int(seg_bytes.sum()):
        raise ValueError(
            f"packed must be 1-D uint8 with {int(seg_bytes.sum())} bytes (one byte-padded segment per request) but "
            f"has shape {data.shape}, dtype {data.dtype}"
        )
    order = _bitorder(bitorder)
    starts = np.concatenate([[0], np.cumsum(seg_bytes)])
    parts = [
        np.unpackbits(data[starts[b] : starts[b + 1]], count=int(seg_bits[b]), bitorder=order).astype(bool)
        for b in range(seg_bits.shape[0])
    ]
    return np.concatenate(parts) if parts else np.empty(0, bool)
