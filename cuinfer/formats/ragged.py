"""Ragged K/V: ``k``, ``v`` of ``[nnz_kv, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, nnz_kv, head_dim]``
(HND), request b in tokens ``kv_indptr[b]:kv_indptr[b+1]``, checked against a plan and seen as a ``KV`` view of one
page (page stride 0)."""

from __future__ import annotations

from typing import Any

from cuinfer.formats.kv import KV, check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor


def check_ragged_shapes(ks: tuple, vs: tuple, plan: Any, layout: str) -> None:
    nnz = int(plan.kv_indptr[-1])
    expect_k = (nnz, plan.num_kv_heads, plan.head_dim) if layout == "NHD" else (plan.num_kv_heads, nnz, plan.head_dim)
    expect_v = expect_k[:2] + (plan.head_dim_vo,)
    desc = "[nnz_kv, num_kv_heads, head_dim]" if layout == "NHD" else "[num_kv_heads, nnz_kv, head_dim]"
    for name, got, want in (("k", tuple(ks), expect_k), ("v", tuple(vs), expect_v)):
        if len(got) != 3:
            raise ValueError(f"{name} must be 3-D {desc} ({layout}) but has shape {got}")
        rows = got[0] if layout == "NHD" else got[1]
        if rows != nnz:
            raise ValueError(
                f"{name} has {rows} tokens but kv_indptr[-1] = {nnz}; {name} holds the KV tokens of every request, "
                "request b in rows kv_indptr[b]:kv_indptr[b+1]"
            )
        if got != want:
            raise ValueError(
                f"{name} must have shape {want} ({layout} {desc}) but has shape {got}; plan() was made for "
                f"num_kv_heads={plan.num_kv_heads}, head_dim={plan.head_dim}, head_dim_vo={plan.head_dim_vo}"
            )


def ragged_kv(tk: Tensor, tv: Tensor, layout: str, plan: Any) -> KV:
    check_ragged_shapes(tk.shape, tv.shape, plan, layout)
    validate.check_same_dtype(("k", "v"), (tk, tv))
    nhd = layout == "NHD"
    for name, t in (("k", tk), ("v", tv)):
        check_aligned(name, t, (0, 1))
    tok, head = (0, 1) if nhd else (1, 0)
    ks = (0, tk.strides[tok], tk.strides[head])
    vs = (0, tv.strides[tok], tv.strides[head])
    return KV(tk, tv, tk.ptr, tv.ptr, ks, vs, 1, 1, plan.num_kv_heads, plan.head_dim)
