"""``single_decode``: one query token against one request's K and V, on the kernels of ``BatchDecode``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cuinfer import reference
from cuinfer.decode.wrapper import BatchDecode
from cuinfer.formats.kv import KV, check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType
from cuinfer.reference import variants as ref_variants
from cuinfer.runtime.calls import start
from cuinfer.runtime.fp8 import check_scale_args, check_scales, kv_dtype_of, reference_scales
from cuinfer.runtime.options import INT32_MAX, kv_layout_name
from cuinfer.runtime.outputs import PLANNABLE, host_outputs
from cuinfer.runtime.wrapper import array_counts
from cuinfer.variants import host as variant_host
from cuinfer.variants.arrays import device_arrays, host_arrays

_single_wrappers: dict = {}  # (device or None for the CPU reference, layout) -> BatchDecode reused across calls


def single_decode(
    q: Any, k: Any, v: Any, *, kv_layout: str = "NHD", sm_scale: float | None = None, logits_soft_cap: float = 0.0,
    window_left: int = -1, pos_encoding: str = "none", rope_scale: float = 1.0, rope_theta: float = 1e4,
    variant: Any = None, variant_params: dict | None = None, variant_arrays: dict | None = None,
    return_lse: bool = False, kv_dtype: Any = None, k_scale: Any = None, v_scale: Any = None,
) -> Any:  # fmt: skip
    """Decode one query token ``q [num_qo_heads, head_dim]`` against ``k``, ``v`` (``[kv_len, num_kv_heads,
    head_dim]`` NHD or ``[num_kv_heads, kv_len, head_dim]`` HND) -> ``o [num_qo_heads, head_dim]`` (, ``lse``).

    The same kernels as ``BatchDecode``: the request is one page of ``kv_len`` tokens, split over the GPU by the
    planner when it is long. NumPy inputs take the same checks and the same plan() (so they raise exactly when GPU
    arrays would), then the float64 CPU reference. ``variant_arrays``: the array parameters of the variants
    (``BatchDecode.run``). fp8 ``k`` / ``v``: ``k_scale`` / ``v_scale`` dequantise them (as ``BatchDecode.run``, which
    also takes numbers with 16-bit ``k`` / ``v``); ``kv_dtype`` names the fp8 format of ``uint8`` arrays (CuPy's fp8).
    """
    layout = kv_layout_name(kv_layout)
    call, tq = start(q, "q")
    tk, tv = _as_kv_dtype(call.tensor(k, "k"), call.tensor(v, "v"), kv_dtype)
    _check_single(tq, tk, tv, layout)
    hq, d = tq.shape
    (kv_len, hkv) = (tk.shape[0], tk.shape[1]) if layout == "NHD" else (tk.shape[1], tk.shape[0])
    check_aligned("q", tq, (0,))
    for name, t in (("k", tk), ("v", tv)):
        check_aligned(name, t, (0, 1))
    w = _single_wrappers.get((call.device_id, layout))
    if w is None:
        w = _single_wrappers[(call.device_id, layout)] = BatchDecode(kv_layout=layout, device=call.device_id)
        if call.is_host:
            w._device_id = None  # (host-only plans: the CPU reference never touches a GPU)
    pages = 1 if kv_len else 0
    w.plan(
        [0, pages], [0] * pages, [max(kv_len, 1)], num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
        page_size=max(kv_len, 1), q_dtype=tq.dtype, kv_dtype=tk.dtype, sm_scale=sm_scale,
        logits_soft_cap=logits_soft_cap, window_left=window_left, pos_encoding=pos_encoding, rope_scale=rope_scale,
        rope_theta=rope_theta, variant=variant, variant_params=variant_params,
    )  # fmt: skip
    plan = w._plan
    if k_scale is not None or v_scale is not None:
        check_scale_args(plan.kv_dtype, k_scale, v_scale, numbers_16bit=True)
    if call.is_host:
        arrays = host_arrays(plan.variant, variant_arrays, array_counts(plan))
    elif variant_arrays is not None or plan.variant.array_params:
        call.variant_arrays = device_arrays(plan.variant, variant_arrays, array_counts(plan), call)
    to = call.empty((hq, d), plan.o_dtype)
    tl = call.empty((hq,), DType.FLOAT32) if return_lse else None
    if call.is_host:
        variant_host.check_numpy(plan.variant)
        scales = reference_scales(
            check_scales(plan.kv_dtype, k_scale, v_scale, num_kv_heads=hkv, gpu=False, numbers_16bit=True)
        )
        kn, vn = tk.numpy(), tv.numpy()
        if layout == "HND":
            kn, vn = kn.transpose(1, 0, 2), vn.transpose(1, 0, 2)
        if variant_host.needs_steps(plan.variant):
            steps = variant_host.steps(
                plan.variant, plan.options, num_qo_heads=hq, user_values=plan.variant_values, arrays=arrays
            )
            o, lse = ref_variants.attend(tq.numpy()[None], kn, vn, steps, sm_scale=plan.options.sm_scale, **scales)
        else:
            o, lse = reference.attention(tq.numpy()[None], kn, vn, **plan.options.reference_kwargs(), **scales)
        return host_outputs(o[0], lse[0], to, tl)
    slot, head = (0, 1) if layout == "NHD" else (1, 0)
    kv = KV(
        tk, tv, tk.ptr, tv.ptr, (0, tk.strides[slot], tk.strides[head]), (0, tv.strides[slot], tv.strides[head]),
        1, max(kv_len, 1), hkv, d,
    )  # fmt: skip
    # The kernels see the request as a batch of one: 3-D views with a batch stride of 0 (nothing is copied).
    q3 = replace(tq, shape=(1, hq, d), strides=(0,) + tq.strides)
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
    """What single_decode checks on both routes before its plan() checks the rest (head dim, options)."""
    validate.check_ndim("q", tq, 2, hint="single_decode takes q [num_qo_heads, head_dim]")
    expect = "[kv_len, num_kv_heads, head_dim]" if layout == "NHD" else "[num_kv_heads, kv_len, head_dim]"
    validate.check_ndim("k", tk, 3, hint=f"k is {expect} ({layout})")
    validate.check_shape("v", tv, tk.shape, hint="it must match k")
    validate.check_same_device(("q", "k", "v"), (tq, tk, tv))
    # q float16 or bfloat16, k/v float16, bfloat16 or fp8 (decode takes a kv dtype other than q's, as plan() does)
    validate.check_dtype("q", tq, PLANNABLE)
    if not tk.dtype.is_float8:
        validate.check_dtype(
            "k", tk, PLANNABLE, hint="(or an fp8 k / v; uint8 arrays with kv_dtype='float8_e4m3fn' or 'float8_e5m2')"
        )
    validate.check_same_dtype(("k", "v"), (tk, tv))
    kv_len, hkv = (tk.shape[0], tk.shape[1]) if layout == "NHD" else (tk.shape[1], tk.shape[0])
    if tk.shape[2] != tq.shape[1]:
        raise ValueError(f"q and k must share head_dim but have shapes {tq.shape} and {tk.shape}")
    if hkv == 0 or tq.shape[0] % hkv:
        raise ValueError(
            f"num_qo_heads ({tq.shape[0]}) must be a multiple of num_kv_heads ({hkv}) for grouped-query attention; "
            "query head h reads kv head h // (num_qo_heads // num_kv_heads)"
        )
    if kv_len > INT32_MAX:
        raise ValueError(
            f"k must hold at most {INT32_MAX} tokens (the kernels count a request's keys in int32) but holds {kv_len}"
        )
