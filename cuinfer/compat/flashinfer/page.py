"""FlashInfer's paged-KV utilities: ``append_paged_kv_cache``, ``get_batch_indices_positions``, ``get_seq_lens``.

``append_paged_kv_cache`` and ``get_batch_indices_positions`` call cuinfer's functions of the same name
(``cuinfer/utils/paged.py``: GPU kernels on the caller's stream, the float64 reference for NumPy arrays) with
FlashInfer's arguments in FlashInfer's order. ``get_seq_lens`` is FlashInfer's formula on the caller's arrays (it
differs from cuinfer's for a request without pages, docs/utilities.md).
"""

from __future__ import annotations

from typing import Any

import cuinfer
from cuinfer.compat.flashinfer import common

__all__ = ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"]


def get_seq_lens(kv_indptr: Any, kv_last_page_len: Any, page_size: int) -> Any:
    """KV length of each request: ``max(pages - 1, 0) * page_size + kv_last_page_len`` (FlashInfer's formula,
    in the arrays' own framework)."""
    full = kv_indptr[1:] - kv_indptr[:-1] - 1
    return full * (full > 0) * page_size + kv_last_page_len


def get_batch_indices_positions(
    append_indptr: Any, seq_lens: Any, nnz: int, batch_indices: Any = None, positions: Any = None
) -> tuple[Any, Any]:
    """Request index and position of each of ``nnz`` appended tokens; written into ``batch_indices`` /
    ``positions`` when given (FlashInfer's preallocated outputs). Rows past ``append_indptr[-1]`` (padding) get batch
    index -1 and, as in FlashInfer, position 0, or the given ``positions`` buffer's value left as it was (cuinfer's
    own function gives -1 there)."""
    b, p = cuinfer.get_batch_indices_positions(append_indptr, seq_lens, int(nnz))
    live = b >= 0
    if batch_indices is not None:
        batch_indices[...] = b
        b = batch_indices
    if positions is None:
        return b, p * live
    positions[...] = p * live + positions * ~live
    return b, positions


def append_paged_kv_cache(
    append_key: Any,
    append_value: Any,
    batch_indices: Any,
    positions: Any,
    paged_kv_cache: Any,
    kv_indices: Any,
    kv_indptr: Any,
    kv_last_page_len: Any,
    kv_layout: str = "NHD",
) -> Any:
    """Write ``append_key`` / ``append_value`` ``[nnz, num_kv_heads, head_dim]`` into the paged cache in place, row
    ``t`` at position ``positions[t]`` of request ``batch_indices[t]`` (the page table describes the cache after
    the append). ``paged_kv_cache``: the 5-D cache, a ``(k_cache, v_cache)`` tuple, or FlashInfer's page-size-1
    shorthands. Returns None, as FlashInfer; for JAX caches (immutable) cuinfer's updated copy."""
    layout = common.kv_layout(kv_layout)
    return cuinfer.append_paged_kv_cache(
        append_key, append_value, batch_indices, positions, common.expand_paged(paged_kv_cache, layout), kv_indices,
        kv_indptr, kv_last_page_len, kv_layout=layout,
    )  # fmt: skip
