"""FlashInfer's ``single_prefill_with_kv_cache`` (and its ``_return_lse`` partial) over ``cuinfer.single_prefill``."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from cuinfer.compat.flashinfer import common
from cuinfer.formats.mask import host_array
from cuinfer.interop import as_dtype
from cuinfer.prefill import single_prefill

_FP8_SCALES = (
    "per-head fp8 scales are not routed by the drop-in yet; call cuinfer.single_prefill with an fp8 k / v and "
    "k_scale / v_scale (docs/fp8.md), or use float16 / bfloat16 q, k, v"
)


def single_prefill_with_kv_cache(
    q: Any,
    k: Any,
    v: Any,
    scale_q: Any = None,
    scale_k: Any = None,
    scale_v: Any = None,
    o_dtype: Any = None,
    custom_mask: Any = None,
    packed_custom_mask: Any = None,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_fp16_qk_reduction: bool = False,
    sm_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    backend: str = "auto",
    return_lse: bool = False,
    kv_cache_sf: Any = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> Any:
    """FlashInfer's single-request prefill: ``q [qo_len, num_qo_heads, head_dim_qk]``, ``k`` / ``v`` ``[kv_len,
    num_kv_heads, head_dim]`` (NHD) -> ``o [qo_len, num_qo_heads, head_dim_vo]`` (, lse base 2 ``[qo_len,
    num_qo_heads]``). ``custom_mask`` is ``[qo_len, kv_len]`` bool (or ``packed_custom_mask``, FlashInfer's
    ``packbits(mask.view(-1), 'little')``) and replaces ``causal``, as in FlashInfer. ``k_scale`` multiplies
    ``sm_scale`` and ``v_scale`` the output."""
    common.backend(backend)
    common.refuse(
        scale_q=(scale_q, scale_q is not None, _FP8_SCALES), scale_k=(scale_k, scale_k is not None, _FP8_SCALES),
        scale_v=(scale_v, scale_v is not None, _FP8_SCALES),
        kv_cache_sf=(kv_cache_sf, kv_cache_sf is not None, common.NO_NVFP4),
        use_fp16_qk_reduction=(use_fp16_qk_reduction, bool(use_fp16_qk_reduction),
                               "cuinfer accumulates q·k in float32; leave it False"),
        o_dtype=(o_dtype, o_dtype is not None and as_dtype(common.data_type(o_dtype)) is not as_dtype(q.dtype),
                 "single_prefill returns q's dtype; for another output dtype use "
                 "BatchPrefillWithRaggedKVCacheWrapper with o_data_type"),
    )  # fmt: skip
    opts = common.attention_options(locals(), q.shape[-2])
    if k_scale is not None:
        scale = opts["sm_scale"]
        opts["sm_scale"] = (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale) * common.scalar(k_scale)
    layout = common.kv_layout(kv_layout)
    mask = custom_mask
    if packed_custom_mask is not None:  # (FlashInfer uses the packed form when both are given)
        kv_len = k.shape[0] if layout == "NHD" else k.shape[1]
        bits = np.unpackbits(np.asarray(host_array(packed_custom_mask, "packed_custom_mask"), np.uint8),
                             bitorder="little")  # fmt: skip
        if bits.shape[0] < q.shape[0] * kv_len:
            raise ValueError(
                f"packed_custom_mask holds {bits.shape[0]} bits but the mask needs qo_len * kv_len = "
                f"{q.shape[0] * kv_len}; pack the flat [qo_len, kv_len] bool mask with bitorder='little'"
            )
        mask = bits[: q.shape[0] * kv_len].astype(bool).reshape(q.shape[0], kv_len)
    result = single_prefill(
        q, k, v, causal=bool(causal) and mask is None, custom_mask=mask, kv_layout=layout, return_lse=return_lse,
        **opts,
    )  # fmt: skip
    if not return_lse:
        return common.scale_output(result, v_scale)
    return common.scale_output(result[0], v_scale), result[1]


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache, return_lse=True)
single_prefill_with_kv_cache_return_lse.__doc__ = (
    "``single_prefill_with_kv_cache(..., return_lse=True)``: returns ``(o, lse)``, lse base 2."
)
