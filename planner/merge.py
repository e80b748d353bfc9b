"""The merge list: how the partial states of split tiles combine into the output.

Partial rows (laid out by ``plan_work``): the split tiles, in plan order, each own ``H * k * r`` consecutive rows
(``k`` pieces, ``r`` packed rows, ``H`` KV heads) from ``base_t``; the block of KV head ``h``, piece ``j`` starts at
``base_t + (h*k + j) * r`` and holds one row per packed row of the tile, so the pieces of one head are adjacent.

Merge list, flattened to output rows: one entry per packed row of every split (tile, KV head), in (tile, head, row)
order. Entry ``m`` combines ``merge_src[merge_indptr[m]:merge_indptr[m+1]]``, which is row ``x`` of each piece's block
in KV order (``base_t + (h*k + j) * r + x``, ``j = 0..k-1``), and writes query token ``merge_dst_token[m]`` (global:
``qo_indptr[b] + token``) and query head ``merge_dst_head[m] = h * g + h_in_group``, where the packed row
``t*Br + x = token * g + h_in_group``. Every partial row is read by exactly one entry.
"""

from __future__ import annotations

import numpy as np


def split_layout(
    split: np.ndarray,
    pieces: np.ndarray,
    rows,
    req: np.ndarray,
    tile_index,
    token_start: np.ndarray | None,
    *,
    num_heads: int,
    group_size: int,
    tile_rows: int,
):
    """``(base, num_partial_rows, merge)`` for the split tiles: each one's first partial row, the rows in all, and
    ``merge = (merge_indptr, merge_src, merge_dst_token, merge_dst_head)``.

    Arguments are per split tile (``rows`` and ``tile_index`` may be scalars). The result depends only on which tiles
    are split and how, which stays the same over many decode steps, so it is cached (the arrays are read-only).
    """
    key = (
        split.tobytes(),
        pieces.tobytes(),
        rows.tobytes() if isinstance(rows, np.ndarray) else int(rows),
        req.tobytes(),
        tile_index.tobytes() if isinstance(tile_index, np.ndarray) else int(tile_index),
        None if token_start is None else token_start.tobytes(),
        int(num_heads),
        int(group_size),
        int(tile_rows),
    )
    hit = _LAYOUTS.get(key)
    if hit is None:
        block = pieces * rows
        block *= num_heads
        base = np.add.accumulate(block)
        total = int(base[-1]) if base.shape[0] else 0
        base -= block
        merge = merge_list(
            split, pieces, base, rows, req, tile_index, token_start,
            num_heads=num_heads, group_size=group_size, tile_rows=tile_rows,
        )  # fmt: skip
        for a in (base, *merge):
            a.flags.writeable = False
        hit = (base, total, merge)
        if len(_LAYOUTS) >= _LAYOUT_CACHE_SIZE:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        _LAYOUTS[key] = hit
    return hit


_LAYOUTS: dict = {}
_LAYOUT_CACHE_SIZE = 16


def merge_list(
    split: np.ndarray,
    pieces: np.ndarray,
    base: np.ndarray,
    rows,
    req: np.ndarray,
    tile_index,
    token_start: np.ndarray | None,
    *,
    num_heads: int,
    group_size: int,
    tile_rows: int,
):
    """``(merge_indptr, merge_src, merge_dst_token, merge_dst_head)`` for the split tiles.

    One entry per split tile: ``pieces`` (k), partial ``base``, packed ``rows`` (r; a scalar when all tiles have the
    same), request ``req``, ``tile_index`` within the request (a scalar for decode). ``token_start[b]`` is request
    ``b``'s first global query token (``None``: decode, token ``b``). ``split`` is only used for its length.
    """
    h, g, br = int(num_heads), int(group_size), int(tile_rows)
    if np.ndim(rows) == 0 and np.ndim(tile_index) == 0:
        return _grid(pieces, base, int(rows), req, int(tile_index), token_start, h, g, br)
    s = split.shape[0]
    rows = np.broadcast_to(rows, (s,))
    tile_index = np.broadcast_to(tile_index, (s,))
    per_tile = rows * h
    ends = np.add.accumulate(per_tile)
    t_e = np.arange(s).repeat(per_tile)  # split tile of each entry
    local = np.arange(int(ends[-1]) if s else 0)
    local -= (ends - per_tile).take(t_e)  # hh * r + x
    r_e = rows.take(t_e)
    k_e = pieces.take(t_e)
    hh, x = np.divmod(local, r_e)
    first = hh * k_e
    first *= r_e
    first += x
    first += base.take(t_e)  # source of piece 0; piece j adds j * r
    indptr, src = _sources(first, k_e, r_e.repeat(k_e))
    # Destination: packed row t*Br + x of a request is its token (t*Br + x) // g, head-in-group (t*Br + x) % g.
    tok, hig = np.divmod(tile_index.take(t_e) * br + x, g)
    b = req.take(t_e)
    tok += b if token_start is None else token_start.take(b)
    hig += hh * g
    return indptr, src, tok, hig


def _grid(pieces, base, r: int, req, tile_index: int, token_start, h: int, g: int, br: int):
    """Every split tile has ``r`` rows and the same tile index (decode): the entries form an [S, H*r] grid."""
    s = pieces.shape[0]
    hh, x = np.divmod(np.arange(h * r), r)
    first = np.multiply.outer(pieces, hh * r)  # (hh*k)*r ...
    first += x  # ... + x
    first += base[:, None]
    k_e = pieces.repeat(h * r)
    indptr, src = _sources(first.reshape(-1), k_e, r)
    tok_p, hig_p = np.divmod(tile_index * br + x, g)
    hig_p += hh * g
    b = req if token_start is None else token_start.take(req)
    tok = np.add.outer(b, tok_p).reshape(-1)
    hig = np.empty((s, h * r), dtype=np.int64)
    hig[:] = hig_p
    return indptr, src, tok, hig.reshape(-1)


def _sources(first: np.ndarray, k_e: np.ndarray, step) -> tuple[np.ndarray, np.ndarray]:
    """Entry m reads ``first[m] + j * step`` for ``j < k_e[m]``: ``(merge_indptr, merge_src)``."""
    indptr = np.zeros(first.shape[0] + 1, dtype=np.int64)
    np.add.accumulate(k_e, out=indptr[1:])
    src = first.repeat(k_e)
    j = np.arange(src.shape[0])
    j -= indptr[:-1].repeat(k_e)
    j *= step
    src += j
    return indptr, src
