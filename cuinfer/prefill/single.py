"""``single_prefill``: one request's prefill, on the kernel of ``BatchPrefill(paged=False)``."""

from __future__ import annotations

from typing import Any

from cuinfer.formats.mask import bool_mask, host_array
from cuinfer.interop import validate
from cuinfer.prefill.wrapper import BatchPrefill
from cuinfer.runtime.calls import start
from cuinfer.runtime.fp8 import as_kv_dtype, kv_dtype_of
from cuinfer.runtime.options import kv_layout_name
from cuinfer.runtime.outputs import PLANNABLE

_single_wrappers: dict = {}  # (device or None for the CPU reference, layout) -> BatchPrefill reused across calls


def single_prefill(
    q: Any, k: Any, v: Any, *, causal: bool = False, custom_mask: Any = None, kv_layout: str = "NHD",
    sm_scale: float | None = None, logits_soft_cap: float = 0.0, window_left: int = -1, pos_encoding: str = "none",
    rope_scale: float = 1.0, rope_theta: float = 1e4, variant: Any = None, variant_params: dict | None = None,
    variant_arrays: dict | None = None, return_lse: bool = False, kv_dtype: Any = None, k_scale: Any = None,
    v_scale: Any = None,
) -> Any:  # fmt: skip
    """Prefill one request: ``q [qo_len, num_qo_heads, head_dim]`` against ``k``, ``v`` (``[kv_len, num_kv_heads,
    head_dim]`` NHD or ``[num_kv_heads, kv_len, head_dim]`` HND) -> ``o [qo_len, num_qo_heads, head_dim_vo]``
    (, ``lse [qo_len, num_qo_heads]``). ``custom_mask``: bool ``[qo_len, kv_len]``, True = keep (integers 0 / 1 are
    taken too).

    The same kernel as ``BatchPrefill(paged=False)``, a batch of one request (split over the GPU by the planner).
    NumPy inputs take the same checks, plan() and run() (so they raise exactly when GPU arrays would), then the
    float64 CPU reference. ``variant_arrays``: the array parameters of the variants (``BatchPrefill.run``). fp8 ``k``
    / ``v``: ``k_scale`` / ``v_scale`` dequantise them; ``kv_dtype`` names the fp8 format of ``uint8`` arrays (CuPy's
    fp8).
    """
    layout = kv_layout_name(kv_layout)
    call, tq = start(q, "q")
    kvd = None if kv_dtype is None else kv_dtype_of(kv_dtype)
    tk, tv = call.tensor(k, "k"), call.tensor(v, "v")
    if kvd is not None:  # (uint8 arrays, CuPy's fp8, read as the format kv_dtype names)
        tk, tv = as_kv_dtype(tk, kvd, "k"), as_kv_dtype(tv, kvd, "v")
    validate.check_ndim("q", tq, 3, hint="single_prefill takes q [qo_len, num_qo_heads, head_dim]")
    desc = "[kv_len, num_kv_heads, head_dim]" if layout == "NHD" else "[num_kv_heads, kv_len, head_dim]"
    validate.check_ndim("k", tk, 3, hint=f"k is {desc} ({layout})")
    validate.check_ndim("v", tv, 3, hint=f"v is {desc} ({layout})")
    validate.check_dtype("q", tq, PLANNABLE)
    if tk.dtype.is_float8:  # fp8 k and v (converted to q's type in the kernel)
        validate.check_same_dtype(("k", "v"), (tk, tv))
    else:
        validate.check_same_dtype(
            ("q", "k", "v"), (tq, tk, tv),
            hint="(the prefill kernel takes one 16-bit type, or fp8 k and v: uint8 arrays with kv_dtype=)",
        )  # fmt: skip
    kv_len, hkv = (tk.shape[0], tk.shape[1]) if layout == "NHD" else (tk.shape[1], tk.shape[0])
    if tk.shape[2] != tq.shape[2]:
        raise ValueError(f"q and k must share head_dim but have shapes {tq.shape} and {tk.shape}")
    mask = None if custom_mask is None else bool_mask(host_array(custom_mask, "custom_mask"), "custom_mask")
    if mask is not None and mask.shape != (tq.shape[0], kv_len):
        raise ValueError(
            f"custom_mask must have shape (qo_len, kv_len) = {(tq.shape[0], kv_len)} but has shape {mask.shape}"
        )
    w = _single_wrappers.get((call.device_id, layout))
    if w is None:
        w = _single_wrappers[(call.device_id, layout)] = BatchPrefill(paged=False, kv_layout=layout,
                                                                      device=call.device_id)  # fmt: skip
        if call.is_host:
            w._device_id = None  # (host-only plans: the CPU reference never touches a GPU)
    w.plan(
        [0, tq.shape[0]], [0, kv_len], num_qo_heads=tq.shape[1], num_kv_heads=hkv, head_dim=tq.shape[2],
        head_dim_vo=tv.shape[2], causal=causal, custom_mask=None if mask is None else mask.reshape(-1),
        q_dtype=tq.dtype, kv_dtype=tk.dtype if kvd is None else kvd, sm_scale=sm_scale,
        logits_soft_cap=logits_soft_cap, window_left=window_left, pos_encoding=pos_encoding, rope_scale=rope_scale,
        rope_theta=rope_theta,
        variant=variant, variant_params=variant_params,
    )  # fmt: skip
    return w.run(q, k, v, return_lse=return_lse, variant_arrays=variant_arrays, k_scale=k_scale, v_scale=v_scale)
