"""Lanes: the persistent CTAs in sets that each run all ``H`` KV heads of the same work.

A decode request is one query tile whose ``H`` items (one per KV head) cost the same. Balancing *lanes* of ``H`` CTAs
instead of single CTAs keeps that symmetry: lane ``l`` gets a run of groups (request pieces) and CTA ``l*H + h`` runs
head ``h`` of each of them, so every CTA of a lane carries the lane's load and the planner balances ``P / H`` lanes
of groups instead of ``P`` CTAs of items (8x fewer things to place for Llama-3-8B).

``P = L*H + r``: ``L`` full lanes and, when ``r > 0``, one *partial* lane of ``r`` CTAs at the end, where CTA
``L*H + j`` runs heads ``j, j + r, ...`` (``ceil(H/r)`` of them at most), so it takes ``1 / ceil(H/r)`` of a full
lane's work. E.g. 132 CTAs and 8 heads: 16 lanes of 8 CTAs and a lane of 4 CTAs running 2 heads each (weight 1/2).

``expand(gptr)`` turns lane boundaries in the group list (lane ``l`` runs groups ``gptr[l]:gptr[l+1]``) into the
CTA-major item lists the kernel reads; the result depends only on ``gptr`` and is cached (consecutive decode steps of
one batch mostly keep their lanes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Lanes:
    num_ctas: int
    num_heads: int
    full: int  # lanes of H CTAs
    rest: int  # CTAs of the partial lane (0: none)
    weight: float  # work of the partial lane relative to a full one (0.0 when there is none)

    @property
    def count(self) -> int:
        """Lanes, the partial one included."""
        return self.full + (1 if self.rest else 0)

    @property
    def width(self) -> float:
        """Total lane weight: how many full lanes' worth of work the CTAs take."""
        return self.full + self.weight


@functools.lru_cache(maxsize=64)
def lanes_of(num_ctas: int, num_heads: int) -> Lanes:
    full, rest = divmod(int(num_ctas), int(num_heads))
    weight = 1.0 / -(-num_heads // rest) if rest else 0.0
    return Lanes(int(num_ctas), int(num_heads), full, rest, weight)


def expand(gptr: np.ndarray, lanes: Lanes):
    """``(work_indptr, item_group, item_head)`` of the items in CTA-major order, for lane ``l`` running groups
    ``gptr[l]:gptr[l+1]`` (``gptr`` has ``lanes.count + 1`` entries). Cached by ``gptr``; the arrays are read-only."""
    key = (gptr.tobytes(), lanes.num_ctas, lanes.num_heads)
    hit = _EXPANDED.get(key)
    if hit is None:
        hit = _expand(gptr.astype(np.int64), lanes)
        for a in hit:
            a.flags.writeable = False
        if len(_EXPANDED) >= _CACHE_SIZE:
            _EXPANDED.pop(next(iter(_EXPANDED)))
        _EXPANDED[key] = hit
    return hit


_EXPANDED: dict = {}
_CACHE_SIZE = 64


def _expand(gptr: np.ndarray, lanes: Lanes):
    h, full, rest = lanes.num_heads, lanes.full, lanes.rest
    n = gptr[1:] - gptr[:-1]  # groups per lane
    # Full lanes: CTA l*H + hh runs groups gptr[l]:gptr[l+1] for head hh; lane l's items fill [H*gptr[l], H*gptr[l+1]).
    nf = n[:full]
    per_lane = nf * h
    start = gptr[:full] * h
    m = int(gptr[full]) * h
    off = np.arange(m)
    off -= start.repeat(per_lane)
    head, rank = np.divmod(off, nf.repeat(per_lane))
    group = rank
    group += gptr[:full].repeat(per_lane)
    counts = nf.repeat(h)
    if rest:
        # The partial lane: CTA j runs heads j, j + r, ... of each of its groups, head by head.
        g0, g1 = int(gptr[full]), int(gptr[full + 1])
        groups = np.arange(g0, g1)
        heads = [np.arange(j, h, rest) for j in range(rest)]
        group = np.concatenate([group] + [np.tile(groups, hs.shape[0]) for hs in heads])
        head = np.concatenate([head] + [hs.repeat(g1 - g0) for hs in heads])
        counts = np.concatenate([counts, np.array([hs.shape[0] * (g1 - g0) for hs in heads], dtype=np.int64)])
    indptr = np.zeros(lanes.num_ctas + 1, dtype=np.int64)
    np.add.accumulate(counts, out=indptr[1:])  # counts has one entry per CTA
    return indptr, group, head
