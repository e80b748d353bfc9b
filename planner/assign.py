"""Assigning work items to CTAs: largest first to the least-loaded CTA, vectorised.

Items come in *groups*: a group is one KV chunk of one query tile, and holds ``H = num_kv_heads`` items of the same
cost (one per KV head). The *natural order* of items is head major: item ``i`` is group ``i % G`` of head ``i // G``.
The result lists every CTA's items contiguously (CTA-major), the form the persistent kernel reads.

The paper's schedule is LPT (longest processing time first): items sorted by cost, each popped onto the CTA with the
smallest load so far (a heap). A Python heap loop over ~1000 items costs ~1 ms; this module reaches the same balance
with a constant number of NumPy calls, in one of three ways:

- ``n <= P`` (one wave): item ``i`` goes to CTA ``i``; the makespan is the largest item whatever we do.
- *Linear*: when items are small next to the mean load (``max <= mean / LINEAR_ITEMS_PER_CTA``) or all equal, the
  items in natural order are cut into ``P`` consecutive runs of about ``mean`` each (an item goes to the run holding
  its midpoint). A CTA's load is within half an item of ``mean`` at each end, so the error is at most one (small)
  item; equal items get ``floor`` or ``ceil(n/P)`` each, which is optimal. No sort, which matters for prefill
  (thousands of items), and each CTA's items are neighbours (same head, adjacent tiles: shared KV in L2).
- *Sorted* (LPT in two phases): items sorted by cost, largest first. Phase 1 is LPT's first round: the ``P``
  largest items one per CTA. Phase 2 is LPT's fill: the remaining items (each no larger than any phase-1 item), still
  in descending order, are laid along the CTAs from the least loaded up, each CTA taking a stretch as long as its gap
  to the common *water level* ``T`` (the level at which the gaps exactly hold the remaining cost; CTAs whose gap is
  under half the smallest item are left out, as LPT would never reach them). An item goes to the CTA whose stretch
  holds its midpoint. Big items land on empty CTAs, small items fill the gaps, and the error at each stretch boundary
  is at most half of the (small, late) items there.

All three keep Graham's list-scheduling guarantee in the cases the tests check: max load <= mean + largest item.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Items this much smaller than the mean CTA load are balanced by the linear cut (no sort).
LINEAR_ITEMS_PER_CTA = 16


@dataclass(frozen=True)
class Assignment:
    """``work_indptr[c]:work_indptr[c+1]`` are CTA ``c``'s items; ``group``/``head`` give each item (CTA-major).

    ``group`` and ``head`` are ``None`` when the items are in natural (head-major) order: item ``i`` is group
    ``i % G`` of head ``i // G``; building the per-item arrays is then a broadcast instead of a gather.
    """

    work_indptr: np.ndarray  # int64 [P + 1]
    group: np.ndarray | None  # int64 [n] or None
    head: np.ndarray | None  # int64 [n] or None
    mode: str  # "one-wave", "linear" or "sorted" (for tests and benchmarks)


def assign_items(costs: np.ndarray, num_heads: int, num_ctas: int) -> Assignment:
    """Assign ``num_heads`` copies of every group cost in ``costs`` (float64, > 0) to ``num_ctas`` CTAs."""
    g = costs.shape[0]
    h = int(num_heads)
    p = int(num_ctas)
    n = g * h
    if n <= p:
        indptr = np.minimum(np.arange(p + 1, dtype=np.int64), n)
        return Assignment(indptr, None, None, "one-wave")
    cmax = float(costs.max())
    mean = h * float(costs.sum()) / p
    if cmax * LINEAR_ITEMS_PER_CTA <= mean or cmax == float(costs.min()):
        return _linear(costs, h, p)
    return _sorted(costs, h, p)


def _linear(costs: np.ndarray, h: int, p: int) -> Assignment:
    g = costs.shape[0]
    n = g * h
    ends = np.cumsum(costs)
    per_head = float(ends[-1])
    mid = ends - 0.5 * costs
    # CTA c starts at the first item whose midpoint is at or past c * total / P; item (head k, group j) sits at
    # k * per_head + mid[j] along the line.
    x = np.arange(1, p, dtype=np.float64) * (h * per_head / p)
    head = np.minimum(np.floor(x / per_head), h - 1)
    grp = np.searchsorted(mid, x - head * per_head, side="left")
    indptr = np.empty(p + 1, dtype=np.int64)
    indptr[0] = 0
    indptr[1:p] = head.astype(np.int64) * g + grp
    indptr[p] = n
    return Assignment(indptr, None, None, "linear")


def _sorted(costs: np.ndarray, h: int, p: int) -> Assignment:
    g = costs.shape[0]
    n = g * h
    order = np.argsort(-costs, kind="stable")
    cs = costs[order]
    # Rank r (0 = largest) is head r % H of sorted group r // H.
    # Phase 1: rank r < P goes to CTA P-1-r, so loads ascend with the CTA index (the fill order of phase 2).
    ctas = np.arange(p, dtype=np.int64)
    load = cs[(p - 1 - ctas) // h]
    gs = np.empty(g + 1, dtype=np.float64)  # gs[j]: line position where sorted group j starts
    gs[0] = 0.0
    np.cumsum(cs * h, out=gs[1:])
    x0 = gs[p // h] + (p % h) * cs[p // h]  # line position of rank P
    rest = gs[g] - x0
    # Water level over the k least-loaded CTAs; keep the CTAs whose gap holds at least half the smallest item.
    level = (rest + np.cumsum(load)) / np.arange(1, p + 1)
    k = max(int(np.count_nonzero(level - load >= 0.5 * cs[-1])), 1)
    bounds = x0 + np.cumsum(level[k - 1] - load[: k - 1])  # where the stretches of CTAs 0..k-2 end
    # First rank whose midpoint is at or past each bound: its group, then its head within the group.
    j = np.minimum(np.searchsorted(gs[1:] - 0.5 * cs, bounds, side="left"), g - 1)
    hh = np.clip(np.ceil((bounds - gs[j]) / cs[j] - 0.5), 0, h)
    cut = np.empty(k + 1, dtype=np.int64)
    cut[0] = p
    cut[1:k] = np.clip(j * h + hh.astype(np.int64), p, n)
    cut[k] = n
    counts = np.ones(p, dtype=np.int64)
    counts[:k] += np.diff(cut)
    indptr = np.empty(p + 1, dtype=np.int64)
    indptr[0] = 0
    np.cumsum(counts, out=indptr[1:])
    # Rank at each output position: CTA c's block is [its phase-1 rank P-1-c, then its phase-2 ranks in order].
    # A phase-2 item at position q of CTA c has rank P + (q - c - 1) (c phase-1 items precede it, plus c's own).
    rank = np.arange(n, dtype=np.int64) + (p - 1) - np.repeat(ctas, counts)
    rank[indptr[:-1]] = p - 1 - ctas
    j_item, head = np.divmod(rank, h)
    return Assignment(indptr, order[j_item], head, "sorted")


def cta_loads(assignment: Assignment, costs: np.ndarray, num_heads: int) -> np.ndarray:
    """Sum of item costs per CTA (for tests and benchmarks)."""
    g = costs.shape[0]
    n = g * int(num_heads)
    group = assignment.group if assignment.group is not None else np.arange(n) % g
    per_item = costs[group]
    starts = assignment.work_indptr[:-1]
    sums = np.add.reduceat(per_item, np.minimum(starts, max(n - 1, 0))) if n else np.zeros(starts.shape[0])
    return np.where(np.diff(assignment.work_indptr) > 0, sums, 0.0)
