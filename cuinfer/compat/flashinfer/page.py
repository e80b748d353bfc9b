"""FlashInfer's paged-KV utilities: ``append_paged_kv_cache``, ``get_batch_indices_positions``, ``get_seq_lens``.

``get_seq_lens`` is plain arithmetic on the caller's arrays. The other two call cuinfer's functions of the same
name once cuinfer has them (their GPU kernels are their own issue); until then NumPy inputs run
``cuinfer.reference`` and GPU arrays raise ``NotImplementedError`` (``common.utility``).
"""

from __future__ import annotations

from typing import Any

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
    ``positions`` when given (FlashInfer's preallocated outputs)."""
    b, p = common.utility("get_batch_indices_positions", append_indptr)(append_indptr, seq_lens, int(nnz))
    if batch_indices is not None:
        batch_indices[...] = b
        b = batch_indices
    if positions is not None:
        positions[...] = p
        p = positions
    return b, p


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
) -> None:
    """Write ``append_key`` / ``append_value`` ``[nnz, num_kv_heads, head_dim]`` into the paged cache in place, row
    ``t`` at position ``positions[t]`` of request ``batch_indices[t]`` (the page table describes the cache after
    the append)."""
    layout = common.kv_layout(kv_layout)
    fn = common.utility("append_paged_kv_cache", append_key)
    fn(append_key, append_value, batch_indices, positions, common.expand_paged(paged_kv_cache, layout), kv_indices,
       kv_indptr, kv_last_page_len, kv_layout=layout)  # fmt: skip
