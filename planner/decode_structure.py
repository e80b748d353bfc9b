"""The cached lane structure of a decode plan (``decode_plan.py``): everything that depends only on where the cuts of
the lane cut fall (which request, moved to its start, inside it), not on the cut positions themselves. A cut crosses a
request edge only every few steps of a serving loop, so most steps find their structure here and compute only the
cut positions.
"""

from __future__ import annotations

import numpy as np

from .lanes import Lanes, expand
from .merge import split_layout


class LaneRanges:
    """How the pieces' KV ranges follow from the cut positions, for one structure: group ``g`` is a piece of request
    ``g_req[g]``; the cut inside a request at ``pos[cut_idx[i]]`` starts group ``right[i]`` and ends group
    ``right[i] - 1``; every other range is the request's (window start, length). ``item_req`` is each item's request
    (CTA-major, int64), and ``patch`` / ``patch_pos`` the item positions whose start (``[0, n)``) or end
    (``[n, 2n)``) is a cut, and that cut's index in ``pos``."""

    def __init__(self, g_req: np.ndarray, right: np.ndarray, ig: np.ndarray, cut_idx: np.ndarray) -> None:
        self.g_req, self.right, self.right_m1, self.cut_idx = g_req, right, right - 1, cut_idx
        self.item_req = g_req.take(ig)
        cut_of = np.full(g_req.shape[0], -1, dtype=np.int64)
        cut_of[right] = np.arange(right.shape[0])
        starts = cut_of.take(ig)
        cut_of[:] = -1
        cut_of[self.right_m1] = np.arange(right.shape[0])
        ends = cut_of.take(ig)
        sp, ep = np.flatnonzero(starts >= 0), np.flatnonzero(ends >= 0)
        self.patch = np.concatenate([sp, ep + ig.shape[0]])
        self.patch_pos = cut_idx.take(np.concatenate([starts.take(sp), ends.take(ep)]))
        for a in (self.g_req, self.right, self.right_m1, self.cut_idx, self.item_req, self.patch, self.patch_pos):
            a.flags.writeable = False

    def group_ranges(self, kv: np.ndarray, starts: np.ndarray | int, pos: np.ndarray) -> tuple:
        """``(group_kv_start, group_kv_end)`` of the pieces, from every cut's position ``pos``."""
        cut = pos.take(self.cut_idx)
        g_end = kv.take(self.g_req)
        g_end[self.right_m1] = cut  # a cut ends the piece before it ...
        g_start = starts.take(self.g_req) if isinstance(starts, np.ndarray) else np.zeros_like(g_end)
        g_start[self.right] = cut  # ... and starts the one after it
        return g_start, g_end


class LaneStructure:
    """The cached facts of one lane structure (see ``lane_structure``)."""

    __slots__ = ("ranges", "g_part", "g_stride", "wi", "ig", "ih", "fixed_items", "merge", "rows_partial", "n_cut",
                 "blocks", "fields")  # fmt: skip


_STRUCTURES: dict = {}
STRUCTURE_CACHE_SIZE = 64


def lane_structure(
    b: int,
    req: np.ndarray,
    keeps_start: np.ndarray,
    inside: np.ndarray,
    lanes: Lanes,
    h: int,
    g: int,
    br: int,
    order: np.ndarray | None = None,
) -> LaneStructure:
    """Everything that depends only on where the cuts fall (which request, moved to its start, inside it): the
    groups' requests and ranges (``LaneRanges``), the CTA-major item lists with their requests, heads and partial
    rows, the merge list, the partial rows in all, the number of cuts and the pack memo. Cached (read-only).
    ``req`` are line positions; ``order[p]`` is the request at line position ``p`` (None: the requests in order)."""
    key = (b, h, g, br, lanes.num_ctas, req.tobytes(), keeps_start.tobytes(), inside.tobytes(),
           None if order is None else order.tobytes())  # fmt: skip
    hit = _STRUCTURES.get(key)
    if hit is not None:
        return hit
    cut_req = req[inside]
    # First group of the lane after each cut: groups run in line order, one per request plus one per cut inside a
    # request, so it is req (+1 unless the cut moved to req's start) + the cuts inside requests before it.
    gidx = np.add.accumulate(inside, dtype=np.int64)
    gidx -= inside
    gidx += req
    gidx += keeps_start
    pieces = np.bincount(cut_req, minlength=b)
    pieces += 1
    n_groups = b + cut_req.shape[0]
    g_req = np.arange(b).repeat(pieces)
    right = cut_req + np.arange(1, cut_req.shape[0] + 1)  # group index of the piece right of each cut
    split = np.flatnonzero(pieces > 1)
    ks = pieces.take(split)
    # Partial rows: split request t owns H*k*g rows from base[t]; head hh, piece j at base + (hh*k + j)*g.
    split_req = split if order is None else order.take(split)
    base, rows_partial, merge = split_layout(split, ks, g, split_req, 0, None, num_heads=h, group_size=g, tile_rows=br)
    first = np.add.accumulate(pieces) - pieces
    piece = np.arange(n_groups) - first.repeat(pieces)
    k = pieces.repeat(pieces)
    req_base = np.full(b, -1, dtype=np.int64)
    req_base[split] = base
    g_part = req_base.repeat(pieces) + piece * g
    g_stride = k * g
    whole = k == 1
    g_part[whole] = -1
    g_stride[whole] = 0
    gptr = np.full(lanes.count + 1, n_groups, dtype=np.int64)
    gptr[0] = 0
    gptr[1 : gidx.shape[0] + 1] = gidx
    if order is not None:
        g_req = order.astype(np.int64).take(g_req)  # line positions -> requests
    wi, ig, ih = expand(gptr, lanes)
    item_part = g_part.take(ig)
    item_part += ih * g_stride.take(ig)
    st = LaneStructure()
    st.ranges = LaneRanges(g_req, right, ig, np.flatnonzero(inside))
    st.fixed_items = {
        "item_req": g_req.take(ig).astype(np.int32),
        "item_kv_head": ih.astype(np.int32),
        "item_partial": item_part.astype(np.int32),
    }
    st.merge = tuple(a.astype(np.int32) for a in merge)
    for a in (g_part, g_stride, *st.fixed_items.values(), *st.merge):
        a.flags.writeable = False
    st.g_part, st.g_stride, st.wi, st.ig, st.ih = g_part, g_stride, wi, ig, ih
    st.rows_partial, st.n_cut, st.blocks = rows_partial, int(cut_req.shape[0]), {}
    # The WorkPlan fields of a plan of this structure but its ranges, chunk size and cuts (see DecodePlanner._cut).
    st.fields = dict(
        num_ctas=lanes.num_ctas, num_kv_heads=h, work_indptr=wi, group_req=g_req, group_tile=0, group_kv_start=None,
        group_kv_end=None, group_partial=g_part, group_partial_stride=g_stride, item_group=ig, item_head=ih,
        merge_indptr=st.merge[0], merge_src=st.merge[1], merge_dst_token=st.merge[2], merge_dst_head=st.merge[3],
        num_partial_rows=rows_partial, chunk_size=0, assign_mode="lanes", item_values=st.fixed_items,
        pack_blocks=st.blocks, lane_cuts=None,
    )  # fmt: skip
    if len(_STRUCTURES) >= STRUCTURE_CACHE_SIZE:
        _STRUCTURES.pop(next(iter(_STRUCTURES)))
    _STRUCTURES[key] = st
    return st
