"""Assigning work items to CTAs: largest first to the least-loaded CTA, in a bounded number of NumPy calls.

Items come in *groups*: a group is one KV piece of one query tile and holds ``H = num_kv_heads`` items of equal cost
(one per KV head). The *natural order* of the ``n = G*H`` items is head major: item ``i`` is group ``i % G`` of head
``i // G``. The result lists each CTA's items contiguously (CTA-major), the form the persistent kernel reads.

The paper's schedule is LPT (longest processing time first): sort the items by cost and pop each onto the CTA with the
smallest load (a heap). A Python heap loop over ~1000 items costs ~1 ms here, and exact LPT in blocks of NumPy calls
needs about ``n / P`` blocks. This module reaches LPT's balance (within ~1 % on docs/benchmarks.md's cases) by choosing:

- ``one-wave`` (``n <= P``): item ``i`` on CTA ``i``. The makespan is the largest item whatever we do.
- ``linear``: when the items are small next to the mean load (``x_max * LINEAR_ITEMS_PER_CTA <= mean``) or nearly
  equal (``x_max <= NEAR_EQUAL * x_min``), the items in natural order are cut into ``P`` consecutive runs of about
  ``mean`` each (an item goes to the run holding its midpoint). A load is off ``mean`` by at most half an item at each
  end, and (nearly) equal items get ``floor`` or ``ceil(n/P)`` each, which is optimal. No sort, which matters for
  prefill (tens of thousands of items), and a CTA's items are neighbours (same head, adjacent tiles: KV in L2).
- sorted by cost, largest first, the better of:

  * ``snake``: deal in rounds of ``P``, alternating direction (CTA 0..P-1, then P-1..0, ...): in round 1 the largest
    remaining item meets the CTA that got the smallest first item, as in LPT. For broad length distributions
    (uniform, log-normal) it is within a percent or two of LPT; its order depends only on ``(n, P, H)`` and is cached.
  * ``fill``: LPT's first rounds exactly (round 0, then up to ``FILL_EXACT_ROUNDS`` rounds of the next items onto the
    least-loaded CTAs while LPT would make the same choices and the items are big next to what is left per CTA), then
    the rest, still largest first, laid along the CTAs from the least loaded up, each CTA taking a stretch as long as
    its gap to the *water level* (where the gaps exactly hold the remaining cost; a CTA whose gap is under the
    smallest item is left out: LPT would reach it last). An item goes to the CTA whose stretch holds its midpoint.
    This is LPT's shape when a long request's pieces sit among many short requests (D8, D9), where the snake keeps
    feeding the CTAs that hold the pieces.

  The snake is computed first (a few calls) and kept when within ``SNAKE_GOOD`` of the lower bound
  ``max(x_max, mean)``; the fill is kept only when it beats the snake.

- ``pool_share > 0`` (kernels that take a shared tail: the prefill kernel): the snake deals only the items up to the
  smallest ones that hold ``pool_share`` of the cost; those (the *pool*) follow every CTA's list, largest first, and
  the CTAs take them one at a time as they finish (``Assignment.pool``). The model balances the lists, but the CTAs do
  not run at the model's speed: on the H200 their end times scatter by ~6 us (std) around the mean whatever the
  plan, so the slowest of 264 lags the mean by ~15-20 us (1-3.5 % of P1-P6). A pool of small items lets the CTAs that
  run fast take the work of those that run slow.

Graham's list-scheduling bound, max load <= mean + largest item, holds for every result: the snake and one-wave are
round-based (a CTA gets at most one item per round, so it carries at most the largest item of each round, and the
mean carries at least the smallest of each full round), the linear cut is off the mean by at most one item, and a
fill is only kept when it beats the snake.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

#: Items at most ``mean / LINEAR_ITEMS_PER_CTA`` are balanced by the linear cut (no sort).
LINEAR_ITEMS_PER_CTA = 16
#: Items within this ratio of each other are "nearly equal": the linear cut is optimal for them.
NEAR_EQUAL = 1.1
#: The snake deal is kept without trying the fill when its makespan is within this factor of the lower bound.
SNAKE_GOOD = 1.03
#: The fill places items exactly as LPT for at most this many rounds after the first ...
FILL_EXACT_ROUNDS = 4
#: ... while the next item is more than 1/FILL_BIG of what is left per CTA (smaller items fill within a few %).
FILL_BIG = 16
#: Share of the cost left to the shared tail (``pool_share``) by callers whose kernel takes one (prefill).
POOL_SHARE = 0.04


@dataclass(frozen=True)
class Assignment:
    """``work_indptr[c]:work_indptr[c+1]`` are CTA ``c``'s items, whose groups and heads are ``group``/``head``.

    ``group`` and ``head`` are ``None`` in natural (head-major) order: item ``i`` is group ``i % G`` of head
    ``i // G``; the per-item arrays are then broadcasts of the per-group ones instead of gathers.
    """

    work_indptr: np.ndarray  # int64 [P + 1]
    group: np.ndarray | None  # int64 [n] or None
    head: np.ndarray | None  # int64 [n] or None
    mode: str  # "one-wave", "linear", "snake" or "fill"
    pool: int = 0  # items past work_indptr[P] (the last ones): the shared tail, taken one at a time


def assign_items(
    costs: np.ndarray, num_heads: int, num_ctas: int, stats: tuple[float, float, float] | None = None,
    prefix: np.ndarray | None = None, pool_share: float = 0.0, always_sort: bool = False,
) -> Assignment:  # fmt: skip
    """Assign ``num_heads`` items of each group cost in ``costs`` (float64, int64 or int32, all > 0) to ``num_ctas``
    CTAs; with ``pool_share > 0``, sorted deals leave their smallest items to a shared tail (the module docstring).
    ``always_sort``: deal largest first (and leave the pool) even where the linear cut would balance the lists (the
    Hopper prefill kernel: 6-7 % faster on P2 / P3 than in the linear cut's natural order; results h200-2026-12-03).

    ``stats`` is ``(sum, max, min)`` of ``costs`` and ``prefix`` their running sum when the caller already has them
    (``G`` entries, or ``G + 1`` with a leading 0; it may be overwritten). ``max`` and ``min`` may be bounds that
    make the same decisions (``plan_work``'s ``_bounds``).
    """
    g = costs.shape[0]
    h = int(num_heads)
    p = int(num_ctas)
    n = g * h
    if n <= p:
        return Assignment(np.minimum(np.arange(p + 1), n), None, None, "one-wave")
    total, cmax, cmin = stats if stats is not None else (float(costs.sum()), float(costs.max()), float(costs.min()))
    if always_sort:
        return _sorted(costs.astype(np.float64, copy=False), h, p, total, pool_share)
    if cmax == cmin:
        # Equal items: CTA c starts at the first item whose midpoint (i + 1/2) reaches c*n/P.
        indptr = np.arange(0, 2 * n * (p + 1), 2 * n)
        indptr += p - 1
        indptr //= 2 * p
        return Assignment(indptr, None, None, "linear")
    if cmax * LINEAR_ITEMS_PER_CTA * p <= h * total or cmax <= NEAR_EQUAL * cmin:
        return _linear(costs, h, p, prefix)
    return _sorted(costs.astype(np.float64, copy=False), h, p, total, pool_share)


def _linear(costs: np.ndarray, h: int, p: int, prefix: np.ndarray | None = None) -> Assignment:
    g = costs.shape[0]
    # (the caller's prefix is not needed after: it may be overwritten)
    if costs.dtype.kind == "f":
        mid = np.add.accumulate(costs) if prefix is None else prefix[-g:]
        per_head = float(mid[-1])
        mid -= 0.5 * costs  # cost laid out before each group's midpoint, within one head
    elif prefix is not None and prefix.shape[0] == g + 1:  # a running sum after a leading 0: one add
        mid = prefix[1:] + prefix[:-1]  # integer costs: twice the midpoint, exactly (the targets are doubled too)
        per_head = 2.0 * float(prefix[-1])
    else:
        mid = np.add.accumulate(costs) if prefix is None else prefix
        per_head = 2.0 * float(mid[-1])
        mid += mid
        mid -= costs
    # Item (head k, group j) has its midpoint at k * per_head + mid[j] along the line; CTA c starts at the first item
    # whose midpoint is at or past c * total / P: the head by division, the group by bisection.
    if p % h == 0:  # P/H CTAs per head, the same cut in every head: one bisection of P/H + 1 points
        frac, head, col = _per_head_cuts(p, h)
        keys = frac * per_head
        if mid.dtype.kind == "i" and per_head < 2.0**53:
            # Integer midpoints below 2**53 (exact as floats): mid >= key exactly when mid >= ceil(key), and an
            # integer bisection skips the float copy of mid that a float key costs.
            # (in mid's dtype when they fit it: keys of another dtype would make searchsorted convert all of mid)
            keys = np.ceil(keys, out=keys).astype(mid.dtype if per_head < 2.0**31 else np.int64)
        indptr = mid.searchsorted(keys).take(col)  # CTA c = k * P/H + i starts at cut i of head k
        indptr += head * g
        indptr[p] = g * h
        return _natural(indptr, "linear")
    x = np.arange(p + 1, dtype=np.float64)
    x *= h / p  # in units of per_head
    head = x.astype(np.int64)  # floor (x >= 0)
    x -= head
    x *= per_head
    indptr = mid.searchsorted(x)
    head *= g
    indptr += head
    np.minimum(indptr, g * h, out=indptr)
    indptr[p] = g * h
    return Assignment(indptr, None, None, "linear")


def _natural(work_indptr: np.ndarray, mode: str) -> Assignment:
    """``Assignment(work_indptr, None, None, mode)`` without the frozen dataclass ``__init__`` (a microsecond of
    ``object.__setattr__`` calls on the plan path)."""
    a = object.__new__(Assignment)
    object.__setattr__(a, "__dict__", {"work_indptr": work_indptr, "group": None, "head": None, "mode": mode})
    return a


@functools.lru_cache(maxsize=64)
def _per_head_cuts(p: int, h: int):
    """``(c / q for c = 0..q, c // q and c % q for c = 0..P)`` with ``q = P / H`` CTAs per head (read-only): CTA
    ``c`` is the ``c % q``-th cut of head ``c // q``."""
    q = p // h
    frac = np.arange(q + 1, dtype=np.float64)
    frac /= q
    head, col = np.divmod(np.arange(p + 1, dtype=np.int64), q)
    frac.flags.writeable = head.flags.writeable = col.flags.writeable = False
    return frac, head, col


def _sorted(costs: np.ndarray, h: int, p: int, total: float, pool_share: float = 0.0) -> Assignment:
    g = costs.shape[0]
    n = g * h
    order = (-costs).argsort()
    if pool_share > 0.0:
        # Whole groups from the smallest up while they hold at most pool_share of the cost, leaving at least one
        # item per CTA to the lists; the snake deals the rest.
        tail = np.add.accumulate(costs.take(order[::-1]))
        pool = h * min(int(tail.searchsorted(pool_share * total, side="right")), max(0, (n - p) // h))
        if pool:
            indptr, j, head = _snake_pool_order(n, pool, p, h)
            return Assignment(indptr, order.take(j), head, "snake+pool", pool)
    x = costs.take(order).repeat(h)  # cost of rank r (0 = largest): head r % H of sorted group r // H
    rounds = -(-n // p)
    snake = float(np.maximum.reduce(_snake_loads(x, n, p, rounds)))
    bound = max(float(x[0]), total * h / p)  # no assignment does better than this
    if snake > SNAKE_GOOD * bound:
        fill = _Fill(x, n, p)
        if fill.makespan < snake:
            indptr, rank = fill.order()
            j, head = np.divmod(rank, h)
            return Assignment(indptr, order.take(j), head, "fill")
    indptr, j, head = _snake_order(n, p, h)
    return Assignment(indptr, order.take(j), head, "snake")


def _snake_loads(x: np.ndarray, n: int, p: int, rounds: int) -> np.ndarray:
    """Loads of the snake deal: round q gives rank q*P + i to CTA i (q even) or P-1-i (q odd)."""
    grid = np.zeros(rounds * p)
    grid[:n] = x
    grid = grid.reshape(rounds, p)
    loads = grid[0::2].sum(axis=0)
    loads += grid[1::2, ::-1].sum(axis=0)
    return loads


@functools.lru_cache(maxsize=64)
def _snake_order(n: int, p: int, h: int):
    """``(work_indptr, sorted group, head)`` of each item in CTA-major order for the snake deal of ``n`` items.

    Depends only on the sizes, so consecutive decode steps of one batch size reuse it (the arrays are read-only).
    """
    rounds = -(-n // p)
    last = n - (rounds - 1) * p  # items in the last round
    counts = np.full(p, rounds - 1)
    if rounds % 2:
        counts[:last] += 1
    else:
        counts[p - last :] += 1
    indptr = np.zeros(p + 1, dtype=np.int64)
    np.add.accumulate(counts, out=indptr[1:])
    ctas = np.arange(p)[:, None]
    grid = np.where(np.arange(rounds) % 2 == 0, ctas, p - 1 - ctas)  # [cta, round]
    grid += np.arange(0, rounds * p, p)
    rank = grid.reshape(-1)
    if last != p:
        rank = rank[rank < n]
    j, head = np.divmod(rank, h)
    for a in (indptr, j, head):
        a.flags.writeable = False
    return indptr, j, head


@functools.lru_cache(maxsize=64)
def _snake_pool_order(n: int, pool: int, p: int, h: int):
    """``_snake_order`` of the first ``n - pool`` ranks, then the ``pool`` last ranks in rank order (read-only)."""
    indptr, j, head = _snake_order(n - pool, p, h)
    jp, hp = np.divmod(np.arange(n - pool, n, dtype=np.int64), h)
    j, head = np.concatenate((j, jp)), np.concatenate((head, hp))
    j.flags.writeable = head.flags.writeable = False
    return indptr, j, head


class _Fill:
    """LPT's first rounds exactly, then a water fill (see the module docstring), on items sorted largest first.

    Round 0 gives rank c to CTA c. Up to ``FILL_EXACT_ROUNDS`` more rounds follow while the next item is big next to
    what is left per CTA (``FILL_BIG``): the next items go to the least-loaded CTAs, largest first, for as long as
    LPT would make the same choice (CTA t of the sorted loads is still below every CTA already topped up in this
    round: ``load[t] <= load[0] + x[next - 1]``). The rest is laid along the CTAs from the least loaded up.
    """

    def __init__(self, x: np.ndarray, n: int, p: int) -> None:
        self.n, self.p = n, p
        cum = np.add.accumulate(x)
        total = float(cum[-1])
        r = p
        load = cta = slot = taken = None  # round bookkeeping, allocated when a round runs
        for _ in range(FILL_EXACT_ROUNDS):
            nxt = float(x[r]) if r < n else 0.0
            if r >= n or nxt * FILL_BIG * p <= total - float(cum[r - 1]) or nxt <= NEAR_EQUAL * float(x[-1]):
                break  # the rest is small next to the gaps, or nearly equal: the water fill places it as LPT would
            if load is None:
                load = x[:p].copy()
                cta = np.empty(n, dtype=np.int64)  # CTA of each rank placed so far
                slot = np.zeros(n, dtype=np.int64)  # its position in that CTA's list
                cta[:p] = np.arange(p)
                taken = np.ones(p, dtype=np.int64)
            by_load = load.argsort()
            ls = load.take(by_load)
            m = min(p, n - r)
            xs = x[r : r + m]
            late = (ls[1:m] > ls[0] + xs[: m - 1]).nonzero()[0]
            if late.shape[0]:
                m = int(late[0]) + 1
            sel = by_load[:m]
            cta[r : r + m] = sel
            slot[r : r + m] = taken.take(sel)
            taken[sel] += 1
            load[sel] += xs[:m]
            r += m
        if load is None:  # round 0 only: rank c on CTA c, so the loads descend with c
            self.by_load = np.arange(p - 1, -1, -1)
            ls = x[p - 1 :: -1]
        else:
            self.by_load = load.argsort()
            ls = load.take(self.by_load)
        self.r, self.cta, self.slot, self.taken = r, cta, slot, taken
        cuts = np.full(p + 1, n - r, dtype=np.int64)
        cuts[0] = 0
        if r < n:
            ends = cum[r:] - float(cum[r - 1])
            mid = ends - 0.5 * x[r:]
            # Water level over the k least-loaded CTAs; keep the CTAs whose gap holds the smallest item (LPT never
            # tops up a CTA within one item of the level: the others reach its load first).
            level = np.add.accumulate(ls)
            level += float(ends[-1])
            level /= np.arange(1, p + 1)
            k = max(int(np.count_nonzero(level >= ls + float(x[-1]))), 1)
            bounds = np.add.accumulate(level[k - 1] - ls[: k - 1])
            cuts[1:k] = mid.searchsorted(bounds)  # an item goes to the stretch holding its midpoint
            at_cut = np.concatenate(([0.0], ends)).take(cuts)
            ls = ls + (at_cut[1:] - at_cut[:-1])
        self.cuts = cuts
        self.makespan = float(np.maximum.reduce(ls))

    def order(self):
        """``(work_indptr, ranks in CTA-major order)``: each CTA's round items in round order, then its stretch."""
        n, p, r = self.n, self.p, self.r
        stretch = self.cuts[1:] - self.cuts[:-1]  # per position in load order
        taken = self.taken if self.taken is not None else np.ones(p, dtype=np.int64)
        counts = taken.copy()
        counts[self.by_load] += stretch
        indptr = np.zeros(p + 1, dtype=np.int64)
        np.add.accumulate(counts, out=indptr[1:])
        pos = np.empty(n, dtype=np.int64)
        if self.cta is None:
            pos[:p] = indptr[:-1]  # rank c opens CTA c's list
        else:
            pos[:r] = indptr.take(self.cta[:r])
            pos[:r] += self.slot[:r]
        # stretch item i (rank r + i) in load position q: indptr[cta] + taken[cta] + (i - cuts[q])
        base = indptr.take(self.by_load)
        base += taken.take(self.by_load)
        base -= self.cuts[:-1]
        base -= r
        pos[r:] = base.repeat(stretch)
        pos[r:] += np.arange(r, n)
        rank = np.empty(n, dtype=np.int64)
        rank[pos] = np.arange(n)
        return indptr, rank


def cta_loads(assignment: Assignment, costs: np.ndarray, num_heads: int) -> np.ndarray:
    """Sum of item costs per CTA (tests and benchmarks)."""
    g = costs.shape[0]
    n = g * int(num_heads)
    group = assignment.group if assignment.group is not None else np.arange(n) % g
    cta = np.repeat(np.arange(assignment.work_indptr.shape[0] - 1), np.diff(assignment.work_indptr))
    return np.bincount(cta, weights=costs[group], minlength=assignment.work_indptr.shape[0] - 1)
