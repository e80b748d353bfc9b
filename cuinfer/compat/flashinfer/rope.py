"""FlashInfer's RoPE on ragged q / k: ``apply_rope`` and ``apply_rope_pos_ids`` (rotate-half or interleaved, partial
``rotary_dim``), returning new arrays in q's and k's dtypes. They call cuinfer's functions of the same name once
cuinfer has them (their GPU kernels are their own issue); until then NumPy inputs run ``cuinfer.reference`` and GPU
arrays raise ``NotImplementedError``. The in-place, Llama-3.1 and cos/sin-cache forms are not covered yet
(``uncovered``)."""

from __future__ import annotations

from typing import Any

from cuinfer.compat.flashinfer import common

__all__ = ["apply_rope", "apply_rope_pos_ids"]


def apply_rope(
    q: Any,
    k: Any,
    indptr: Any,
    offsets: Any,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> tuple[Any, Any]:
    """RoPE on ragged ``q [nnz, num_qo_heads, head_dim]`` / ``k [nnz, num_kv_heads, head_dim]``: token ``t`` of
    request ``b`` (rows ``indptr[b]:indptr[b+1]``) at position ``offsets[b] + t - indptr[b]``."""
    return _rope("apply_rope", q, k, (indptr, offsets), rotary_dim, interleave, rope_scale, rope_theta)


def apply_rope_pos_ids(
    q: Any,
    k: Any,
    pos_ids: Any,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> tuple[Any, Any]:
    """RoPE on ``q [nnz, num_qo_heads, head_dim]`` / ``k [nnz, num_kv_heads, head_dim]`` at positions
    ``pos_ids [nnz]``."""
    return _rope("apply_rope_pos_ids", q, k, (pos_ids,), rotary_dim, interleave, rope_scale, rope_theta)


def _rope(name: str, q: Any, k: Any, positions: tuple, rotary_dim: Any, interleave: bool, rope_scale: float,
          rope_theta: float) -> tuple[Any, Any]:  # fmt: skip
    """cuinfer's ``name`` with FlashInfer's positional options as its keywords; results in q's and k's dtypes."""
    qr, kr = common.utility(name, q)(
        q, k, *positions, rotary_dim=rotary_dim, interleave=bool(interleave), rope_scale=float(rope_scale),
        rope_theta=float(rope_theta),
    )  # fmt: skip
    return common.like_input(qr, q), common.like_input(kr, k)
