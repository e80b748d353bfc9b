"""FlashInfer's RoPE functions over cuinfer's (``cuinfer/utils/rope.py``, docs/utilities.md): ragged ``indptr`` /
``offsets`` or explicit ``pos_ids``, plain or Llama 3.1 frequencies, new arrays or in place, and the cos/sin-cache
form vLLM and SGLang call.

FlashInfer's positional order and defaults, passed to cuinfer as its keywords (Llama 3.1's ``low_freq_factor``,
``high_freq_factor`` and ``old_context_len`` by the same names). GPU arrays run cuinfer's RoPE kernel on the caller's
stream; NumPy arrays the float64 reference, rounded to q's dtype. The ``_inplace`` forms write into q and k (JAX
arrays are immutable: cuinfer raises ``ValueError`` and names the form that returns new arrays).
"""

from __future__ import annotations

import math
from typing import Any

import cuinfer
from cuinfer.compat.flashinfer import common

__all__ = [
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]


def _opts(rotary_dim: Any, interleave: Any, rope_scale: Any, rope_theta: Any, llama31: tuple | None = None) -> dict:
    """cuinfer's keywords from FlashInfer's options; ``llama31`` = (low_freq_factor, high_freq_factor,
    old_context_len), which FlashInfer passes to its kernel as floats."""
    opts = dict(rotary_dim=rotary_dim, interleave=bool(interleave), rope_scale=float(rope_scale),
                rope_theta=float(rope_theta))  # fmt: skip
    if llama31 is not None:
        low, high, old = (float(x) for x in llama31)
        opts.update(low_freq_factor=low, high_freq_factor=high, old_context_len=old)
    return opts


# ---- indptr / offsets ------------------------------------------------------------------------------------------------


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
    request ``b`` (rows ``indptr[b]:indptr[b+1]``) at position ``offsets[b] + t - indptr[b]``. Returns new
    ``(q_rope, k_rope)``."""
    return cuinfer.apply_rope(q, k, indptr, offsets, **_opts(rotary_dim, interleave, rope_scale, rope_theta))


def apply_rope_inplace(
    q: Any,
    k: Any,
    indptr: Any,
    offsets: Any,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """``apply_rope`` writing into q and k."""
    cuinfer.apply_rope_inplace(q, k, indptr, offsets, **_opts(rotary_dim, interleave, rope_scale, rope_theta))


def apply_llama31_rope(
    q: Any,
    k: Any,
    indptr: Any,
    offsets: Any,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> tuple[Any, Any]:
    """``apply_rope`` with Llama 3.1's frequency scaling. Returns new ``(q_rope, k_rope)``."""
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    return cuinfer.apply_llama31_rope(
        q, k, indptr, offsets, **_opts(rotary_dim, interleave, rope_scale, rope_theta, llama31)
    )


def apply_llama31_rope_inplace(
    q: Any,
    k: Any,
    indptr: Any,
    offsets: Any,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """``apply_llama31_rope`` writing into q and k."""
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    cuinfer.apply_llama31_rope_inplace(
        q, k, indptr, offsets, **_opts(rotary_dim, interleave, rope_scale, rope_theta, llama31)
    )


# ---- pos_ids ---------------------------------------------------------------------------------------------------------


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
    ``pos_ids [nnz]``. Returns new ``(q_rope, k_rope)``."""
    return cuinfer.apply_rope_pos_ids(q, k, pos_ids, **_opts(rotary_dim, interleave, rope_scale, rope_theta))


def apply_rope_pos_ids_inplace(
    q: Any,
    k: Any,
    pos_ids: Any,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """``apply_rope_pos_ids`` writing into q and k."""
    cuinfer.apply_rope_pos_ids_inplace(q, k, pos_ids, **_opts(rotary_dim, interleave, rope_scale, rope_theta))


def apply_llama31_rope_pos_ids(
    q: Any,
    k: Any,
    pos_ids: Any,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> tuple[Any, Any]:
    """``apply_rope_pos_ids`` with Llama 3.1's frequency scaling. Returns new ``(q_rope, k_rope)``."""
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    return cuinfer.apply_llama31_rope_pos_ids(
        q, k, pos_ids, **_opts(rotary_dim, interleave, rope_scale, rope_theta, llama31)
    )


def apply_llama31_rope_pos_ids_inplace(
    q: Any,
    k: Any,
    pos_ids: Any,
    rotary_dim: int | None = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """``apply_llama31_rope_pos_ids`` writing into q and k."""
    llama31 = (low_freq_factor, high_freq_factor, old_context_len)
    cuinfer.apply_llama31_rope_pos_ids_inplace(
        q, k, pos_ids, **_opts(rotary_dim, interleave, rope_scale, rope_theta, llama31)
    )


# ---- cos/sin cache ---------------------------------------------------------------------------------------------------


def _check_heads(head_size: Any, **arrays: Any) -> None:
    """FlashInfer views query / key as ``[nnz, -1, head_size]``; cuinfer takes the 2-D ``[nnz, heads * head_size]``
    and 3-D ``[nnz, heads, head_size]`` forms of that view. Another shape FlashInfer could view raises."""
    for name, x in arrays.items():
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) < 3 or (len(shape) == 3 and shape[2] == head_size):
            continue  # (cuinfer checks the rest, as FlashInfer's view would fail)
        if isinstance(head_size, int) and head_size > 0 and math.prod(shape[1:]) % head_size == 0:
            raise common.not_covered(
                f"{name} of shape {shape} (FlashInfer views it as [nnz, -1, head_size = {head_size}])",
                f"pass {name} as [nnz, num_heads * head_size] or [nnz, num_heads, head_size], e.g. "
                f"{name}.reshape({name}.shape[0], -1)",
            )


def apply_rope_with_cos_sin_cache(
    positions: Any,
    query: Any,
    key: Any,
    head_size: int,
    cos_sin_cache: Any,
    is_neox: bool = True,
) -> tuple[Any, Any]:
    """RoPE with angles from ``cos_sin_cache`` (float32 ``[max_position, rotary_dim]``: cosines then sines) at
    ``positions``: ``is_neox=True`` rotates halves, False interleaved pairs. Returns new ``(query_out, key_out)``."""
    _check_heads(head_size, query=query, key=key)
    return cuinfer.apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=is_neox)


def apply_rope_with_cos_sin_cache_inplace(
    positions: Any,
    query: Any,
    key: Any,
    head_size: int,
    cos_sin_cache: Any,
    is_neox: bool = True,
) -> None:
    """``apply_rope_with_cos_sin_cache`` writing into query and key."""
    _check_heads(head_size, query=query, key=key)
    cuinfer.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox=is_neox)
