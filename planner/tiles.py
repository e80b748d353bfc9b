"""Query tiles and the KV range each one attends to (sequence lengths in, one entry per tile out).

Rows are *packed*: the ``g = group_size`` query heads that share a KV head are fused into the rows of one tile, token
major (packed row ``r = token * g + h_in_group``). Request ``b`` with ``L_b`` query tokens has ``L_b * g`` packed rows
and ``ceil(L_b * g / Br)`` tiles; tile ``t`` covers packed rows ``[t*Br, min((t+1)*Br, L_b*g))``. Decode is
``L_b = 1``: one tile of ``g`` rows per request.

The KV range of a tile is the union of what its rows may see, so the kernel visits only KV that some row needs:

- causal (bottom-right aligned): the row of token ``i`` sees ``j <= i + kv_len - qo_len``, so the tile's range ends at
  ``kv_len - qo_len + last_token + 1``, clipped to ``[0, kv_len]``;
- sliding window ``w >= 0``: token ``i`` sees ``j >= i + kv_len - qo_len - w``; the range starts at that bound for the
  tile's *first* token (so every row of the tile is covered; the kernel still masks per row), clipped at 0.

A tile whose range is empty (causal, more query than KV tokens) keeps an empty range ``[start, start)``: the kernel
writes o = 0 and lse = -inf for its rows. Every ``start <= end``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tiles:
    """One entry per query tile, in request order then tile order.

    For speed, fields that are the same for every tile (decode: ``index = 0``, ``rows = g``, ``kv_start = 0``
    without a window) are Python ints instead of arrays; ``at`` reads either kind.
    """

    count: int
    decode: bool  # every request has exactly one query token (token b of the batch is request b's)
    req: np.ndarray  # [T] request of each tile
    index: np.ndarray | int  # [T] tile index within its request
    rows: np.ndarray | int  # [T] packed rows in the tile (<= tile_rows)
    kv_start: np.ndarray | int  # [T] first KV token the tile attends to
    kv_end: np.ndarray  # [T] one past the last (kv_start <= kv_end)


def at(x, idx: np.ndarray):
    """``x[idx]`` for an array, ``x`` itself for a scalar field (same value for every tile)."""
    return x.take(idx) if isinstance(x, np.ndarray) else x


def as_lengths(x, name: str) -> np.ndarray:
    """A 1-D integer array of non-negative per-request lengths (NumPy, list, or host tensor)."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array with one length per request, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        if a.size and (a.dtype.kind != "f" or not np.all(a == np.floor(a))):
            raise ValueError(f"{name} must hold integers, got dtype {a.dtype}; pass an int32 or int64 array")
        a = a.astype(np.int64)
    if a.size and a.min() < 0:
        i = int(np.argmin(a))
        raise ValueError(f"{name} must be >= 0, got {name}[{i}] = {int(a[i])}")
    return a


def qo_lens_from_indptr(qo_indptr) -> np.ndarray:
    """``qo_indptr[b+1] - qo_indptr[b]``, checked non-decreasing."""
    ind = np.asarray(qo_indptr)
    if ind.ndim != 1 or ind.shape[0] < 1 or ind.dtype.kind not in "iu":
        raise ValueError(
            f"qo_indptr must be a 1-D integer array of len(batch) + 1 offsets, got shape {ind.shape} dtype {ind.dtype}"
        )
    lens = ind[1:] - ind[:-1]
    if lens.size and lens.min() < 0:
        b = int(np.argmin(lens))
        raise ValueError(
            f"qo_indptr must be non-decreasing, but qo_indptr[{b + 1}] = {int(ind[b + 1])} < qo_indptr[{b}] = "
            f"{int(ind[b])}; it holds the CSR offsets of each request's query rows (0, then running sums)"
        )
    return lens


def kv_lens_from_pages(kv_indptr, kv_last_page_len, page_size: int) -> np.ndarray:
    """KV length of each request of a paged cache: ``page_size * (num_pages - 1) + last_page_len``.

    ``kv_indptr`` holds the CSR offsets of each request's pages in ``kv_indices``; ``1 <= last_page_len <=
    page_size`` for a request with pages. A request with no page has length 0 whatever its ``last_page_len``.
    Checking the page table itself (ranges, monotonic offsets) is the caller's job (``interop.validate``).
    """
    ind = np.asarray(kv_indptr)
    last = np.asarray(kv_last_page_len)
    if ind.ndim != 1 or last.ndim != 1 or last.shape[0] != ind.shape[0] - 1:
        raise ValueError(
            f"kv_indptr has shape {ind.shape} and kv_last_page_len has shape {last.shape}; they must be 1-D with "
            f"len(kv_indptr) == len(kv_last_page_len) + 1 (one entry per request plus the leading 0)"
        )
    lens = ind[1:] - ind[:-1]
    lens *= page_size
    lens += last
    lens -= page_size
    return np.maximum(lens, 0, out=lens)  # no page: 0 (the formula gave last_page_len - page_size <= 0)


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
    kv = as_lengths(kv_lens, "kv_lens")
    g = int(group_size)
    br = int(tile_rows)
    if g < 1 or br < 1:
        raise ValueError(f"group_size={group_size} and tile_rows={tile_rows} must both be >= 1")
    w = int(window_left)
    b = kv.shape[0]

    if qo_lens is None:
        qo = None
    else:
        qo = as_lengths(qo_lens, "qo_lens")
        if qo.shape[0] != b:
            raise ValueError(
                f"qo_lens has {qo.shape[0]} requests but kv_lens has {b}; give one length per request in both"
            )
        if b and int(qo.max()) == 1 and int(qo.min()) == 1:
            qo = None  # decode

    if qo is None and g <= br:
        # Decode: one tile of g rows per request; causal changes nothing (the only token is the last one).
        start = np.maximum(kv - (w + 1), 0) if w >= 0 else 0
        return Tiles(count=b, decode=True, req=np.arange(b), index=0, rows=g, kv_start=start, kv_end=kv)
    decode = qo is None
    if decode:
        qo = np.ones(b, dtype=np.int64)

    qo = qo.astype(np.int64, copy=False)
    kv = kv.astype(np.int64, copy=False)
    rows_b = qo * g
    nt_b = rows_b + (br - 1)
    nt_b //= br
    ends = np.add.accumulate(nt_b)
    n_tiles = int(ends[-1]) if b else 0
    # Per-request values are spread over the tiles with repeat (cheaper than gathers by a tile->request index).
    req = np.arange(b).repeat(nt_b)
    index = np.arange(n_tiles)
    index -= (ends - nt_b).repeat(nt_b)
    row0 = index * br
    rows = rows_b.repeat(nt_b)
    rows -= row0  # packed rows from the tile's first to the request's end
    np.minimum(rows, br, out=rows)
    if causal:
        # token i sees j <= i + kv - qo; the tile's last token is (row0 + rows - 1) // g. The end is never past
        # kv (the last token is at most qo - 1) and is clipped at 0 (more queries than keys).
        end = row0 + rows
        end -= 1
        end //= g
        end += (kv - qo + 1).repeat(nt_b)
        np.maximum(end, 0, out=end)
    else:
        end = kv.repeat(nt_b)
    if w >= 0:
        start = row0 // g  # first token of the tile
        start += (kv - qo - w).repeat(nt_b)
        np.maximum(start, 0, out=start)
        np.minimum(start, end, out=start)
    else:
        start = 0
    return Tiles(count=n_tiles, decode=decode, req=req, index=index, rows=rows, kv_start=start, kv_end=end)
