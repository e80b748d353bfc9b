"""Attention states (O, base-2 LSE) and their merge operator, float64 on the CPU.

`[O1,s1] ⊕ [O2,s2] = [(2^s1·O1 + 2^s2·O2)/(2^s1+2^s2), log2(2^s1+2^s2)]`, computed with the running max subtracted
so that no exponent overflows. A state with lse = -inf saw no key: it weighs 0, so merging it is a no-op, and a merge
of only empty states is empty again (o = 0, lse = -inf), never NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.reference.util import as_f64


def _merge_axis(o: np.ndarray, lse: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge the states stacked along `axis` (>= 0, the same axis of lse and of o, which has one more trailing dim)."""
    m = np.max(lse, axis=axis, keepdims=True)
    empty = m == -np.inf
    # Shift by the max (0 for all-empty groups, whose weights are then exp2(-inf) = 0 anyway).
    w = np.exp2(lse - np.where(empty, 0.0, m))
    total = np.sum(w, axis=axis, keepdims=True)
    safe_total = np.where(empty, 1.0, total)
    # An empty state's o is never read (it may hold anything, NaN included: 0 x NaN would poison the row).
    o = np.where((lse == -np.inf)[..., None], 0.0, o)
    o_out = np.sum(w[..., None] * o, axis=axis) / np.squeeze(safe_total, axis=axis)[..., None]
    with np.errstate(divide="ignore"):
        lse_out = np.squeeze(np.where(empty, -np.inf, m + np.log2(safe_total)), axis=axis)
    return o_out, lse_out


def _check_state(o: np.ndarray, lse: np.ndarray, name: str) -> None:
    if o.shape[:-1] != lse.shape:
        raise ValueError(
            f"{name}: o has shape {o.shape} so lse must have shape {o.shape[:-1]} (o without its last dim) "
            f"but has shape {lse.shape}"
        )


def merge_state(o_a: Any, lse_a: Any, o_b: Any, lse_b: Any) -> tuple[np.ndarray, np.ndarray]:
    """Merge two states o[..., D], lse[...] (typically [L, H, D] / [L, H]); returns float64 (o, lse)."""
    oa, la, ob, lb = as_f64(o_a, "o_a"), as_f64(lse_a, "lse_a"), as_f64(o_b, "o_b"), as_f64(lse_b, "lse_b")
    _check_state(oa, la, "merge_state(a)")
    _check_state(ob, lb, "merge_state(b)")
    if oa.shape != ob.shape:
        raise ValueError(f"o_a and o_b must have the same shape but have {oa.shape} and {ob.shape}")
    # Stack the two states on a new axis placed after lse's dims (before o's feature dim) and reduce over it.
    axis = la.ndim
    return _merge_axis(np.stack([oa, ob], axis=axis), np.stack([la, lb], axis=axis), axis=axis)


def merge_states(o: Any, lse: Any) -> tuple[np.ndarray, np.ndarray]:
    """Merge S states per row: o[L, S, H, D], lse[L, S, H] -> float64 (o[L, H, D], lse[L, H])."""
    o64, l64 = as_f64(o, "o", ndim=4), as_f64(lse, "lse", ndim=3)
    _check_state(o64, l64, "merge_states")
    if o64.shape[1] == 0:
        L, _, H, D = o64.shape
        return np.zeros((L, H, D)), np.full((L, H), -np.inf)
    return _merge_axis(o64, l64, axis=1)


def merge_state_in_place(o: np.ndarray, lse: np.ndarray, o_other: Any, lse_other: Any, mask: Any = None) -> None:
    """o, lse <- (o, lse) ⊕ (o_other, lse_other), in place (o[L, H, D], lse[L, H], NumPy, any float dtypes).

    mask[L] bool selects the rows to merge; rows where it is False keep their values bit for bit.
    """
    if not isinstance(o, np.ndarray) or not isinstance(lse, np.ndarray):
        raise ValueError(
            f"merge_state_in_place writes into o and lse, so they must be NumPy arrays (got {type(o).__name__}, "
            f"{type(lse).__name__})"
        )
    merged_o, merged_lse = merge_state(o, lse, o_other, lse_other)
    if mask is None:
        o[...] = merged_o.astype(o.dtype)
        lse[...] = merged_lse.astype(lse.dtype)
        return
    rows = np.asarray(mask)
    if rows.shape != (o.shape[0],):
        raise ValueError(f"mask must have shape ({o.shape[0]},) (one bool per row of o) but has shape {rows.shape}")
    rows = rows.astype(bool)
    o[rows] = merged_o[rows].astype(o.dtype)
    lse[rows] = merged_lse[rows].astype(lse.dtype)
