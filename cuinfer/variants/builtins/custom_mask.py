"""A custom boolean mask per request: its row-major ``[qo_len, kv_len]`` bits (True = keep), little-endian within
each byte, request b's bits starting at byte ``mask_indptr[b]`` of ``mask`` (``segment_packbits``). Applied on every
tile."""

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

CUSTOM_MASK = register(
    Variant(
        name="custom_mask",
        mask="""
const long long bit = static_cast<long long>(static_cast<const int*>(params.mask_indptr)[batch]) * 8 +
                      static_cast<long long>(qo_idx) * kv_len + kv_idx;
return (__ldg(static_cast<const unsigned char*>(params.mask) + (bit >> 3)) >> (bit & 7)) & 1;
""",
        params=(Param("mask", "ptr"), Param("mask_indptr", "ptr")),
        doc=__doc__,
    )
)


def values(mask_ptr: int, mask_indptr_ptr: int) -> dict:
    return {"mask": int(mask_ptr), "mask_indptr": int(mask_indptr_ptr)}
