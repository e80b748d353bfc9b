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

import dataclasses
import functools

import numpy as np

from . import split_kv as _split_kv
from .assign import LINEAR_ITEMS_PER_CTA, assign_items
from .cost import DEFAULT_COST, CostModel
from .decode_plan import decode_planner
from .merge import split_layout
from .split_kv import DEFAULT_MIN_CHUNK, choose_split, fixed_counts, split_counts, split_ranges
from .tiles import at, lengths_and_range, tiles_of, whole_token_tiles
from .workplan import WorkPlan, natural_pack_fields, put_field  # noqa: F401  (put_field re-exported)

_EMPTY = np.zeros(0, dtype=np.int64)
_ZERO1 = np.zeros(1, dtype=np.int64)


def _tile_costs(tiles, n: np.ndarray, cost: CostModel, kv_hi: int | None) -> tuple:
    """``(costs, prefix)``: one head's cost of each whole tile, ``beta * kv + alpha * rows + gamma``, and their
    running sum (None without tiles). The prefix sum serves the linear assignment (the usual one for prefill, see
    ``assign._linear``) and gives the total.

    Integers when the terms are whole numbers (the default model: the prefix sum of the assignment is faster on
    integers): int32 when the tile arrays are int32 and twice the largest possible total fits int32 (every tile sees
    at most ``kv_hi`` keys and has at most Br rows; the linear cut doubles the prefix), else int64."""
    rows = tiles.rows
    count = tiles.count
    terms = cost.int_terms
    if terms is not None and not isinstance(rows, np.ndarray):
        alpha, beta, gamma = terms
        last = tiles.last
        fixed = alpha * rows + gamma
        dtype = _I64
        if n.dtype is _I32 and kv_hi is not None and 2 * count * (beta * kv_hi + fixed) < 2**31:
            dtype = _I32
        costs = n + _const(dtype, fixed)
        if beta != 1:
            costs += n * beta
            costs -= n
        if last is not None:  # the last tiles' missing rows
            short = tiles.short
            if alpha != 1:  # (in the costs' dtype: int32 only when every cost, alpha * Br included, fits)
                short = np.multiply(short, alpha, dtype=dtype)
            costs[last] -= short
        if not count:
            return costs, None
        prefix = np.empty(count, dtype=dtype)  # (accumulate without an out array costs ~1.6x as much)
        np.add.accumulate(costs, out=prefix)
        return costs, prefix
    costs = n * cost.beta
    costs += tiles.row_array() * cost.alpha + cost.gamma
    if not count:
        return costs, None
    prefix = np.empty(count + 1, dtype=costs.dtype)
    prefix[0] = 0
    np.add.accumulate(costs, out=prefix[1:])
    return costs, prefix


def _exact_stats(costs: np.ndarray, total: float) -> tuple:
    return total, float(np.maximum.reduce(costs)), float(np.minimum.reduce(costs))


def _bounds(costs: np.ndarray, total: float, kv_hi: int | None, br: int, h: int, p: int, cost: CostModel):
    """``(sum, hi, lo)`` in place of the exact ``(sum, max, min)`` of the tile costs where they make the same
    decisions, or None. Saves the two reductions over the costs (a few microseconds of the plan path).

    ``hi = beta * kv_hi + alpha * Br + gamma`` is at least every cost (a tile sees at most its request's keys and
    has at most Br rows; exact arithmetic for integral models) and ``lo = min(costs[0], costs[-1])`` at least the
    smallest. Given when those two tiles differ (so the costs are not all equal and ``hi > lo``) and
    ``hi * LINEAR_ITEMS_PER_CTA * P <= H * sum``: ``assign_items`` then takes the linear cut, as with the exact
    values (its first test holds for the larger ``hi``, its equal-costs test fails for both). The split policy's
    makespan estimate grows with the largest and the smallest cost, so "no split" under these bounds is "no split"
    exactly (with the default constants it always is: every tile is under 1/16 of a CTA's load); anything else is
    decided again on the exact values (``plan_checked``).
    """
    if kv_hi is None or not cost.integral:
        return None
    hi = float(cost.beta * kv_hi + cost.alpha * br + cost.gamma)
    if hi * LINEAR_ITEMS_PER_CTA * p > h * total:
        return None
    c0, c1 = costs.item(0), costs.item(-1)
    if c0 == c1:
        return None
    return total, hi, float(min(c0, c1))


