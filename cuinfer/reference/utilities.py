"""References of the serving utilities that the older modules do not cover: request lengths from a page table and
RoPE from a precomputed cos / sin table (vLLM / SGLang's form). Float64 / int64 math, NumPy only."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.reference.positional import rotate_pairs
from cuinfer.reference.util import as_f64, as_index, as_indptr


def get_seq_lens(kv_indptr: Any, kv_last_page_len: Any, page_size: int) -> np.ndarray:
    """Tokens per request (int32 [batch]): `(pages - 1) * page_size + kv_last_page_len[b]` for a request with pages
    (`pages = kv_indptr[b+1] - kv_indptr[b]`), 0 for one without."""
    indptr = as_indptr(kv_indptr, "kv_indptr")
    last = as_index(kv_last_page_len, "kv_last_page_len")
    if last.shape[0] != indptr.shape[0] - 1:
        raise ValueError(
            f"kv_last_page_len must have one entry per request ({indptr.shape[0] - 1}) but has {last.shape[0]}"
        )
    pages = np.diff(indptr)
    return np.where(pages > 0, (pages - 1) * int(page_size) + last, 0).astype(np.int32)


def rope_cos_sin(x: Any, positions: Any, cos_sin_cache: Any, *, interleave: bool) -> np.ndarray:
    """RoPE of x[L, H, D] with angles from a table: row `positions[t]` of cos_sin_cache [max_pos, R] holds cos of
    pair i at column i and its sin at column R/2 + i. Pair i is (i, i + R/2), or (2i, 2i+1) with interleave=True;
    dims >= R are unchanged. Returns float64 [L, H, D]."""
    x = as_f64(x, "x", ndim=3)
    table = as_f64(cos_sin_cache, "cos_sin_cache", ndim=2)
    pos = as_index(positions, "positions")
    r = table.shape[1]
    if pos.shape != (x.shape[0],):
        raise ValueError(f"positions must have shape ({x.shape[0]},) (one per row of x) but has shape {pos.shape}")
    if r % 2 or r > x.shape[2]:
        raise ValueError(f"cos_sin_cache must have an even number of columns <= head_dim = {x.shape[2]} but has {r}")
    if pos.size and (pos.min() < 0 or pos.max() >= table.shape[0]):
        raise ValueError(f"positions must be in [0, {table.shape[0]}) but reach [{pos.min()}, {pos.max()}]")
    half = r // 2
    return rotate_pairs(x, table[pos, :half][:, None, :], table[pos, half:][:, None, :], r, interleave)
