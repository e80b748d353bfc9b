"""Query tiles and the KV range each one attends to (sequence lengths in, one row per tile out).

Rows are *packed*: the ``g = group_size`` query heads that share a KV head are fused into the rows of one tile, token
major (packed row ``r = token * g + h_in_group``). Request ``b`` with ``L_b`` query tokens has ``L_b * g`` packed rows
and ``ceil(L_b * g / Br)`` tiles; tile ``t`` covers packed rows ``[t*Br, min((t+1)*Br, L_b*g))``. Decode is
``L_b = 1``: one tile of ``g`` rows per request.

The KV range of a tile is the union of what its rows may see, so the kernel only visits KV that some row needs:

- causal (bottom-right aligned): row of token ``i`` sees ``j <= i + kv_len - qo_len``, so the tile's range ends at
  ``kv_len - qo_len + last_token + 1`` (clipped to ``[0, kv_len]``);
- sliding window ``w >= 0``: token ``i`` sees ``j >= i + kv_len - qo_len - w``; the range starts at that bound for the
  tile's *first* token (so every row of the tile is covered; the kernel still masks per row).

A tile whose range is empty (a causal tile of a request with fewer KV than query tokens) keeps an empty range
``[end, end)``: the kernel writes o = 0 and lse = -inf for its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tiles:
    """One entry per query tile, in request order then tile order."""

    req: np.ndarray  # int64 [T] request index
    index: np.ndarray  # int64 [T] tile index within its request
    rows: np.ndarray  # int64 [T] packed rows in the tile (<= tile_rows)
    kv_start: np.ndarray  # int64 [T] first KV token the tile attends to
    kv_end: np.ndarray  # int64 [T] one past the last (kv_start <= kv_end)

    @property
    def count(self) -> int:
        return int(self.req.shape[0])


def _as_lengths(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of per-request lengths, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        if a.size and a.dtype.kind == "f" and np.all(a == np.floor(a)):
            a = a.astype(np.int64)
        elif a.size:
            raise ValueError(f"{name} must hold integers, got dtype {a.dtype}; pass an int32/int64 array")
    return a.astype(np.int64, copy=False)


def qo_lens_from_indptr(qo_indptr) -> np.ndarray:
    """``qo_indptr[b+1] - qo_indptr[b]`` as int64, checked non-decreasing."""
    ind = _as_lengths(qo_indptr, "qo_indptr")
    lens = ind[1:] - ind[:-1]
    if lens.size and lens.min() < 0:
        b = int(np.argmin(lens))
        raise ValueError(
            f"qo_indptr must be non-decreasing, but qo_indptr[{b + 1}]={int(ind[b + 1])} < qo_indptr[{b}]="
            f"{int(ind[b])}; it is the CSR offset of each request's query rows (qo_indptr[0] = 0, then running sums)"
        )
    return lens


def kv_lens_from_pages(kv_indptr, kv_last_page_len, page_size: int) -> np.ndarray:
    """KV length of each request of a paged cache: ``page_size * (num_pages - 1) + last_page_len`` (0 with no page).

    ``kv_indptr`` is the CSR offset of each request's pages in ``kv_indices``; ``1 <= last_page_len <= page_size`` for a
    request with pages (a request without pages has length 0 whatever its last_page_len).
    """
    ind = np.asarray(kv_indptr)
    last = np.asarray(kv_last_page_len)
    if ind.ndim != 1 or last.ndim != 1 or last.shape[0] != ind.shape[0] - 1:
        raise ValueError(
            f"kv_indptr has shape {ind.shape} and kv_last_page_len has shape {last.shape}; they must be 1-D with "
            f"len(kv_indptr) == len(kv_last_page_len) + 1 (one entry per request plus the leading 0)"
        )
    pages = ind[1:] - ind[:-1]
    lens = pages * page_size + (last - page_size)
    # A request with no page has length 0 (its last_page_len is meaningless); np.maximum also keeps the formula from
    # going negative there. Bad inputs (negative page counts, last_page_len out of range) are the caller's to check.
    return np.maximum(lens, 0, dtype=np.int64)


def query_tiles(
    qo_lens,
    kv_lens,
    *,
    group_size: int,
    tile_rows: int,
    causal: bool = False,
    window_left: int = -1,
) -> Tiles:
    """The query tiles of a batch and the KV range of each (``qo_lens=None`` means decode: one token per request)."""
    kv = _as_lengths(kv_lens, "kv_lens")
    g = int(group_size)
    br = int(tile_rows)
    if g < 1 or br < 1:
        raise ValueError(f"group_size={group_size} and tile_rows={tile_rows} must both be >= 1")
    if kv.size and kv.min() < 0:
        raise ValueError(f"kv_lens must be >= 0, got {int(kv.min())} at request {int(np.argmin(kv))}")
    w = int(window_left)

    decode = qo_lens is None
    if not decode:
        qo = _as_lengths(qo_lens, "qo_lens")
        if qo.shape != kv.shape:
            raise ValueError(
                f"qo_lens has {qo.shape[0]} requests but kv_lens has {kv.shape[0]}; give one length per request in both"
            )
        if qo.size:
            lo, hi = int(qo.min()), int(qo.max())
            if lo < 0:
                raise ValueError(f"qo_lens must be >= 0, got {lo} at request {int(np.argmin(qo))}")
            decode = lo == 1 and hi == 1 and g <= br

    if decode and g <= br:
        # Fast path: one tile of g rows per request; causal changes nothing (the single token is the last one).
        b = kv.shape[0]
        zeros = np.zeros(b, dtype=np.int64)
        start = np.maximum(kv - (1 + w), 0) if w >= 0 else zeros
        rows = np.full(b, g, dtype=np.int64)
        return Tiles(req=np.arange(b, dtype=np.int64), index=zeros, rows=rows, kv_start=start, kv_end=kv)
    if qo_lens is None:
        qo = np.ones(kv.shape[0], dtype=np.int64)

    rows_b = qo * g
    nt_b = (rows_b + (br - 1)) // br
    ends = np.cumsum(nt_b)
    n_tiles = int(ends[-1]) if ends.size else 0
    req = np.repeat(np.arange(kv.shape[0], dtype=np.int64), nt_b)
    index = np.arange(n_tiles, dtype=np.int64) - np.repeat(ends - nt_b, nt_b)
    row0 = index * br
    row1 = np.minimum(row0 + br, rows_b[req])
    kv_t = kv[req]
    shift = kv_t - qo[req]  # bottom-right alignment: token i sits at KV position i + shift
    if causal:
        end = np.clip(shift + (row1 - 1) // g + 1, 0, kv_t)
    else:
        end = kv_t
    if w >= 0:
        start = np.minimum(np.maximum(shift + row0 // g - w, 0), end)
    else:
        start = np.zeros(n_tiles, dtype=np.int64)
    return Tiles(req=req, index=index, rows=row1 - row0, kv_start=start, kv_end=end)
