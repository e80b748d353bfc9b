"""``plan_work``: sequence lengths in, a ``WorkPlan`` out (the arrays of docs/internals.md, "Work plans").

Decode batches with one tile per request go to ``decode_plan`` (the lane cut). The tile pipeline: query tiles and
their KV ranges (``tiles``), the split decision (``split_kv``), the chunks, their costs (``cost``), CTA assignment
(``assign``), partial-state blocks and the merge list (``merge``).

A ``WorkPlan`` keeps its items compactly: per *group* (one KV chunk of one query tile: ``H`` items, one per KV head)
arrays plus the assignment. The per-item arrays of the contract (``item_req`` ...) are properties built on first use;
``layout.pack`` writes them straight into the plan buffer (``item_fields``: one NumPy call per array), which is what
keeps ``plan()`` in tens of microseconds on a small host CPU.
"""

from __future__ import annotations

import functools

import numpy as np

from .assign import assign_items
from .cost import DEFAULT_COST, CostModel
from .decode_plan import decode_planner
from .merge import split_layout
from .split_kv import DEFAULT_MIN_CHUNK, _choose, fixed_counts, split_counts, split_ranges
from .tiles import as_lengths, at, tiles_of
from .workplan import WorkPlan, put_field  # noqa: F401  (re-exported: the plan type lives with plan_work)

_EMPTY = np.zeros(0, dtype=np.int64)
_ZERO1 = np.zeros(1, dtype=np.int64)


def _tile_costs(tiles, n: np.ndarray, cost: CostModel) -> np.ndarray:
    """One head's cost of each whole tile: ``beta * kv + alpha * rows + gamma``, in int64 when the terms are whole
    numbers (the default model: the prefix sum of the assignment is faster on integers)."""
    rows, fix = tiles.rows, tiles.last_rows
    if not isinstance(rows, np.ndarray) and cost.integral:
        costs = np.add(n, _const64(int(cost.alpha) * rows + int(cost.gamma)))  # int64
        if cost.beta != 1:
            costs += n * int(cost.beta)
            costs -= n
        if fix is not None:  # the last tiles' missing rows
            short = rows - fix[1]
            if cost.alpha != 1:
                short *= int(cost.alpha)
            costs[fix[0]] -= short
        return costs
    costs = n * cost.beta
    costs += tiles.row_array() * cost.alpha + cost.gamma
    return costs


