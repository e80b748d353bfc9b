"""Merge units for kernels that merge split items themselves (the decode kernels: decode.cuh ``merge_split``).

A *unit* is one split (query tile, KV head): its ``k`` pieces hold their ``r`` partial rows at ``U + j*r``
(``planner/merge.py``). A kernel that merges in place needs, per item, the unit's first partial row ``U`` (also the
index of the unit's arrival counter) and ``k`` (the count that makes a piece the last); unsplit items get ``-1, 0``.

Both follow from the merge list alone: merge entry ``m`` reads ``merge_src[merge_indptr[m]:merge_indptr[m+1]]``, the
row ``x`` of every piece in KV order, so an item whose partial block starts at row ``p`` (its row 0) belongs to the
entry ``m`` that reads ``p``, with ``U = merge_src[merge_indptr[m]]`` and ``k = merge_indptr[m+1] - merge_indptr[m]``.
The inverse map (partial row -> entry) depends only on the merge list, which the planners cache and reuse while a
batch keeps its split structure, so it is memoised by the identity of those arrays.
"""

from __future__ import annotations

import numpy as np

_MEMO: dict = {}
_MEMO_MAX = 32


def _row_maps(merge_indptr: np.ndarray, merge_src: np.ndarray, num_partial_rows: int) -> tuple:
    """``(unit of each partial row, pieces of each partial row)``: int32 arrays of ``num_partial_rows`` entries."""
    key = (id(merge_indptr), id(merge_src), int(num_partial_rows))
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is merge_indptr and hit[1] is merge_src:
        return hit[2]
    counts = np.diff(merge_indptr)
    first = merge_src.take(merge_indptr[:-1])  # U + x of every entry's row x
    unit = np.full(num_partial_rows, -1, dtype=np.int32)
    pieces = np.zeros(num_partial_rows, dtype=np.int32)
    unit[merge_src] = first.repeat(counts)
    pieces[merge_src] = counts.repeat(counts)
    maps = (unit, pieces)
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    if not merge_indptr.flags.writeable and not merge_src.flags.writeable:  # cached (read-only) lists only
        _MEMO[key] = (merge_indptr, merge_src, maps)
    return maps


def units_of(partial: np.ndarray, merge_indptr: np.ndarray, merge_src: np.ndarray, num_partial_rows: int) -> tuple:
    """``(item_merge, item_pieces)`` (int32) of items whose partial blocks start at ``partial`` (-1: unsplit)."""
    unit_of, pieces_of = _row_maps(merge_indptr, merge_src, int(num_partial_rows))
    split = partial >= 0
    rows = np.where(split, partial, 0)
    item_merge = np.where(split, unit_of.take(rows), -1).astype(np.int32, copy=False)
    item_pieces = np.where(split, pieces_of.take(rows), 0).astype(np.int32, copy=False)
    return item_merge, item_pieces


def item_units(work) -> tuple[np.ndarray, np.ndarray] | None:
    """``(item_merge, item_pieces)`` of a ``WorkPlan`` (int32, CTA-major like its other item arrays), or None when
    nothing is split (every item writes its output directly: ``-1, 0`` everywhere)."""
    if work.n_merge == 0:
        return None
    return units_of(work.item_partial, work.merge_indptr, work.merge_src, work.num_partial_rows)