def _balanced_under_bounds() -> bool:
    """Whether ``choose_split`` finds every batch balanced (no split) on ``_bounds``: bounds are only given when the
    largest cost ``hi`` is at most ``1 / LINEAR_ITEMS_PER_CTA`` of the mean CTA load ``M``, and then the unsplit
    makespan estimate is at most ``M + hi <= M * (L + 1) / L``, so ``M >= BALANCED_EFFICIENCY * estimate`` whenever
    ``BALANCED_EFFICIENCY * (L + 1) <= L`` (0.93 * 17 = 15.8 <= 16; 0.1 % kept for rounding). Read at call time: the
    split policy's constants are module attributes (tests change them)."""
    return _split_kv.BALANCED_EFFICIENCY * (LINEAR_ITEMS_PER_CTA + 1) <= 0.999 * LINEAR_ITEMS_PER_CTA


@functools.lru_cache(maxsize=32)
def _const(dtype, v: int) -> np.ndarray:
    """A read-only 0-d operand (NumPy calls with a Python scalar cost about twice as much on small arrays)."""
    c = np.array(v, dtype=dtype)
    c.flags.writeable = False
    return c


_I32 = np.dtype(np.int32)
_I64 = np.dtype(np.int64)


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
    pool_share: float = 0.0,
    always_sort: bool = False,
) -> WorkPlan:
    """Plan one batch: ``qo_lens[b]`` query tokens (``None``: decode, one each) attend ``kv_lens[b]`` KV tokens.

    ``group_size`` query heads share each of ``num_kv_heads`` KV heads; ``tile_rows`` packed rows make a query tile;
    ``num_ctas`` persistent CTAs run the items; chunk boundaries fall on multiples of ``kv_granule`` (the kernel's KV
    tile or page size). ``fixed_split_size`` (a multiple of ``kv_granule``) cuts every KV range at multiples of itself;
    ``disable_split`` never splits. ``min_chunk`` is the smallest piece the automatic policy cuts (tokens).
    ``kv_range = (min, max)`` of ``kv_lens`` and ``qo_range`` of ``qo_lens`` when the caller has them (those lengths
    then must be 1-D integer NumPy arrays, already checked non-negative): saves their reductions. ``pool_share``: the
    share of the cost a sorted assignment leaves to a shared tail (``assign.py``; only for kernels that take one);
    ``always_sort``: a sorted (largest first) assignment whatever the costs (``assign.assign_items``).

    Decode batches (``qo_lens`` None or all ones) with ``group_size <= tile_rows`` take the lane plan of
    ``decode_plan.py``; everything else the tile pipeline below.
    """
    h, g, br, p, gr = int(num_kv_heads), int(group_size), int(tile_rows), int(num_ctas), int(kv_granule)
    if min(h, g, br, p, gr) < 1:
        names = ("num_kv_heads", "group_size", "tile_rows", "num_ctas", "kv_granule")
        bad = [f"{nm}={v}" for nm, v in zip(names, (h, g, br, p, gr), strict=True) if v < 1]
        raise ValueError(f"plan_work: {', '.join(bad)} must be >= 1")
    if not 0.0 <= pool_share < 1.0:  # (NaN fails too)
        raise ValueError(
            f"plan_work: pool_share={pool_share} must be in [0, 1): the share of the cost left to a shared tail (0 for "
            "none; the prefill wrapper uses assign.POOL_SHARE)"
        )
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
        kv, kv_lo, kv_hi = lengths_and_range(kv_lens, "kv_lens")
    else:
        kv, (kv_lo, kv_hi) = kv_lens, kv_range
    qo = qo_lo = None
    if qo_lens is not None:
        if qo_range is None:
            qo, qo_lo, qo_hi = lengths_and_range(qo_lens, "qo_lens")
        else:
            qo, (qo_lo, qo_hi) = qo_lens, qo_range
        if qo.shape[0] != kv.shape[0]:
            raise ValueError(
                f"qo_lens has {qo.shape[0]} requests but kv_lens has {kv.shape[0]}; give one length per request in both"
            )
    else:
        qo_hi = None
    fs = None if fixed_split_size is None else int(fixed_split_size)
    return plan_checked(qo, kv, h, g, br, p, gr, bool(causal), int(window_left), fs, bool(disable_split), cost,
                        int(min_chunk), kv_lo, kv_hi, qo_lo, qo_hi, float(pool_share), bool(always_sort))  # fmt: skip


