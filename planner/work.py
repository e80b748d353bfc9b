"""``plan_work``: sequence lengths in, a ``WorkPlan`` out (the arrays of docs/internals.md, "Work plans").

Pipeline: query tiles and their KV ranges (``tiles``), the split decision (``split_kv``), the chunks, their costs
(``cost``), CTA assignment (``assign``), partial-state blocks and the merge list (``merge``).

A ``WorkPlan`` keeps its items compactly: per *group* (one KV chunk of one query tile: ``H`` items, one per KV head)
arrays plus the assignment. The per-item arrays of the contract (``item_req`` ...) are properties built on first use;
``layout.pack`` writes them straight into the plan buffer (a broadcast per array in natural order), which is what
keeps ``plan()`` in tens of microseconds on a small host CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .assign import assign_items
from .cost import DEFAULT_COST, CostModel
from .merge import split_layout
from .split_kv import DEFAULT_MIN_CHUNK, _choose, fixed_counts, split_counts, split_ranges
from .tiles import at, query_tiles

_EMPTY = np.zeros(0, dtype=np.int64)
_ZERO1 = np.zeros(1, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class WorkPlan:
    """A schedule of work items over ``num_ctas`` persistent CTAs (integer NumPy arrays; the packed form is int32).

    Items: CTA ``c`` runs ``work_indptr[c]:work_indptr[c+1]``; item ``i`` is group ``item_group[i]`` for KV head
    ``item_head[i]``, or, when those are ``None``, group ``i % G`` for head ``i // G`` (natural order).
    """

    num_ctas: int
    num_kv_heads: int
    work_indptr: np.ndarray  # [num_ctas + 1]
    group_req: np.ndarray  # [G] request
    group_tile: np.ndarray | int  # [G] query tile within the request (0 for decode)
    group_kv_start: np.ndarray | int  # [G] KV range [start, end) (start 0 for all: an int)
    group_kv_end: np.ndarray
    group_partial: np.ndarray | None  # [G] partial row of head 0's block, -1 unsplit (None: nothing split)
    group_partial_stride: np.ndarray | None  # [G] rows between consecutive heads' blocks (0 unsplit)
    item_group: np.ndarray | None  # [n] (None: natural order)
    item_head: np.ndarray | None
    merge_indptr: np.ndarray  # [n_merge + 1]
    merge_src: np.ndarray  # [n_merge_src] partial rows, KV order within an output row
    merge_dst_token: np.ndarray  # [n_merge] global query token
    merge_dst_head: np.ndarray  # [n_merge] query head
    num_partial_rows: int
    chunk_size: int  # KV chunk the tiles were split at (0: none)
    assign_mode: str  # see assign.py

    @property
    def n_groups(self) -> int:
        return int(self.group_req.shape[0])

    @property
    def n_items(self) -> int:
        if self.item_group is not None:
            return int(self.item_group.shape[0])
        return self.n_groups * self.num_kv_heads

    @classmethod
    def from_items(cls, num_ctas: int, work_indptr, items: dict, merge: dict, num_partial_rows: int,
                   chunk_size: int = 0, assign_mode: str = "explicit") -> WorkPlan:  # fmt: skip
        """A plan from explicit per-item arrays (``items[name]`` for the six item arrays, ``merge[name]`` for the
        four merge arrays), e.g. read back from a packed buffer."""
        n = len(items["item_req"])
        heads = np.asarray(items["item_kv_head"], dtype=np.int64)
        return cls(
            num_ctas=num_ctas,
            num_kv_heads=int(heads.max()) + 1 if n else 1,
            work_indptr=np.asarray(work_indptr, dtype=np.int64),
            group_req=np.asarray(items["item_req"], dtype=np.int64),
            group_tile=np.asarray(items["item_qo_tile"], dtype=np.int64),
            group_kv_start=np.asarray(items["item_kv_start"], dtype=np.int64),
            group_kv_end=np.asarray(items["item_kv_end"], dtype=np.int64),
            group_partial=np.asarray(items["item_partial"], dtype=np.int64),
            group_partial_stride=np.zeros(n, dtype=np.int64),
            item_group=np.arange(n),
            item_head=heads,
            merge_indptr=np.asarray(merge["merge_indptr"], dtype=np.int64),
            merge_src=np.asarray(merge["merge_src"], dtype=np.int64),
            merge_dst_token=np.asarray(merge["merge_dst_token"], dtype=np.int64),
            merge_dst_head=np.asarray(merge["merge_dst_head"], dtype=np.int64),
            num_partial_rows=int(num_partial_rows),
            chunk_size=int(chunk_size),
            assign_mode=assign_mode,
        )

    @property
    def n_merge(self) -> int:
        return int(self.merge_dst_token.shape[0])

    @property
    def n_merge_src(self) -> int:
        return int(self.merge_src.shape[0])

    # --- per-item arrays of the contract (CTA-major), built on first use -------------------------------------------
    def item_fields(self):
        """``{name: (values, per_group)}`` for the six item arrays: ``per_group`` True means ``values`` has one
        entry per group and the items (natural order) are its head-major broadcast; else one entry per item."""
        return self._fields

    @functools.cached_property
    def _fields(self):
        h = self.num_kv_heads
        split = self.group_partial is not None
        if self.item_group is None:
            heads = np.arange(h)[:, None]
            part = (self.group_partial + heads * self.group_partial_stride) if split else None
            return {
                "item_req": (self.group_req, True),
                "item_qo_tile": (self.group_tile, True),
                "item_kv_head": (heads, True),
                "item_kv_start": (self.group_kv_start, True),
                "item_kv_end": (self.group_kv_end, True),
                "item_partial": (part if split else -1, True),
            }
        idx, head = self.item_group, self.item_head
        part = -1
        if split:
            part = self.group_partial.take(idx)
            part += head * self.group_partial_stride.take(idx)
        fields = {
            "item_req": (self.group_req.take(idx), False),
            "item_qo_tile": (at(self.group_tile, idx), False),
            "item_kv_head": (head, False),
            "item_kv_start": (at(self.group_kv_start, idx), False),
            "item_kv_end": (self.group_kv_end.take(idx), False),
            "item_partial": (part, False),
        }
        return fields

    def _item(self, name: str) -> np.ndarray:
        values, per_group = self._fields[name]
        out = np.empty(self.n_items, dtype=np.int32)
        if per_group:
            out.reshape(self.num_kv_heads, self.n_groups)[:] = values
        else:
            out[:] = values
        return out

    item_req = property(lambda self: self._item("item_req"))
    item_qo_tile = property(lambda self: self._item("item_qo_tile"))
    item_kv_head = property(lambda self: self._item("item_kv_head"))
    item_kv_start = property(lambda self: self._item("item_kv_start"))
    item_kv_end = property(lambda self: self._item("item_kv_end"))
    item_partial = property(lambda self: self._item("item_partial"))


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
) -> WorkPlan:
    """Plan one batch: ``qo_lens[b]`` query tokens (``None``: decode, one each) attend ``kv_lens[b]`` KV tokens.

    ``group_size`` query heads share each of ``num_kv_heads`` KV heads; ``tile_rows`` packed rows make a query tile;
    ``num_ctas`` persistent CTAs run the items; chunk boundaries fall on multiples of ``kv_granule`` (the kernel's KV
    tile or page size). ``fixed_split_size`` (a multiple of ``kv_granule``) cuts every KV range at multiples of itself;
    ``disable_split`` never splits. ``min_chunk`` is the smallest piece the automatic policy cuts (tokens).
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

    tiles = query_tiles(qo_lens, kv_lens, group_size=g, tile_rows=br, causal=causal, window_left=window_left)
    rows, start, end = tiles.rows, tiles.kv_start, tiles.kv_end
    n = end - start if isinstance(start, np.ndarray) else end
    costs = n * cost.beta  # one tile, one head, unsplit
    costs += rows * cost.alpha + cost.gamma
    stats = None
    if tiles.count:
        stats = (float(np.add.reduce(costs)), float(np.maximum.reduce(costs)), float(np.minimum.reduce(costs)))

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
            qo = np.asarray(qo_lens, dtype=np.int64)
            token_start = np.add.accumulate(qo)
            token_start -= qo
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

    asg = assign_items(costs, h, p, stats)
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
