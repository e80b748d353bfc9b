"""The decode plan (one query tile per request): a lane-level linear cut of the batch, in a few dozen NumPy calls.

Decode has ``qo_len = 1``, so with ``g <= Br`` each request is one tile whose ``H`` items (one per KV head) cost the
same: ``cost = beta * kv_tokens + alpha * g + gamma``. The planner works on requests and *lanes* (``lanes.py``: sets
of ``H`` CTAs that run all heads of the same requests), so every array it touches has ``B`` or ``P / H`` entries.
NumPy calls on such small arrays cost ~1 us each whatever their size, so the count of calls is the cost.

**No split** when the batch already balances (the mean CTA load is at least ``BALANCED_EFFICIENCY`` of the estimated
makespan ``split_kv.estimate_makespan``, e.g. D5-D7; the cost model may set its own threshold and gain, as fp8's
does, ``cost.FP8_COST``), or splitting would not gain ``MIN_GAIN``: equal requests take head-aligned runs of
``ceil(n/P)`` items where they fit, else the exact ``floor/ceil(n/P)`` cut (``_equal_indptr``, cached per size), others
``assign.assign_items``.

**Small batches** (no more requests than lanes, D1-D4): when every request is longer than the mean lane load,
``_aligned`` gives each request equal pieces, one lane each, by water filling (D1, D2, D4); short requests beside long
ones (D3) take ``_mixed`` (the long ones' pieces over the lanes the short ones leave, the short ones in a snake over
their own lanes). A partial lane, no lane to spare or an unbalanced mixed plan go to the tile pipeline's chunks
(``split_kv``).

**Split: a linear cut of lanes** (stream-K). Lay the requests end to end on a line, each ``o = (alpha*g + gamma) /
beta`` tokens of fixed cost then its KV tokens, and cut it into lanes of equal load ``T``: lane ``l`` runs everything
between its two cuts, so a request that straddles a cut is split there into two pieces (one partial state each,
merged after). The balance no longer depends on the request lengths and no sort is needed.

- Loads: a lane holds its stretch of the line plus ``o + xp`` for a cut piece it starts with and ``xp`` for one it
  ends with (``xp = partial_row * g / beta``, a partial state; a piece's fixed cost is ``o`` too unless the cost
  model gives ``piece_gamma``: then ``op``, used for ``o`` in what follows), so
  ``T = (line + (lanes - 1) * (o + 2 xp)) / width``
  (``width``: full lanes plus the partial lane's weight) and cut ``l`` sits at ``l * (T - o - 2 xp) + o + xp``.
  ``T >= 2 (o + xp) + min_chunk + granule``: pieces inside a long request are at least ``min_chunk`` and two cuts
  never meet (small batches use fewer lanes).
- A cut inside a request is rounded to the nearest multiple of ``kv_granule`` (the kernel's KV tile), and moves to
  the request's start or end when a piece there would be under ``min_chunk / 2``: a lane gains or loses at most
  ``min_chunk / 2 + granule / 2`` tokens at each end. (The line is shifted by ``-granule / 2`` instead of adding it
  to each position, which also sends a cut within ``granule / 2`` of a request's end to the next request's start:
  the same lane boundary.)
- Split or not: the cut is kept when ``beta * T + split_fixed`` (the merge) beats the unsplit estimate by ``MIN_GAIN``.
- Graham's bound (max load <= mean + largest item) is checked: by a sufficient test on ``T``, the slack above and the
  largest piece (at least ``T - o - 2 xp - granule`` when the longest request spans two cuts), else from the loads;
  a plan that misses it is reassigned item by item (``assign_items``) with the same pieces (mode ``lanes-...``).
- At most ``lanes - 1 < P / H`` cuts: fewer than ``P`` added items, within ``capacity_bound``'s ``8 * P``.

Worked example, D8 (one request of 32768 tokens and 127 of 1024; 8 KV heads, g = 4, 264 CTAs = 33 lanes, granule
64): o = 68, xp = 8; the line is 32768 + 127*1024 + 128*68 = 171,520 tokens, T = 5279 and the cuts are 5195 apart.
The long request fills lanes 0-5 and part of lane 6 (pieces cut at 5184, 10368, ...); 20 more cuts fall inside
1024-token requests and split them, the rest moved to request edges. CTA loads 5084-5340: balance 0.985 (LPT over
chunks of the long request reached 0.955: whole 1092-token requests cannot fill the lanes next to its pieces).
D9 (zipf): 39 cuts inside requests, loads 8219-8332, balance 0.993.

**Caches.** What depends only on where the cuts fall (which request, moved to its start, inside it) -- the groups, each
lane's CTA-major item lists with their requests, heads and partial rows, the merge list, the plan's other fields -- is
cached as a ``LaneStructure`` (``decode_structure.py``); a cut crosses a request edge only every few steps of a serving
loop (every length + 1). A step that keeps its structure computes only the cut positions (in int32 when the line fits:
one dtype for every call) and copies the structure's field dict into its ``WorkPlan``; ``layout.pack`` then writes
everything else from memoised blocks (``WorkPlan.pack_blocks``; not even copied when the buffer holds them from the
previous step) and the items' KV ranges straight from ``(kv, pos)`` (``WorkPlan.lane_cuts``): 12 NumPy calls here and
3-4 in ``pack`` for a D8 or D9 step.
"""

