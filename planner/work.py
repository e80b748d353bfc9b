"""``plan_work``: sequence lengths in, a ``WorkPlan`` out (the arrays of docs/internals.md, "Work plans").

Pipeline: query tiles and their KV ranges (``tiles``), the split decision and the chunks (``split_kv``), the chunks'
costs (``cost``), CTA assignment (``assign``), then the per-item arrays in CTA-major order, the partial-state blocks
of split items and the merge list.

Partial-state layout: the split tiles are numbered in plan order; split tile ``t`` with ``k`` chunks and ``r`` packed
rows owns ``H * k * r`` consecutive partial rows starting at ``base_t``; the block of KV head ``h``, chunk ``j`` starts
at ``base_t + (h*k + j) * r`` (so the chunks of one head are adjacent). The merge list has one entry per packed row of
every split (tile, head), in plan order (tile, head, row): its sources are that row of each chunk's block, in KV order
(``base_t + (h*k + j) * r + x`` for ``j = 0..k-1``), and its destination the query token and head of the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .assign import assign_items
from .cost import CostModel
from .split_kv import DEFAULT_MIN_CHUNK, block_counts, chunk_counts, choose_chunk_size, split_ranges
from .tiles import query_tiles

_I32 = np.int32


@dataclass(frozen=True)
class WorkPlan:
    """A schedule of work items over ``num_ctas`` persistent CTAs. All arrays are int32 (see docs/internals.md)."""

    num_ctas: int
    work_indptr: np.ndarray  # [num_ctas + 1]
    item_req: np.ndarray  # [n_items]
    item_qo_tile: np.ndarray
    item_kv_head: np.ndarray
    item_kv_start: np.ndarray
    item_kv_end: np.ndarray
    item_partial: np.ndarray  # -1: whole KV of the tile, write the output; >= 0: first row of the partial block
    merge_indptr: np.ndarray  # [n_merge + 1]
    merge_src: np.ndarray  # [merge_indptr[-1]] partial rows, KV order within each output row
    merge_dst_token: np.ndarray  # [n_merge] global query token (qo_indptr[b] + token)
    merge_dst_head: np.ndarray  # [n_merge] query head
    num_partial_rows: int
    chunk_size: int  # KV chunk the tiles were split at (0: no split)
    assign_mode: str  # "one-wave", "linear" or "sorted" (see assign.py)

    @property
    def n_items(self) -> int:
        return int(self.item_req.shape[0])

    @property
    def n_merge(self) -> int:
        return int(self.merge_dst_token.shape[0])

    @property
    def n_merge_src(self) -> int:
        return int(self.merge_src.shape[0])


def _head_major(values: np.ndarray, h: int) -> np.ndarray:
    """``values`` (one per group) repeated for each of ``h`` heads, head major, as int32."""
    out = np.empty((h, values.shape[0]), dtype=_I32)
    out[:] = values
    return out.reshape(-1)


def plan_work(
    qo_lens,
    kv_lens,
    *,
    num_kv_heads: int,
    group_size: int,
    tile_rows: int,
    num_ctas: int,
    kv_granule: int,
    causal: bool = False,
    window_left: int = -1,
    fixed_split_size: int | None = None,
    disable_split: bool = False,
    cost: CostModel = CostModel(),
    min_chunk: int = DEFAULT_MIN_CHUNK,
) -> WorkPlan:
    """Plan one batch: ``qo_lens[b]`` query tokens (``None``: decode, one each) attend ``kv_lens[b]`` KV tokens.

    ``group_size`` query heads share each of ``num_kv_heads`` KV heads; ``tile_rows`` packed rows make a query tile;
    ``num_ctas`` persistent CTAs run the items; chunk boundaries fall on multiples of ``kv_granule`` (the kernel's KV
    tile or page size). ``fixed_split_size`` (a multiple of ``kv_granule``) cuts every KV range at multiples of itself;
    ``disable_split`` never splits. ``min_chunk`` is the smallest piece the automatic policy cuts (tokens).
    """
    h = int(num_kv_heads)
    g = int(group_size)
    br = int(tile_rows)
    p = int(num_ctas)
    gr = int(kv_granule)
    for name, v in (("num_kv_heads", h), ("group_size", g), ("tile_rows", br), ("num_ctas", p), ("kv_granule", gr)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if fixed_split_size is not None:
        if disable_split:
            raise ValueError(
                f"fixed_split_size={fixed_split_size} and disable_split=True contradict each other; pass one of them"
            )
        fs = int(fixed_split_size)
        if fs < gr or fs % gr:
            lo = max(gr, fs // gr * gr)
            raise ValueError(
                f"fixed_split_size={fixed_split_size} must be a positive multiple of kv_granule={gr} (the kernel's KV "
                f"tile / page size, so chunk boundaries fall on page boundaries); use {lo} or {lo + gr}"
            )

    tiles = query_tiles(qo_lens, kv_lens, group_size=g, tile_rows=br, causal=causal, window_left=window_left)
    rows, start, end = tiles.rows, tiles.kv_start, tiles.kv_end
    n_tiles = tiles.count

    # --- split decision and chunks -----------------------------------------------------------------------------
    if fixed_split_size is not None:
        chunk = int(fixed_split_size)
        counts = np.maximum(block_counts(start, end, chunk), 1)
        split_granule = chunk
    elif disable_split:
        chunk, counts, split_granule = 0, None, gr
    else:
        chunk = choose_chunk_size(
            rows, start, end, num_kv_heads=h, num_ctas=p, kv_granule=gr, cost=cost, min_chunk=min_chunk
        )
        counts = None
        if chunk:
            counts = chunk_counts(block_counts(start, end, gr), chunk // gr, -(-min_chunk // gr))
        split_granule = gr
    if counts is not None and int(counts.max(initial=1)) == 1:
        counts = None
    if counts is None:
        grp_tile = None  # groups are the tiles
        g_start, g_end, g_rows = start, end, rows
        g_req, g_index = tiles.req, tiles.index
        costs = cost.item_cost(rows, end - start)
    else:
        grp_tile, piece, g_start, g_end = split_ranges(start, end, counts, split_granule)
        g_rows = rows[grp_tile]
        g_req, g_index = tiles.req[grp_tile], tiles.index[grp_tile]
        costs = cost.item_cost(g_rows, g_end - g_start, counts[grp_tile] > 1)

    # --- assignment ----------------------------------------------------------------------------------------------
    asg = assign_items(costs, h, p)
    n_groups = costs.shape[0]

    # --- partial blocks ------------------------------------------------------------------------------------------
    if counts is None:
        g_pbase = g_pstride = None
        num_partial = 0
    else:
        k_t = counts
        split_t = k_t > 1
        block_t = np.where(split_t, h * k_t * rows, 0)  # partial rows per split tile
        base_t = np.cumsum(block_t) - block_t
        num_partial = int(block_t.sum())
        # item (group of tile t, piece j, head hh): base_t + (hh*k + j) * r  -> per group: pbase + hh * pstride
        kg = k_t[grp_tile]
        sg = split_t[grp_tile]
        g_pbase = np.where(sg, base_t[grp_tile] + piece * g_rows, -1)
        g_pstride = np.where(sg, kg * g_rows, 0)

    # --- per-item arrays, CTA-major ----------------------------------------------------------------------------
    if asg.group is None:  # natural head-major order: broadcasts
        item_req = _head_major(g_req, h)
        item_tile = _head_major(g_index, h)
        item_s = _head_major(g_start, h)
        item_e = _head_major(g_end, h)
        item_head = np.repeat(np.arange(h, dtype=_I32), n_groups)
        if g_pbase is None:
            item_partial = np.full(n_groups * h, -1, dtype=_I32)
        else:
            item_partial = (g_pbase[None, :] + np.arange(h)[:, None] * g_pstride[None, :]).astype(_I32).reshape(-1)
    else:
        fields = 4 if g_pbase is None else 6
        table = np.empty((n_groups, fields), dtype=_I32)
        table[:, 0] = g_req
        table[:, 1] = g_index
        table[:, 2] = g_start
        table[:, 3] = g_end
        if g_pbase is not None:
            table[:, 4] = g_pbase
            table[:, 5] = g_pstride
        per_item = table[asg.group]
        item_req, item_tile, item_s, item_e = (np.ascontiguousarray(per_item[:, i]) for i in range(4))
        item_head = asg.head.astype(_I32)
        if g_pbase is None:
            item_partial = np.full(per_item.shape[0], -1, dtype=_I32)
        else:
            item_partial = per_item[:, 4] + item_head * per_item[:, 5]

    merge = _merge_list(tiles, counts, h, g, br, qo_lens) if counts is not None else None
    if merge is None:
        empty = np.zeros(0, dtype=_I32)
        merge = (np.zeros(1, dtype=_I32), empty, empty, empty)
    return WorkPlan(
        num_ctas=p,
        work_indptr=asg.work_indptr.astype(_I32),
        item_req=item_req,
        item_qo_tile=item_tile,
        item_kv_head=item_head,
        item_kv_start=item_s,
        item_kv_end=item_e,
        item_partial=item_partial,
        merge_indptr=merge[0],
        merge_src=merge[1],
        merge_dst_token=merge[2],
        merge_dst_head=merge[3],
        num_partial_rows=num_partial,
        chunk_size=chunk if counts is not None else 0,
        assign_mode=asg.mode,
    )


def _merge_list(tiles, counts: np.ndarray, h: int, g: int, br: int, qo_lens):
    """Merge entries for every packed row of every split (tile, head), in (tile, head, row) order."""
    split = np.flatnonzero(counts > 1)
    k = counts[split]
    r = tiles.rows[split]
    # Per split tile: H*r merge rows; its partial base is the running sum of H*k*r.
    block = h * k * r
    base = np.cumsum(block) - block
    m_per = h * r
    m_ends = np.cumsum(m_per)
    n_merge = int(m_ends[-1])
    st = np.repeat(np.arange(split.shape[0]), m_per)  # split-tile index of each merge row
    local = np.arange(n_merge) - (m_ends - m_per)[st]  # hh * r + x
    kk, rr = k[st], r[st]
    hh, x = np.divmod(local, rr)
    first_src = base[st] + hh * kk * rr + x  # source of chunk 0; chunk j adds j * r
    indptr = np.zeros(n_merge + 1, dtype=np.int64)
    np.cumsum(kk, out=indptr[1:])
    n_src = int(indptr[-1])
    j = np.arange(n_src) - np.repeat(indptr[:-1], kk)
    src = np.repeat(first_src, kk) + j * np.repeat(rr, kk)
    # Destination: packed row t*Br + x of request b is token (t*Br + x) // g, head-in-group (t*Br + x) % g.
    tile_idx = split[st]
    req = tiles.req[tile_idx]
    tok, hig = np.divmod(tiles.index[tile_idx] * br + x, g)
    if qo_lens is None:
        tok0 = req
    else:
        qo = np.asarray(qo_lens, dtype=np.int64)
        starts = np.cumsum(qo) - qo
        tok0 = starts[req]
    return (
        indptr.astype(_I32),
        src.astype(_I32),
        (tok0 + tok).astype(_I32),
        (hh * g + hig).astype(_I32),
    )
