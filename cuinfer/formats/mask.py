"""Custom masks of a batch: the flat bool form (each request's row-major ``[qo_len, kv_len]`` block, concatenated)
or FlashInfer's bit-packed form, as the packed bytes and byte offsets the kernels read."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.interop.arrays import as_tensor


def custom_mask_bytes(
    custom_mask: Any, packed_custom_mask: Any, qo_lens: np.ndarray, kv_lens: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(packed bytes, byte indptr) of a batch mask, or (None, None). The flat bool form is packed here."""
    if custom_mask is None and packed_custom_mask is None:
        return None, None
    if custom_mask is not None and packed_custom_mask is not None:
        raise ValueError(
            "custom_mask and packed_custom_mask were both given; pass one (packed_custom_mask is "
            "segment_packbits(custom_mask, ...) with bitorder='little')"
        )
    bits = qo_lens.astype(np.int64) * kv_lens.astype(np.int64)
    indptr = np.zeros(bits.shape[0] + 1, dtype=np.int64)
    np.cumsum((bits + 7) // 8, out=indptr[1:])
    if custom_mask is not None:
        m = bool_mask(host_array(custom_mask, "custom_mask"), "custom_mask").reshape(-1)
        if m.shape[0] != int(bits.sum()):
            raise ValueError(
                f"custom_mask must hold sum(qo_len * kv_len) = {int(bits.sum())} entries (each request's row-major "
                f"[qo_len, kv_len] block, concatenated) but has {m.shape[0]}"
            )
        bit_indptr = np.zeros(bits.shape[0] + 1, dtype=np.int64)
        np.cumsum(bits, out=bit_indptr[1:])
        packed, _ = reference.segment_packbits(m, bit_indptr, bitorder="little")
    else:
        packed = np.asarray(host_array(packed_custom_mask, "packed_custom_mask"))
        if packed.ndim != 1 or packed.dtype != np.uint8 or packed.shape[0] != int(indptr[-1]):
            raise ValueError(
                f"packed_custom_mask must be 1-D uint8 with {int(indptr[-1])} bytes (each request's bits padded to a "
                f"byte, as segment_packbits(..., bitorder='little') returns) but has shape {packed.shape}, dtype "
                f"{packed.dtype}"
            )
    if indptr[-1] > np.iinfo(np.int32).max // 8:
        raise ValueError(f"custom masks above {np.iinfo(np.int32).max // 8} bytes are not supported")
    return np.ascontiguousarray(packed, dtype=np.uint8), indptr.astype(np.int32)


def bool_mask(m: np.ndarray, name: str) -> np.ndarray:
    """A custom mask as bool (True = keep): bool, or integers that are all 0 or 1 (a list of 0/1, say). Anything else
    is refused rather than cast: ``[0, 2, 0, 5]`` or a float mask is more likely a mistake (token ids, an additive
    -inf mask) than a mask. FlashInfer takes bool."""
    m = np.asarray(m)
    if m.dtype == np.bool_:
        return m
    if m.size == 0:
        return m.astype(bool)
    if m.dtype.kind in "iu":
        bad = np.flatnonzero((m.reshape(-1) != 0) & (m.reshape(-1) != 1))
        if not bad.size:
            return m.astype(bool)
        i = int(bad[0])
        raise ValueError(
            f"{name} must hold bools (True = keep) or the integers 0 and 1 but its entry {i} (flat) is "
            f"{m.reshape(-1)[i]}; pass ({name} != 0) if nonzero means keep"
        )
    raise ValueError(
        f"{name} must have dtype bool (True = keep; integers 0 / 1 are taken too) but has dtype {m.dtype}; pass "
        f"({name} != 0) if nonzero means keep, or ({name} == 0) for an additive mask of 0 / -inf"
    )


def host_array(x: Any, name: str) -> np.ndarray:
    """A mask given as NumPy, list, host tensor or device array (one device-to-host copy) -> NumPy."""
    if isinstance(x, (np.ndarray, list, tuple)):
        return np.asarray(x)
    t = as_tensor(x, name)
    if not t.is_cuda:
        return t.numpy()
    if t.framework == "torch":
        return x.detach().cpu().numpy()
    if t.framework == "cupy":
        return x.get()
    return np.asarray(x)
