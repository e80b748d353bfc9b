"""``single_decode``: one query token against one request's K and V, on the kernels of ``BatchDecode``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cuinfer import reference
from cuinfer.decode.plan import check_decode_options
from cuinfer.decode.wrapper import BatchDecode
from cuinfer.formats.kv import KV, check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.interop.dtypes import DType
from cuinfer.runtime.calls import begin, is_host
from cuinfer.runtime.fp8 import check_scales, kv_dtype_of, reference_scales
from cuinfer.runtime.options import kv_layout_name
from cuinfer.runtime.outputs import host_outputs
from cuinfer.variants.select import chain_for, refuse_user_variants_on_host, user_variants

_single_wrappers: dict = {}  # (device, layout) -> BatchDecode reused across calls


def single_decode(
    q: Any, k: Any, v: Any, *, kv_layout: str = "NHD", sm_scale: float | None = None, logits_soft_cap: float = 0.0,
    window_left: int = -1, pos_encoding: str = "none", rope_scale: float = 1.0, rope_theta: float = 1e4,
    variant: Any = None, variant_params: dict | None = None, return_lse: bool = False, kv_dtype: Any = None,
    k_scale: Any = None, v_scale: Any = None,
) -> Any:  # fmt: skip
    """Decode one query token ``q [num_qo_heads, head_dim]`` against ``k``, ``v`` (``[kv_len, num_kv_heads,
    head_dim]`` NHD or ``[num_kv_heads, kv_len, head_dim]`` HND) -> ``o [num_qo_heads, head_dim]`` (, ``lse``).

    The same kernels as ``BatchDecode``: the request is one page of ``kv_len`` tokens, split over the GPU by the
    planner when it is long. fp8 ``k`` / ``v``: ``k_scale`` / ``v_scale`` dequantise them (as ``BatchDecode.run``);
    ``kv_dtype`` names the fp8 format of ``uint8`` arrays (CuPy's fp8).
    """
    layout = kv_layout_name(kv_layout)
    opts_kw = dict(
        sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left, pos_encoding=pos_encoding,
        rope_scale=rope_scale, rope_theta=rope_theta, variant=variant,
    )  # fmt: skip
    if is_host(q):
        tq, tk, tv = as_tensor(q, "q"), as_tensor(k, "k"), as_tensor(v, "v")
        tk, tv = _as_kv_dtype(tk, tv, kv_dtype)
        _check_single(tq, tk, tv, layout)
        hkv = tk.shape[1] if layout == "NHD" else tk.shape[0]
        scales = reference_scales(check_scales(tk.dtype, k_scale, v_scale, num_kv_heads=hkv, gpu=False))
        kn, vn = tk.numpy(), tv.numpy()
        if layout == "HND":
            kn, vn = kn.transpose(1, 0, 2), vn.transpose(1, 0, 2)
        opts = check_decode_options(head_dim=tq.shape[1], **opts_kw)
        refuse_user_variants_on_host(chain_for(opts, decode=True, user=user_variants(variant)))
        o, lse = reference.attention(tq.numpy()[None], kn, vn, **opts.reference_kwargs(), **scales)
        return host_outputs(o[0], lse[0], tq.dtype, None, None, return_lse)
    call, tq = begin(q, "q")
    tk, tv = _as_kv_dtype(call.tensor(k, "k"), call.tensor(v, "v"), kv_dtype)
    _check_single(tq, tk, tv, layout)
    hq, d = tq.shape
    (kv_len, hkv) = (tk.shape[0], tk.shape[1]) if layout == "NHD" else (tk.shape[1], tk.shape[0])
    check_aligned("q", tq, (0,))
    for name, t in (("k", tk), ("v", tv)):
        check_aligned(name, t, (0, 1))
    slot, head = (0, 1) if layout == "NHD" else (1, 0)
    kv = KV(
        tk, tv, tk.ptr, tv.ptr, (0, tk.strides[slot], tk.strides[head]), (0, tv.strides[slot], tv.strides[head]),
        1, max(kv_len, 1), hkv, d,
    )  # fmt: skip
    w = _single_wrappers.get((call.device_id, layout))
    if w is None:
        w = _single_wrappers[(call.device_id, layout)] = BatchDecode(kv_layout=layout, device=call.device_id)
    pages = 1 if kv_len else 0
    w.plan(
        [0, pages], [0] * pages, [max(kv_len, 1)], num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
        page_size=max(kv_len, 1), q_dtype=tq.dtype, kv_dtype=tk.dtype, variant_params=variant_params, **opts_kw,
    )  # fmt: skip
    plan = w._plan
    # The kernels see the request as a batch of one: 3-D views with a batch stride of 0 (nothing is copied).
    q3 = replace(tq, shape=(1, hq, d), strides=(0,) + tq.strides)
    to = call.empty((hq, d), plan.o_dtype)
    tl = call.empty((hq,), DType.FLOAT32) if return_lse else None
    o3 = replace(to, shape=(1, hq, d), strides=(0,) + to.strides)
    l3 = None if tl is None else replace(tl, shape=(1, hq), strides=(0,) + tl.strides)
    w._enqueue(call, plan, q3, kv, o3, l3, k_scale, v_scale)  # (a fresh plan: its words are uploaded)
    return (call.give(to), call.give(tl)) if return_lse else call.give(to)


def _as_kv_dtype(tk: Tensor, tv: Tensor, kv_dtype: Any) -> tuple[Tensor, Tensor]:
    """k and v as ``kv_dtype`` (None: their own): uint8 arrays read as the fp8 format it names."""
    if kv_dtype is None:
        return tk, tv
    want = kv_dtype_of(kv_dtype)
    out = []
    for name, t in (("k", tk), ("v", tv)):
        if t.dtype is DType.UINT8 and want.is_float8:
            t = t.reinterpret(want)
        elif t.dtype is not want:
            raise ValueError(f"{name} has dtype {t.dtype.value} but kv_dtype={want.value} was given; cast {name}")
        out.append(t)
    return out[0], out[1]


def _check_single(tq: Tensor, tk: Tensor, tv: Tensor, layout: str) -> None:
    validate.check_ndim("q", tq, 2, hint="single_decode takes q [num_qo_heads, head_dim]")
    expect = "[kv_len, num_kv_heads, head_dim]" if layout == "NHD" else "[num_kv_heads, kv_len, head_dim]"
    validate.check_ndim("k", tk, 3, hint=f"k is {expect} ({layout})")
    validate.check_shape("v", tv, tk.shape, hint="it must match k")
    hkv = tk.shape[1] if layout == "NHD" else tk.shape[0]
    if tk.shape[2] != tq.shape[1]:
        raise ValueError(f"q and k must share head_dim but have shapes {tq.shape} and {tk.shape}")
    if tq.shape[0] % hkv:
        raise ValueError(
            f"num_qo_heads ({tq.shape[0]}) must be a multiple of num_kv_heads ({hkv}) for grouped-query attention; "
            "query head h reads kv head h // (num_qo_heads // num_kv_heads)"
        )
    validate.check_same_dtype(("k", "v"), (tk, tv))