def plan_checked(
    qo: np.ndarray | None, kv: np.ndarray, h: int, g: int, br: int, p: int, gr: int, causal: bool, w: int,
    fixed_split_size: int | None, disable_split: bool, cost: CostModel, min_chunk: int, kv_lo: int | None,
    kv_hi: int | None, qo_lo: int | None, qo_hi: int | None, pool_share: float = 0.0, always_sort: bool = False,
) -> WorkPlan:  # fmt: skip
    """``plan_work`` on arguments it has checked (Python ints and bools, 1-D NumPy lengths, ``fixed_split_size`` a
    multiple of ``gr``, ``qo_lo`` / ``qo_hi`` the range of ``qo`` when given, ``kv_lo`` / ``kv_hi`` that of ``kv`` or
    None): the wrappers' plan() calls it directly, having validated all of that already."""
    if qo is not None and qo_lo == 1 and qo_hi == 1:
        qo = None  # every request has one query token: decode
    if qo is None and g <= br and fixed_split_size is None and kv.shape[0]:
        planner = decode_planner(h, g, br, p, gr, w, disable_split, cost, min_chunk)
        plan = planner.plan(kv, kv_lo, kv_hi)
        if plan is not None:
            return plan

    if qo is not None and w < 0 and br % g == 0 and kv.shape[0]:  # (tiles_of's choice, made here: one call less)
        tiles = whole_token_tiles(qo, kv, g, br, causal, qo_lo, qo_hi)
    else:
        tiles = tiles_of(qo, kv, g, br, causal, w, qo_lo)
    rows, start, end = tiles.rows, tiles.kv_start, tiles.kv_end
    n = end - start if isinstance(start, np.ndarray) else end
    costs, prefix = _tile_costs(tiles, n, cost, kv_hi)
    stats = bounds = None
    if tiles.count:
        total = float(prefix.item(-1))
        stats = bounds = _bounds(costs, total, kv_hi, br, h, p, cost) if fixed_split_size is None else None
        if bounds is None:
            stats = _exact_stats(costs, total)

    # --- split decision: which tiles are cut, into how many pieces -----------------------------------------------
    counts = None  # pieces per tile (None: nothing is split)
    chunk, piece_granule = 0, gr
    if fixed_split_size is not None:
        chunk = piece_granule = fixed_split_size
        counts = fixed_counts(start, end, chunk)
        split = (counts > 1).nonzero()[0]
        if split.shape[0]:
            ks = counts.take(split)
        else:
            counts = None
    elif not disable_split and tiles.count:
        if bounds is not None and _balanced_under_bounds():
            choice = None  # (what choose_split returns on these bounds, see _balanced_under_bounds)
        else:
            choice = choose_split(rows, n, stats, h, p, gr, cost, min_chunk)
        if choice is not None and bounds is not None:  # bounds did not settle it: the exact costs decide
            stats = _exact_stats(costs, stats[0])
            choice = choose_split(rows, n, stats, h, p, gr, cost, min_chunk)
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

    asg = assign_items(costs, h, p, stats, prefix if counts is None else None, pool_share, always_sort)
    # The dataclass __init__ with its 21 keywords costs microseconds: the fields are set in a copy of a dict that
    # holds them all (no resize while they go in).
    f = _PLAN_FIELDS.copy()
    f["num_ctas"], f["num_kv_heads"], f["work_indptr"], f["assign_mode"] = p, h, asg.work_indptr, asg.mode
    f["n_pool"] = asg.pool
    f["group_req"], f["group_tile"], f["group_kv_start"], f["group_kv_end"] = g_req, g_tile, g_start, g_end
    f["group_partial"], f["group_partial_stride"] = g_pbase, g_pstride
    f["item_group"], f["item_head"] = asg.group, asg.head
    f["merge_indptr"], f["merge_src"], f["merge_dst_token"], f["merge_dst_head"] = merge
    f["num_partial_rows"], f["chunk_size"] = num_partial, chunk
    if counts is None and asg.group is None:
        # Natural order, nothing split (most prefill plans): what sizes() and pack_fields() would derive on the
        # first pack, set here directly
        f["_sizes"] = (g_req.shape[0] * h, g_req.shape[0], 0, 0)
        f["_pack_fields"] = natural_pack_fields(g_req, g_tile, g_start, g_end, tiles.fixed)
    return WorkPlan.from_fields(f)


# Every WorkPlan field, with its default where it has one (plan_checked sets the others), and the memo slots of
# sizes() / pack_fields() (None: not computed)
_PLAN_FIELDS = {f.name: None if f.default is dataclasses.MISSING else f.default for f in dataclasses.fields(WorkPlan)}
_PLAN_FIELDS.update(_sizes=None, _pack_fields=None)
