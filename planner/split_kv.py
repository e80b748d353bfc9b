"""Split-KV in the tile pipeline: whether, and how finely, to cut the tiles' KV ranges into pieces.

(Decode batches with one tile per request and more requests than lanes of ``H`` CTAs are split by the lane cut of
``decode_plan.py`` instead, and small batches (D1-D4) by its equal pieces; this chunk policy serves prefill, the
small decode batches those cannot balance (a partial lane of CTAs, no lane to spare) and decode with several query
tiles per request.
``estimate_makespan``, ``BALANCED_EFFICIENCY`` and ``MIN_GAIN`` are shared.)

Splitting lets a few long requests spread over many CTAs, at a price: each piece writes a float32 partial state to
the workspace and a merge pass combines them. ``choose_chunk_size`` is a pure function of the tiles' row counts and
KV lengths, the number of KV heads and of CTAs. It picks ONE chunk size ``C`` (a multiple of the kernel's KV granule:
its KV tile or page size); ``split_counts`` cuts every tile longer than ``C`` into ``ceil(blocks / (C/granule))``
nearly equal pieces (no piece under ``min_chunk``), and ``split_ranges`` puts their boundaries on granule multiples.

The decision, with ``M`` = mean CTA load = total cost / P (costs from ``CostModel``, P = num_ctas):

1. No split if the batch already balances: ``M`` is at least ``BALANCED_EFFICIENCY`` of the estimated makespan
   without splitting (D5-D7), or if no tile is long enough to give two pieces of ``min_chunk``.
2. Else candidates ``C = f * M / beta`` for ``f`` in ``CANDIDATE_FRACTIONS`` (at least ``min_chunk`` and the capacity
   floor below, rounded up to the granule) are scored by their estimated makespan plus ``split_fixed`` (the merge's
   one-time cost); the best wins if it beats not splitting by ``MIN_GAIN``.

The makespan estimate of ``n`` items (largest ``x_max``, smallest ``x_min``) over ``P`` CTAs is
``max(x_max, min(ceil(n/P) * x_max, M + x_min), ceil(n_big/P) * x_big)``. ``ceil(n/P) * x_max`` is exact for equal
items (waves: 133 equal items on 132 CTAs take two item times, not 1.01); ``M + x_min`` is Graham's bound for LPT when
the last item to finish is a small one, the usual case when many small items fill the gaps; the last term counts the
*big* items (the pieces, and whole tiles over half a chunk, mean cost ``x_big``): with more than P of them some CTA
gets two (pigeonhole). Piece counts are exact for every candidate (a few long tiles in decode).

Capacity floor (a proof, used by ``layout.capacity_bound``): a tile of ``nb`` blocks cut at ``m`` blocks adds
``k - 1 < nb / m`` items, and ``nb < n / granule + 2``, so ``m >= H * (sum(n) / granule + 2T) / (8 * P)`` adds fewer
than ``MAX_EXTRA_ITEMS_PER_CTA * P = 8 * P`` items, whatever the lengths.

Worked examples (Llama-3-8B decode: 8 KV heads, 4 rows per tile, granule 16; costs in KV tokens, so an unsplit item
of 1024 tokens costs 1024 + 4 + 64 = 1092; a piece also pays 2 per row for its partial state):

- D6, 128 x 2048 on 264 CTAs: 1024 items of 2116; M = 8207, estimate min(4 x 2116, 8207 + 2116) = 8464: 97 %,
  balanced, no split.
- D1, 16 x 1024 on 264 CTAs: 128 items of 1092; M = 529, estimate 1092 (48 %). f = 1 gives C = 544: each range cut
  in 2 x 512, 256 items of 588 in one wave: 588 + 128 = 716 < 1092: split (1.5x better).
- D1 on 132 CTAs: 128 items, M = 1059, estimate 1092 (97 %): no split. Splitting cannot beat one wave here.
- D4, 1 x 32768 on 132 CTAs: M = 1990. f = 1 (C = 2000) gives 17 pieces: 136 items, two waves of 2004: 4008.
  f = 0.5 (C = 1008) gives 33 pieces: 264 items, exactly two waves of ~1069: 2138 + 128. f = 0.5 wins.
- D9 through this policy (zipf, four requests of 39-68 K tokens among 124 short ones) on 132 CTAs (decode now
  takes the lane cut): M = 16.5 K. f = 1 cuts the four into
  16 pieces of ~13 K; with the whole 12.6 K tile that is 17 x 8 = 136 big items for 132 CTAs: two waves, ~26 K.
  f = 0.5 (C = 8208) gives 264 big items of ~7.5 K, two exact waves: ~16.6 K. f = 0.5 wins (LPT then reaches 99 %).

``min_chunk`` (default 256 tokens, ``DEFAULT_MIN_CHUNK``) is the smallest piece: below that a piece's fixed latency
(``gamma``, ~64 tokens) and its partial-state write and merge read (~2 tokens per row) stop being small next to its
KV work.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np

from .cost import DEFAULT_COST, CostModel

#: Default smallest piece of a split range, in KV tokens (see the module docstring).
DEFAULT_MIN_CHUNK = 256
#: Chunk sizes tried, as fractions of the mean CTA load (in KV tokens).
CANDIDATE_FRACTIONS = (1.0, 0.5, 0.33, 0.25)
#: Splitting may add at most this many items per CTA (bounds the plan for fixed CUDA-graph capacities).
MAX_EXTRA_ITEMS_PER_CTA = 8
#: No split when the unsplit makespan estimate is within this factor of the mean load.
BALANCED_EFFICIENCY = 0.93
#: A split must improve the estimated makespan by this fraction to be worth its merge.
MIN_GAIN = 0.03


def estimate_makespan(n_items: int, total: float, x_max: float, x_min: float, num_ctas: int) -> float:
    """``max(x_max, min(ceil(n/P) * x_max, total/P + x_min))`` (see the module docstring)."""
    return max(x_max, min(math.ceil(n_items / num_ctas) * x_max, total / num_ctas + x_min))


def choose_chunk_size(
    rows,
    kv_start,
    kv_end: np.ndarray,
    *,
    num_kv_heads: int,
    num_ctas: int,
    kv_granule: int,
    cost: CostModel = DEFAULT_COST,
    min_chunk: int = DEFAULT_MIN_CHUNK,
) -> int:
    """The chunk size in KV tokens (a multiple of ``kv_granule``) to split the tiles at, or 0 for no split.

    ``rows``, ``kv_start`` and ``kv_end`` have one entry per query tile (``rows`` and ``kv_start`` may be scalars
    shared by all tiles); each tile is ``num_kv_heads`` identical items.
    """
    n = kv_end - kv_start
    costs = n * cost.beta
    costs += rows * cost.alpha + cost.gamma
    if costs.shape[0] == 0:
        return 0
    stats = (float(np.add.reduce(costs)), float(np.maximum.reduce(costs)), float(np.minimum.reduce(costs)))
    choice = choose_split(rows, n, stats, num_kv_heads, num_ctas, kv_granule, cost, min_chunk)
    return choice[0] * kv_granule if choice else 0


def choose_split(
    rows: int | np.ndarray, n: np.ndarray, stats: tuple[float, float, float], h: int, p: int, gr: int, cost: CostModel,
    min_chunk: int,
) -> tuple[int, int] | None:  # fmt: skip
    """``(chunk_blocks, threshold)`` or ``None``: cut every tile with more than ``threshold`` KV tokens into pieces of
    at most ``chunk_blocks`` granules. ``stats`` = (sum, max, min) of the unsplit tile costs (shared with plan_work).

    All candidates are scored from one sort of the KV lengths: the tiles a candidate cuts are a suffix of the sorted
    lengths, so their count and total length come from prefix sums, and a tile of ``nb`` blocks gives
    ``ceil(nb / m) ~ nb / m + 1/2`` pieces. Only the chosen candidate is then cut exactly (``split_counts``).
    """
    total0, x0max, x0min = stats
    n_tiles = n.shape[0]
    e0 = estimate_makespan(h * n_tiles, h * total0, x0max, x0min, p)
    mean0 = h * total0 / p
    if mean0 >= BALANCED_EFFICIENCY * e0:
        return None
    min_blocks = max(-(-int(min_chunk) // gr), 1)
    # Plain Python from here: a handful of candidates over sorted lengths, where each NumPy call would cost more
    # than the work it does (decode has ~100 tiles; prefill batches rarely get past the balance check above).
    ns = sorted(n.tolist())
    prefix = list(itertools.accumulate(ns))
    n_sum = float(prefix[-1])
    n_max = float(ns[-1])
    # Capacity rule (provable): a tile of nb blocks cut at m adds k - 1 < nb / m items and nb < n / gr + 2, so
    # m >= H * (sum(n) / gr + 2T) / (MAX_EXTRA_ITEMS_PER_CTA * P) keeps the added items under that many per CTA.
    m_cap = math.ceil(h * (n_sum / gr + 2 * n_tiles) / (MAX_EXTRA_ITEMS_PER_CTA * p))
    blocks = sorted({max(min_blocks, m_cap, math.ceil(f * mean0 / cost.beta / gr)) for f in CANDIDATE_FRACTIONS})
    r_max = float(np.maximum.reduce(rows) if isinstance(rows, np.ndarray) else rows)
    fixed = cost.alpha * r_max + cost.gamma  # an item's cost apart from its KV (largest rows)
    x_part = cost.partial_row * r_max
    # A tile is cut at m when it has more than max(m, 2*min_blocks - 1) granules of KV (it then gives >= 2 pieces
    # of >= min_blocks); in tokens, n > that * gr is sufficient, and split_counts uses the same test.
    thresholds = [max(m, 2 * min_blocks - 1) * gr for m in blocks]
    whole = [bisect.bisect_right(ns, thr) for thr in thresholds]  # tiles 0..i-1 (sorted) stay whole
    pieces_all = _piece_counts(ns, blocks, thresholds, whole, gr, min_blocks)
    best_e, best = e0 * (1.0 - MIN_GAIN), None
    for m, thr, i, pieces in zip(blocks, thresholds, whole, pieces_all, strict=True):
        n_cut = n_tiles - i
        if n_cut == 0:
            continue
        kv_whole, longest_whole = (float(prefix[i - 1]), float(ns[i - 1])) if i else (0.0, 0.0)
        added = pieces - n_cut
        x_max = max(cost.beta * min(m * gr, n_max) + fixed + x_part, cost.beta * longest_whole + fixed)
        work = h * (total0 + added * fixed + pieces * x_part)
        e = estimate_makespan(h * (n_tiles + added), work, x_max, x0min, p)
        # Big items: the pieces and the whole tiles over half a chunk. With more than P of them some CTA gets two:
        # they come in waves (pigeonhole), each about the mean big item.
        j = min(bisect.bisect_right(ns, m * gr // 2), i)  # tiles of at most half a chunk
        n_big = pieces + i - j
        kv_big = n_sum - (float(prefix[j - 1]) if j else 0.0)
        big = (cost.beta * kv_big + pieces * x_part) / n_big + fixed
        e = max(e, math.ceil(h * n_big / p) * big) + cost.split_fixed
        if e < best_e:
            best_e, best = e, (m, thr)
    return best


def _piece_counts(ns: list, blocks: list, thresholds: list, whole: list, gr: int, min_blocks: int) -> list:
    """Pieces of the tiles each candidate cuts: sum of ``min(ceil(nb / m), nb // min_blocks)`` over the tiles above
    its threshold (``ns`` sorted). Python for a few long tiles, one 2-D NumPy pass for many."""
    first = whole[0]  # thresholds ascend, so the smallest candidate cuts the most tiles
    if len(ns) - first <= 8:
        out = []
        for m, i in zip(blocks, whole, strict=True):
            nbs = [(v + gr - 1) // gr for v in ns[i:]]
            out.append(sum(min(-(-nb // m), nb // min_blocks) for nb in nbs))
        return out
    long_n = np.array(ns[first:])
    nb = long_n + (gr - 1)
    nb //= gr
    mcol = np.array(blocks)[:, None]
    k = nb + (mcol - 1)
    k //= mcol
    np.minimum(k, nb // min_blocks, out=k)
    k[long_n <= np.array(thresholds)[:, None]] = 0  # below this candidate's threshold: not cut
    return np.add.reduce(k, axis=1).tolist()


def split_counts(n: np.ndarray, kv_start, kv_end: np.ndarray, chunk_blocks: int, threshold: int, granule: int,
                 min_chunk: int):  # fmt: skip
    """``(tiles, counts)``: the tiles with more than ``threshold`` KV tokens and how many pieces each is cut into:
    ``ceil(blocks / chunk_blocks)``, but no piece under ``min_chunk`` tokens (in granules; always >= 2 here)."""
    tiles = (n > threshold).nonzero()[0]
    nb = kv_end.take(tiles)
    nb += granule - 1
    nb //= granule
    if isinstance(kv_start, np.ndarray) or kv_start:
        nb -= (kv_start.take(tiles) if isinstance(kv_start, np.ndarray) else kv_start) // granule
    k = nb + (chunk_blocks - 1)
    k //= chunk_blocks
    np.minimum(k, nb // max(-(-int(min_chunk) // granule), 1), out=k)
    return tiles, k


def fixed_counts(kv_start, kv_end: np.ndarray, chunk: int) -> np.ndarray:
    """Pieces per range when cut at every multiple of ``chunk``: the chunk-aligned blocks it touches (at least 1)."""
    k = kv_end + (chunk - 1)
    k //= chunk
    k -= kv_start // chunk
    return np.maximum(k, 1, out=k)


def split_ranges(kv_start, kv_end: np.ndarray, counts: np.ndarray, granule: int):
    """Cut range ``i`` into ``counts[i]`` nearly equal pieces whose inner boundaries are multiples of ``granule``.

    Returns ``(owner, piece, start, end)``, one entry per piece, owners in order and pieces in KV order. A range of
    ``nb`` granule blocks cut in ``k`` gives each piece ``floor(nb/k)`` or ``ceil(nb/k)`` blocks (the first and last
    block may be partial when the range is not aligned). ``counts[i] == 1`` keeps the range as it is (empty ones too).
    """
    n = counts.shape[0]
    ends = np.add.accumulate(counts)
    owner = np.arange(n).repeat(counts)
    piece = np.arange(int(ends[-1]) if n else 0)
    piece -= (ends - counts).take(owner)
    e = kv_end.take(owner)
    k = counts.take(owner)
    nb = e + (granule - 1)
    nb //= granule
    aligned = not isinstance(kv_start, np.ndarray) and kv_start == 0  # decode without a window
    if not aligned:
        s = kv_start.take(owner) if isinstance(kv_start, np.ndarray) else kv_start
        b0 = s // granule
        nb -= b0
    lo = piece * nb
    hi = lo + nb
    lo //= k
    hi //= k
    if not aligned:
        lo += b0
        hi += b0
    lo *= granule
    hi *= granule
    start = lo if aligned else np.maximum(lo, s, out=lo)
    end = np.minimum(hi, e, out=hi)
    return owner, piece, start, end