@functools.lru_cache(maxsize=16)
def _const64(v: int) -> np.ndarray:
    c = np.array(v, dtype=np.int64)
    c.flags.writeable = False
    return c


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
    cost: CostModel = DEFAULT_COST,
    min_chunk: int = DEFAULT_MIN_CHUNK,
    kv_range: tuple[int, int] | None = None,
    qo_range: tuple[int, int] | None = None,
) -> WorkPlan:
    """Plan one batch: ``qo_lens[b]`` query tokens (``None``: decode, one each) attend ``kv_lens[b]`` KV tokens.

    ``group_size`` query heads share each of ``num_kv_heads`` KV heads; ``tile_rows`` packed rows make a query tile;
    ``num_ctas`` persistent CTAs run the items; chunk boundaries fall on multiples of ``kv_granule`` (the kernel's KV
    tile or page size). ``fixed_split_size`` (a multiple of ``kv_granule``) cuts every KV range at multiples of itself;
    ``disable_split`` never splits. ``min_chunk`` is the smallest piece the automatic policy cuts (tokens).
    ``kv_range = (min, max)`` of ``kv_lens`` and ``qo_range`` of ``qo_lens`` when the caller has them (those lengths
    then must be 1-D integer NumPy arrays, already checked non-negative): saves their reductions.

    Decode batches (``qo_lens`` None or all ones) with ``group_size <= tile_rows`` take the lane plan of
    ``decode_plan.py``; everything else the tile pipeline below.
    """
    h, g, br, p, gr = int(num_kv_heads), int(group_size), int(tile_rows), int(num_ctas), int(kv_granule)
    if min(h, g, br, p, gr) < 1:
        names = ("num_kv_heads", "group_size", "tile_rows", "num_ctas", "kv_granule")
        bad = [f"{nm}={v}" for nm, v in zip(names, (h, g, br, p, gr), strict=True) if v < 1]
        raise ValueError(f"plan_work: {', '.join(bad)} must be >= 1")
    if fixed_split_size is not None:
        if disable_split:
            raise ValueError(
                f"fixed_split_size={fixed_split_size} and disable_split=True contradict each other; pass only one"
            )
        fs = int(fixed_split_size)
        if fs < gr or fs % gr:
            lo = max(gr, fs // gr * gr)
            raise ValueError(
                f"fixed_split_size={fixed_split_size} must be a positive multiple of kv_granule={gr} (the kernel's KV "
                f"tile / page size, so chunk boundaries fall on page boundaries); use {lo} or {lo + gr}"
            )
    if kv_range is None:
        kv = as_lengths(kv_lens, "kv_lens")
        kv_lo = kv_hi = None
    else:
        kv, (kv_lo, kv_hi) = kv_lens, kv_range
    qo = qo_lo = None
    if qo_lens is not None:
        if qo_range is None:
            qo = as_lengths(qo_lens, "qo_lens")
            qo_lo, qo_hi = (int(qo.min()), int(qo.max())) if qo.shape[0] else (0, 0)
        else:
            qo, (qo_lo, qo_hi) = qo_lens, qo_range
        if qo.shape[0] != kv.shape[0]:
            raise ValueError(
                f"qo_lens has {qo.shape[0]} requests but kv_lens has {kv.shape[0]}; give one length per request in both"
            )
        if qo_lo == 1 and qo_hi == 1:
            qo = None  # every request has one query token: decode
    if qo is None and g <= br and fixed_split_size is None and kv.shape[0]:
        planner = decode_planner(h, g, br, p, gr, int(window_left), bool(disable_split), cost, int(min_chunk))
        plan = planner.plan(kv, kv_lo, kv_hi)
        if plan is not None:
            return plan

    tiles = tiles_of(qo, kv, g, br, bool(causal), int(window_left), qo_lo)
    rows, start, end = tiles.rows, tiles.kv_start, tiles.kv_end
    n = end - start if isinstance(start, np.ndarray) else end
    costs = _tile_costs(tiles, n, cost)
    stats = prefix = None
    if tiles.count:
        # The prefix sum serves the linear assignment (the usual one for prefill) and gives the total.
        prefix = np.add.accumulate(costs)
        stats = (float(prefix[-1]), float(np.maximum.reduce(costs)), float(np.minimum.reduce(costs)))

    # --- split decision: which tiles are cut, into how many pieces -----------------------------------------------
    counts = None  # pieces per tile (None: nothing is split)
    chunk, piece_granule = 0, gr
    if fixed_split_size is not None:
        chunk = piece_granule = int(fixed_split_size)
        counts = fixed_counts(start, end, chunk)
        split = (counts > 1).nonzero()[0]
        if split.shape[0]:
            ks = counts.take(split)
        else:
            counts = None
    elif not disable_split and tiles.count:
        choice = _choose(rows, n, stats, h, p, gr, cost, min_chunk)
        if choice is not None:
            chunk = choice[0] * gr
            split, ks = split_counts(n, start, end, choice[0], choice[1], gr, min_chunk)
            counts = np.ones(tiles.count, dtype=np.int64)
            counts[split] = ks

    # --- groups (one KV piece of one tile, H items each) and their costs ----------------------------------------
    if counts is None:
        chunk = 0
        g_req, g_tile, g_start, g_end = tiles.req, tiles.index, start, end
        g_pbase = g_pstride = None
        num_partial = 0
        merge = (_ZERO1, _EMPTY, _EMPTY, _EMPTY)
    else:
        rows = tiles.row_array()
        owner, piece, g_start, g_end = split_ranges(start, end, counts, piece_granule)
        g_req, g_tile = tiles.req.take(owner), at(tiles.index, owner)
        g_rows = at(rows, owner)
        k = counts.take(owner)
        is_split = k > 1
        costs = g_end - g_start
        costs = costs * cost.beta
        costs += g_rows * (cost.alpha + cost.partial_row * is_split) + cost.gamma
        stats = None
        # Partial blocks: split tile t owns H*k*r rows from base[t]; head hh, piece j at base + (hh*k + j)*r.
        token_start = None
        if not tiles.decode:
            q64 = qo.astype(np.int64)
            token_start = np.add.accumulate(q64)
            token_start -= q64
        base_split, num_partial, merge = split_layout(
            split, ks, at(rows, split), tiles.req.take(split), at(tiles.index, split), token_start,
            num_heads=h, group_size=g, tile_rows=br,
        )  # fmt: skip
        base = np.empty(tiles.count, dtype=np.int64)
        base[split] = base_split
        g_pstride = np.where(is_split, k * g_rows, 0)
        g_pbase = base.take(owner)
        g_pbase += piece * g_rows
        g_pbase[~is_split] = -1

    asg = assign_items(costs, h, p, stats, prefix if counts is None else None)
    return WorkPlan(
        num_ctas=p,
        num_kv_heads=h,
        work_indptr=asg.work_indptr,
        group_req=g_req,
        group_tile=g_tile,
        group_kv_start=g_start,
        group_kv_end=g_end,
        group_partial=g_pbase,
        group_partial_stride=g_pstride,
        item_group=asg.group,
        item_head=asg.head,
        merge_indptr=merge[0],
        merge_src=merge[1],
        merge_dst_token=merge[2],
        merge_dst_head=merge[3],
        num_partial_rows=num_partial,
        chunk_size=chunk,
        assign_mode=asg.mode,
    )