from __future__ import annotations

import functools

import numpy as np

from .assign import assign_items
from .cost import DEFAULT_COST, CostModel
from .decode_structure import STRUCTURE_CACHE_SIZE, lane_structure
from .lanes import lanes_of
from .split_kv import BALANCED_EFFICIENCY, DEFAULT_MIN_CHUNK, MIN_GAIN
from .workplan import WorkPlan

_EMPTY32 = np.zeros(0, dtype=np.int32)
_I32 = np.dtype(np.int32)
_INT32_MAX = 2**31 - 1
_ZERO1 = np.zeros(1, dtype=np.int32)


class DecodePlanner:
    """Plans decode batches of one configuration (one query tile per request: ``group_size <= tile_rows``).

    Everything that depends on the configuration alone (cost terms, lanes, thresholds, NumPy constants) is computed
    here once, so planning a step is one call on arrays of the batch size. ``decode_planner(...)`` caches one per
    configuration; ``plan_work`` uses it for decode batches.
    """

    def __init__(
        self, *, num_kv_heads: int, group_size: int, tile_rows: int, num_ctas: int, kv_granule: int,
        window_left: int = -1, disable_split: bool = False, cost: CostModel, min_chunk: int,
    ) -> None:  # fmt: skip
        h, g, p, gr = num_kv_heads, group_size, num_ctas, kv_granule
        self.h, self.g, self.br, self.p, self.gr = h, g, tile_rows, p, gr
        self.window = window_left + 1 if window_left >= 0 else 0  # KV tokens a window keeps (0: no window)
        self.split = not disable_split
        self.beta, self.fixed = cost.beta, cost.alpha * g + cost.gamma
        self.split_fixed = cost.split_fixed
        self.cost = cost
        # Small batches (_aligned): a cut piece holds at least this many KV tokens (two granules: rounding the cuts to
        # the granule never empties a piece)
        self.piece_min = max(min_chunk, 2 * gr)
        self.lanes = lanes = lanes_of(p, h)
        self.n_lanes, self.width = lanes.count, lanes.width
        # The line is in whole KV tokens: a request's fixed cost o and a partial state xp rounded to tokens.
        self.o = round(self.fixed / cost.beta)
        self.xp = xp = round(cost.partial_row * g / cost.beta)
        # The fixed cost of a piece a lane cut makes inside a request (CostModel.piece_gamma; o without it).
        piece = cost.gamma if cost.piece_gamma is None else cost.piece_gamma
        self.op = op = round((cost.alpha * g + piece) / cost.beta)
        # A lane's load: its stretch of the line, plus op + xp for a cut piece it starts with and xp for one it ends
        # with (every inner lane has both when the cuts fall inside requests); at least min_chunk + granule of KV.
        self.extra = (lanes.count - 1) * (op + 2 * xp)
        self.min_lane = 2 * (op + xp) + min_chunk + gr
        self.half = half = max(min_chunk // 2, 1)
        # 0-d constants of the cut rounding for an int64 and an int32 line: (gr // 2, gr or -gr, half)
        self.c64, self.c32 = _consts(gr, half, np.int64), _consts(gr, half, np.int32)
        self.c_half32 = self.c32[2]
        # Batches of int32 lengths whose line stays below 2**31 (the positions of the line, the cuts and the
        # rounded cut positions are all within b * (longest + o) + gr + half) keep the line in int32: every NumPy
        # call of the cut then works on one dtype (mixed int32 / int64 operands cost a cast each).
        self.int32_room = _INT32_MAX - gr - half
        self.fold = gr // 2 if half >= gr // 2 else 0  # the rounding offset, folded into the line (see _cut)
        self._last_ramp = (0, None, None)  # the line's ramp of the last batch size (see _cut)
        self._structures: dict = {}  # _cut's memo of the structures
        self._aligned_cuts: dict = {}  # _aligned's memo of the cut structures
        # Graham's bound test: a lane is off its share by at most two moved cuts and two cut pieces' fixed costs,
        # times the heads a CTA of the partial lane runs.
        self.slack = (2 * half + gr + 2 * (op + 2 * xp)) * (-(-h // lanes.rest) if lanes.rest else 1)

    @property
    def balanced(self) -> float:
        """The split policy's balance threshold: the cost model's (fp8), else split_kv's (read at call time)."""
        b = self.cost.balanced_efficiency
        return BALANCED_EFFICIENCY if b is None else b

    @property
    def min_gain(self) -> float:
        """The gain a split must make: the cost model's (fp8), else split_kv's (read at call time)."""
        g = self.cost.min_gain
        return MIN_GAIN if g is None else g

    def plan(self, kv: np.ndarray, kv_min: int | None = None, kv_max: int | None = None):
        """The ``WorkPlan`` of KV lengths ``kv`` (1-D non-negative integers, at least one request), or None when the
        batch should be split, has no more requests than lanes and ``_aligned`` does not take it (the tile
        pipeline's chunks plan it). ``kv_min`` / ``kv_max`` are ``kv.min()`` / ``kv.max()`` when the caller has them."""
        h, p, b = self.h, self.p, kv.shape[0]
        lo = int(kv.min()) if kv_min is None else kv_min
        hi = int(kv.max()) if kv_max is None else kv_max
        top, w = hi, self.window
        if w:
            n = np.minimum(kv, w)  # the window's KV tokens, ending at the last one
            s = kv - n
            lo, hi = min(lo, w), min(hi, w)
        else:
            n, s = kv, 0
        beta, fixed = self.beta, self.fixed
        prefix = None if lo == hi else self._prefix(n, b, top)
        n_sum = b * lo if prefix is None else prefix.item(-1)
        total = beta * n_sum + b * fixed  # one head's work
        x_max = beta * hi + fixed
        e0 = max(x_max, min(-(-h * b // p) * x_max, h * total / p + beta * lo + fixed))  # split_kv.estimate_makespan
        if self.split and h * total < self.balanced * e0 * p:
            if b <= self.n_lanes:
                if not SMALL_BATCH_ALIGNED:
                    return None  # (A/B builds: the tile pipeline's equal pieces, bench/lab/tune_sched.py dtrace)
                plan = self._aligned(kv, s, n, b, n_sum, lo, hi, e0)
                if plan is not _NO_SPLIT:
                    return plan  # (None: a partial lane, no lane to spare or an unbalanced mixed plan: the tile
                    # pipeline plans it)
                return self._whole(kv, s, n, b, prefix, total, x_max, beta * lo + fixed)
            length = n_sum + b * self.o
            lane_len = max((length + self.extra) / self.width, self.min_lane)
            if beta * lane_len + self.split_fixed < (1.0 - self.min_gain) * e0:
                if prefix is None:
                    prefix = self._prefix(n, b, top)
                plan = self._cut(kv, s, prefix, lane_len, length, hi)
                if plan is not None:
                    return plan

        return self._whole(kv, s, n, b, prefix, total, x_max, beta * lo + fixed)

    def _whole(self, kv, s, n, b: int, prefix, total: float, x_max: float, x_min: float):
        """The plan that runs every request whole."""
        h, p, beta, fixed = self.h, self.p, self.beta, self.fixed
        # --- no split: every request whole, in natural (head-major) order ----------------------------------------
        blocks = None
        if prefix is None:
            indptr, mode = _equal_indptr(b, h, p), "linear"
            group, head = None, None
            blocks = _blocks(("equal", b, h, p))
        else:
            costs = n * beta
            costs += fixed
            asg = assign_items(costs, h, p, (total, x_max, x_min))
            indptr, group, head, mode = asg.work_indptr, asg.group, asg.head, asg.mode
        return WorkPlan(
            num_ctas=p, num_kv_heads=h, work_indptr=indptr, group_req=_arange(b), group_tile=0, group_kv_start=s,
            group_kv_end=kv, group_partial=None, group_partial_stride=None, item_group=group, item_head=head,
            merge_indptr=_ZERO1, merge_src=_EMPTY32, merge_dst_token=_EMPTY32, merge_dst_head=_EMPTY32,
            num_partial_rows=0, chunk_size=0, assign_mode=mode, pack_blocks=blocks,
        )  # fmt: skip

    def _aligned(self, kv, s, n, b: int, n_sum: int, lo: int, hi: int, e0: float):
        """The plan of a small batch whose every request needs a lane of its own or more: equal pieces, one per lane.

        When even the shortest request is longer than the mean lane load, no lane can hold two requests, and the
        best cut gives request ``r`` ``k_r`` equal pieces, one lane each, with ``sum(k_r)`` at most the lanes and the
        largest piece ``max(n_r / k_r)`` as small as it gets: water filling, each of the ``L - B`` extra lanes to the
        request whose pieces are the largest, which takes the ``L - B`` largest of the values ``n_r / m`` (``m = 1,
        2, ...``; pieces of at least ``piece_min`` tokens). Pieces end on granules (KV tiles), so each request then
        keeps the fewest pieces that are no longer, in granules, than the largest. Cuts are rounded to the granule;
        the cut structure goes through ``lane_structure`` as the lane cut's does, memoised by the piece counts. About
        twenty NumPy calls where the tile pipeline took ~100 (plan() of D1 145 -> 36 us, D4 188 -> 38 us on the
        development VM). The spaced lane cut of ``_cut`` would leave some lanes with the ends of two requests, and
        the tile pipeline's chunks put two pieces on some CTAs.

        Returns ``_NO_SPLIT`` when splitting does not beat running every request whole by MIN_GAIN, and None when
        some request is shorter than the mean lane load, there is no lane to spare, or the CTAs make a partial lane
        (the tile pipeline's chunks then pack the short ones, or fill that lane's CTAs).

        Worked example, D2 (16 requests of 540-1021 tokens, 8 KV heads, 264 CTAs = 33 lanes, o = 68, xp = 8): the
        mean lane load is (12224 + 16 * 68) / 33 = 403 tokens, under the shortest request's 608: the 17 extra lanes
        take the 17 largest of n_r / m, which gives every request two pieces and the longest (1021) three. At the
        granule the largest piece is 8 KV tiles (half of 963 tokens, 16 tiles), and 1021 (16 tiles) needs only two
        such pieces: 32 pieces, one per lane. The tile pipeline's chunks put two pieces on 80 of the 264 CTAs:
        D2 26.5 against 29.8 us on the H200 (the former ``dtrace tileplan`` lab variant; docs/results/lab-findings.md).
        """
        lanes, o, xp, gr = self.lanes.full, self.o, self.xp, self.gr
        extra = lanes - b
        if extra < 1 or self.lanes.rest:
            return None
        if hi < 2 * self.piece_min:
            return _NO_SPLIT  # no request can be cut
        if (lo + o) * lanes < n_sum + b * o:
            return self._mixed(kv, s, n, b, n_sum, e0)
        if lo == hi and not isinstance(s, np.ndarray):  # equal requests: equal shares of the extra lanes
            k0 = max(min(1 + extra // b, lo // self.piece_min), 1)
            tiles = -(-lo // gr)
            k0 = -(-tiles // -(-tiles // k0))  # the fewest pieces of no more granules than k0 pieces have
            if k0 == 1:
                return _NO_SPLIT
            worst = -(-tiles // k0) * gr + o + 2 * xp
            key, k = (b, k0), None  # (k built on a memo miss only)
        else:
            k, mt = self._water(n, extra, s)
            worst = mt * gr + o + 2 * xp
            key = (b, k.tobytes())
        if self.beta * worst + self.split_fixed >= (1.0 - self.min_gain) * e0:
            return _NO_SPLIT
        cuts = self._aligned_cuts.get(key)
        if cuts is None:
            if k is None:
                k = np.full(b, k0, dtype=np.int64)
            elif int(np.add.reduce(k)) == b:
                return _NO_SPLIT
            cuts = self._cuts_of(b, k, None, None, key)
        return self._cut_plan(kv, s, n, cuts, worst)

    def _water(self, n: np.ndarray, extra: int, start=0) -> tuple:
        """``(k, mt)``: pieces per request when ``extra`` lanes beyond one per request go, one at a time, to the request
        whose pieces are the largest (the ``extra`` largest of ``n_r / m``, ``m = 1 .. extra``; pieces of at least
        ``piece_min`` tokens), then each request keeps the fewest pieces of at most ``mt`` granules, the largest
        piece's (D4: 33 pieces of 32768 tokens are 16 KV tiles at most, as 32 are: 32 it is). ``start``: the ranges'
        first KV positions (a window's; granules are counted on the absolute grid, as ``_cut_plan`` cuts)."""
        gr, b = self.gr, n.shape[0]
        if extra > 0:
            m = _arange(extra + 1)[1:]
            vals = n[:, None] / m
            vals[(n // self.piece_min)[:, None] <= m] = 0.0
            flat = vals.reshape(-1)
            thr = float(np.partition(flat, flat.shape[0] - extra)[flat.shape[0] - extra])
            k = np.count_nonzero(vals > thr, axis=1)
            if thr > 0.0:  # the values equal to the threshold, first requests first, take the lanes left
                tied = np.flatnonzero(flat == thr)[: extra - int(np.add.reduce(k))]
                k += np.bincount(tied // extra, minlength=b)
            k += 1
        else:
            k = np.ones(b, dtype=np.int64)
        if isinstance(start, np.ndarray):
            tiles = (n + start).astype(np.int64)
            tiles += gr - 1
            tiles //= gr
            tiles -= start // gr
        else:
            tiles = n + (gr - 1)
            tiles //= gr
        mt = max(int(np.maximum.reduce(-(-tiles // k))), 1)
        k = -(-tiles // mt)
        np.maximum(k, 1, out=k)  # (an empty request: one empty piece)
        return k, mt

    def _mixed(self, kv, s, n, b: int, n_sum: int, e0: float):
        """The plan of a small batch with requests shorter than the mean lane load ``t`` beside long ones (D3): the
        long requests (``n_r + o > t``) get equal pieces, one lane each, over the lanes the short ones leave
        (``_water``); the short ones, longest first, are dealt in a snake over ``ceil(load / t)`` lanes. The line
        runs the long requests in their order, then the short ones lane by lane (``order``: the request at each line
        position). None (the tile pipeline's chunks plan it) when a lane would carry more than ``MIXED_BALANCE``
        times ``t`` plus a granule and a cut piece's partial states.

        Worked example, D3 (zipf, 16 requests: 9043, 2659, 1489, 1063 and twelve of 106-319 tokens; 33 lanes):
        t = 530; the twelve short ones (2938 tokens with their fixed parts) take 6 lanes of 454-561, the long ones
        26 of the other 27 (16, 5, 3 and 2 pieces of at most 9 KV tiles): the same largest lane as the tile
        pipeline's, every long piece alone on its CTAs.
        """
        lanes, o, xp, gr = self.lanes.full, self.o, self.xp, self.gr
        t = (n_sum + b * o) / lanes
        is_long = n > t - o
        longs = np.flatnonzero(is_long)
        shorts = np.flatnonzero(~is_long)
        m = longs.shape[0]
        if m == 0 or shorts.shape[0] == 0:
            return None
        cs = n.take(shorts).astype(np.int64)
        cs += o
        total = int(np.add.reduce(cs))
        n_short = min(max(-(-total // max(int(t), 1)), 1), shorts.shape[0])
        if lanes - n_short < m:
            return None
        k, mt = self._water(n.take(longs), lanes - n_short - m, s.take(longs) if isinstance(s, np.ndarray) else 0)
        # Short lanes: the short requests, longest first, dealt in a snake over the lanes (0 .. S-1, then back), and
        # laid on the line lane by lane.
        by_len = np.argsort(-cs, kind="stable")
        i = _arange(shorts.shape[0])
        lane = i % n_short
        back = (i // n_short) % 2 == 1
        lane[back] = n_short - 1 - lane[back]
        lane_of = np.empty_like(lane)
        lane_of[by_len] = lane
        by_lane = np.argsort(lane_of, kind="stable")
        shorts, lane = shorts.take(by_lane), lane_of.take(by_lane)
        loads = np.bincount(lane, weights=cs.take(by_lane), minlength=n_short)
        worst = max(mt * gr + o + 2 * xp, float(np.maximum.reduce(loads)))
        if worst > MIXED_BALANCE * (t + 2 * xp + gr):  # (a cut piece's partial states, the granule of its cuts)
            return None
        if self.beta * worst + self.split_fixed >= (1.0 - self.min_gain) * e0 or int(np.add.reduce(k)) == m:
            return _NO_SPLIT
        order = np.concatenate((longs, shorts))
        k_line = np.ones(b, dtype=np.int64)
        k_line[:m] = k
        starts = np.zeros(b, dtype=bool)  # line positions that start a lane (each long request, each short lane)
        starts[1:m] = True
        first = np.ones(lane.shape[0], dtype=bool)
        np.not_equal(lane[1:], lane[:-1], out=first[1:])
        starts[m:] = first
        key = (b, k_line.tobytes(), starts.tobytes(), order.tobytes())
        cuts = self._aligned_cuts.get(key)
        if cuts is None:
            cuts = self._cuts_of(b, k_line, starts, order, key)
        return self._cut_plan(kv, s, n, cuts, worst)

    def _cut_plan(self, kv, s, n, cuts: tuple, worst: float):
        """The WorkPlan of ``_cuts_of``'s cut structure. Its cut positions: the request's KV range spans granules
        ``a .. a + T`` (absolute), and inner cut ``j`` of ``k`` falls on granule ``a + round(j * T / k)``, so no
        piece spans more than ``ceil(T / k)`` granules (a lane boundary's position is not used)."""
        req, j, k_req, st, order = cuts
        gr = self.gr
        r = req if order is None else order.take(req)
        end = n.take(r).astype(np.int64)
        if isinstance(s, np.ndarray):
            a = s.take(r).astype(np.int64)
            end += a
            a //= gr
        else:
            a = 0
        end += gr - 1
        end //= gr
        end -= a  # T: the granules the range spans
        pos = end * j
        pos += k_req // 2
        pos //= k_req
        pos += a
        pos *= gr
        fields = st.fields.copy()
        fields["chunk_size"] = max(int(worst) // gr * gr, gr)
        fields["lane_cuts"] = (kv, s, pos.astype(kv.dtype, copy=False), st.ranges)
        return WorkPlan.from_fields(fields)

    def _cuts_of(self, b: int, k: np.ndarray, starts, order, key) -> tuple:
        """The cut structure of ``k[p]`` pieces of the request at line position ``p`` (memoised: a serving loop keeps
        its piece counts for many steps): the cuts in line order (a lane boundary before each position of
        ``starts``, by default every position but the first, then its ``k - 1`` inner cuts) as ``(line position,
        index j of the inner cut (0: boundary), k of its request, the lane structure, order)``; ``order[p]`` is the
        request at line position ``p`` (None: position = request)."""
        c = k - 1
        if starts is None:
            c[1:] += 1
            no_boundary = _arange(b) == 0
        else:
            c += starts
            no_boundary = ~starts
        req = np.arange(b, dtype=np.int64).repeat(c)
        local = np.arange(req.shape[0], dtype=np.int64) - (np.add.accumulate(c) - c).repeat(c)
        j = local + no_boundary.take(req)
        inside = j > 0
        st = lane_structure(b, req, inside, inside, self.lanes, self.h, self.g, self.br, order)
        cuts = (req, j, k.take(req), st, order)
        for a in cuts[:3]:
            a.flags.writeable = False
        memo = self._aligned_cuts
        if len(memo) >= STRUCTURE_CACHE_SIZE:
            memo.pop(next(iter(memo)))
        memo[key] = cuts
        return cuts

    def _prefix(self, n: np.ndarray, b: int, top: int) -> np.ndarray:
        """The running sum of ``n`` (window-clipped KV lengths, the longest unclipped ``top``), int32 when the line
        fits (see ``int32_room``)."""
        if n.dtype is _I32 and b * (top + self.o) < self.int32_room:
            return np.add.accumulate(n, dtype=_I32)  # (the default would widen to int64)
        return np.add.accumulate(n, dtype=np.int64)

    def _cut(self, kv, s, prefix, lane_len: float, length: int, n_max: int):
        """The lane cut (module docstring), or None when it would not cut anything."""
        b, o, op, xp, gr, h = kv.shape[0], self.o, self.op, self.xp, self.gr, self.h
        # Cut l (l = 1..m) at l * step + op + xp on the line: lane 0 holds lane_len - xp of it, the inner lanes
        # lane_len less the fixed costs of their two cut pieces (op: a piece's), the last lane the rest.
        step = int(lane_len) - (op + 2 * xp)
        fold = self.fold
        # (a cut within granule/2 of the line's end would only leave the last lane empty: not made)
        m = min(self.n_lanes - 1, -(-(length - op - xp - fold) // step) - 1)
        if m < 1:
            return None
        # Request b ends at prefix[b] + (b + 1) * o on the line (its o fixed tokens, then its KV tokens); kept
        # shifted by -(op + xp) so that the cuts are plain multiples of step.
        # The line is also shifted by -granule/2, which rounds the positions below to the nearest multiple instead
        # of down: a cut then lands in the next request when it is within granule/2 of a request's end, which
        # moves it to that request's start instead of the end before, the same lane boundary (half >= granule/2).
        dt = prefix.dtype  # int32 or int64 (see _prefix); the ramp, the cuts and the constants follow it
        ramp = self._last_ramp  # (b, dtype, ramp): batches keep their size over the steps of a serving loop
        if ramp[0] != b or ramp[1] is not dt:
            ramp = self._last_ramp = (b, dt, _ramp(b, o, op + xp + fold, dt))
        line_end = prefix + ramp[2]
        cuts = np.arange(step, step * (m + 1), step, dtype=dt)  # step * [1..m] in one call
        req = line_end.searchsorted(cuts, "right")  # the request each cut falls in
        end = kv.take(req)
        pos = line_end.take(req)
        pos -= cuts  # tokens from the cut to the request's end
        np.subtract(end, pos, out=pos)  # the cut's KV position (negative: inside the request's fixed part)
        # Round to the granule (0-d operands: NumPy calls with Python scalars cost twice as much at this size).
        c_round, c_gr, c_half = self.c32 if dt is _I32 else self.c64
        if not fold:
            pos += c_round
        if gr & (gr - 1):
            pos //= c_gr
            pos *= c_gr
        else:
            pos &= c_gr  # -gr
        # A cut that would leave a piece under min_chunk / 2 moves to that edge of the request instead.
        keeps_start = pos >= (s.take(req) + self.c_half32 if isinstance(s, np.ndarray) else c_half)
        fits = end - self.c_half32
        fits = pos <= fits  # leaves min_chunk / 2 before the end: the cut is inside when it also keeps_start
        # The structure depends on (req, keeps_start, inside = fits & keeps_start); this planner's own memo is keyed
        # by fits instead (one NumPy call less: a cut moved to a short request's start may make two keys of one
        # structure, the second found in the shared cache of lane_structure).
        key = (b, req.tobytes(), keeps_start.tobytes(), fits.tobytes())
        st = self._structures.get(key)
        if st is None:
            st = lane_structure(b, req, keeps_start, fits & keeps_start, self.lanes, h, self.g, self.br)
            memo = self._structures
            if len(memo) >= STRUCTURE_CACHE_SIZE:
                memo.pop(next(iter(memo)), None)
            memo[key] = st
        # The cut positions stay in ``pos`` (every cut; ``ranges.cut_idx`` picks those inside requests): pack reads
        # them from there, so the common step never gathers them.
        ranges = st.ranges
        # Graham's bound, max load <= mean + largest item: the largest item is at least step - granule when the
        # longest request spans two cuts (the piece between them), else take it; the loads when the test fails.
        mean = (length + st.n_cut * (op + 2 * xp)) * h / self.p
        g_start = g_end = None  # built from (kv, starts, pos) when asked: pack writes the item ranges directly
        if n_max >= 2 * (step + o) + gr:
            x_big = step - gr + op
        else:
            g_start, g_end = ranges.group_ranges(kv, s, pos)
            x_big = float(np.maximum.reduce(g_end - g_start)) + o
        if lane_len + self.slack > mean + x_big:
            if g_end is None:
                g_start, g_end = ranges.group_ranges(kv, s, pos)
            costs = _piece_costs(g_start, g_end, ranges.right, o, xp)
            worst = _worst_load(costs, st.wi, st.ig, self.p)
            if worst > float(np.add.reduce(costs)) * h / self.p + float(np.maximum.reduce(costs)) + 1e-6:
                asg = assign_items(costs, h, self.p)
                ig, ih = asg.group, asg.head
                if ig is None:  # natural order: item i is group i % G of head i // G
                    ih, ig = np.divmod(np.arange(h * ranges.g_req.shape[0]), ranges.g_req.shape[0])
                return WorkPlan(
                    num_ctas=self.p, num_kv_heads=h, work_indptr=asg.work_indptr, group_req=ranges.g_req,
                    group_tile=0, group_kv_start=g_start, group_kv_end=g_end, group_partial=st.g_part,
                    group_partial_stride=st.g_stride, item_group=ig, item_head=ih, merge_indptr=st.merge[0],
                    merge_src=st.merge[1], merge_dst_token=st.merge[2], merge_dst_head=st.merge[3],
                    num_partial_rows=st.rows_partial, chunk_size=max(step // gr * gr, gr),
                    assign_mode="lanes-" + asg.mode,
                )  # fmt: skip
        # The common case: every field but the ranges, the chunk and the cuts comes from the structure's template
        # (a dict copy instead of the dataclass constructor's 22 keyword arguments).
        fields = st.fields.copy()
        fields["group_kv_start"], fields["group_kv_end"] = g_start, g_end
        fields["chunk_size"] = max(step // gr * gr, gr)
        fields["lane_cuts"] = (kv, s, pos, ranges)
        return WorkPlan.from_fields(fields)


#: Small batches take ``DecodePlanner._aligned`` (False: the tile pipeline's equal pieces, for A/B measurements).
SMALL_BATCH_ALIGNED = True
_NO_SPLIT = object()  # _aligned's answer when running every request whole is as good
#: _mixed plans a small batch only when no lane carries more than this times the mean lane load (plus a granule and
#: the partial states of a cut piece).
MIXED_BALANCE = 1.15


@functools.lru_cache(maxsize=32)
def decode_planner(
    num_kv_heads: int, group_size: int, tile_rows: int, num_ctas: int, kv_granule: int, window_left: int = -1,
    disable_split: bool = False, cost: CostModel = DEFAULT_COST, min_chunk: int = DEFAULT_MIN_CHUNK,
) -> DecodePlanner:  # fmt: skip
    """The (cached) ``DecodePlanner`` of a configuration; arguments as ``plan_work``'s (validated there)."""
    return DecodePlanner(
        num_kv_heads=num_kv_heads, group_size=group_size, tile_rows=tile_rows, num_ctas=num_ctas,
        kv_granule=kv_granule, window_left=window_left, disable_split=disable_split, cost=cost, min_chunk=min_chunk,
    )  # fmt: skip


def _piece_costs(g_start, g_end, right, o: float, xp: float) -> np.ndarray:
    """Cost / beta of each group: its KV tokens, the fixed part, and a partial state when its request is cut."""
    costs = (g_end - g_start).astype(np.float64)
    costs += o
    split = np.zeros(g_end.shape[0], dtype=bool)
    split[right] = True
    split[right - 1] = True
    costs += xp * split
    return costs


def _worst_load(costs: np.ndarray, wi: np.ndarray, ig: np.ndarray, p: int) -> float:
    """The largest CTA load (cost / beta) of an assignment."""
    cta = np.repeat(np.arange(p), np.diff(wi))
    return float(np.bincount(cta, weights=costs.take(ig), minlength=p).max())


@functools.lru_cache(maxsize=64)
def _ramp(count: int, step: int, minus: int = 0, dtype=np.int64) -> np.ndarray:
    """``step * [1, 2, ..., count] - minus`` (``dtype``, read-only)."""
    r = np.arange(1, count + 1, dtype=np.int64)
    r *= step
    r -= minus
    r = r.astype(dtype, copy=False)
    r.flags.writeable = False
    return r


@functools.lru_cache(maxsize=16)
def _consts(gr: int, half: int, dtype) -> tuple:
    """0-d constants of the cut rounding in ``dtype``: ``(gr // 2, gr (or -gr as a mask when a power of two),
    half)``."""
    out = tuple(np.array(v, dtype=dtype) for v in (gr // 2, gr if gr & (gr - 1) else -gr, half))
    for c in out:
        c.flags.writeable = False
    return out


_BLOCKS: dict = {}


def _blocks(key: tuple) -> dict:
    """The pack-block memo of a plan shape (see ``WorkPlan.pack_blocks``)."""
    hit = _BLOCKS.get(key)
    if hit is None:
        if len(_BLOCKS) >= 64:
            _BLOCKS.pop(next(iter(_BLOCKS)))
        hit = _BLOCKS[key] = {}
    return hit


@functools.lru_cache(maxsize=64)
def _arange(count: int) -> np.ndarray:
    r = np.arange(count, dtype=np.int32)
    r.flags.writeable = False
    return r


@functools.lru_cache(maxsize=64)
def _equal_indptr(b: int, h: int, p: int) -> np.ndarray:
    """The CTA ranges of ``n = h * b`` equal items in natural (head-major) order on at most ``p`` CTAs.

    With ``m = ceil(n / p)`` items on the fullest CTA: when ``m`` divides ``b`` and the CTAs that ``m`` items each
    need, ``n / m``, are at least 15/16 of ``p``, CTA ``c`` takes items ``[c m, (c + 1) m)`` and the last CTAs none.
    Every run then holds ``m`` requests of one head, and CTA ``c`` and ``c + b / m`` read the same requests' other
    heads (in an NHD page, the neighbouring bytes of the same tokens) at the same point of their runs. Measured on an
    H200 (2026-12-05, same-run A/B, 5 rounds): D5 0.985x, D6 0.995x, D7 0.989x the time of the spread below, which
    cuts the line at other points in each head. Otherwise CTA ``c`` starts at the first item whose midpoint ``i + 1/2``
    reaches ``c * n / p`` (``floor`` or ``ceil(n / p)`` items each).
    """
    n = h * b
    m = -(-n // p)
    if b % m == 0 and 16 * (n // m) >= 15 * p:
        indptr = np.minimum(np.arange(p + 1) * m, n)
    else:
        indptr = np.arange(0, 2 * n * (p + 1), 2 * n)
        indptr += p - 1
        indptr //= 2 * p
    indptr.flags.writeable = False
    return indptr
