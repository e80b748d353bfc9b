"""Split-KV: whether, and how finely, to cut the tiles' KV ranges into chunks that different CTAs process.

Splitting lets a few long requests spread over many CTAs, at a price: each chunk writes a float32 partial state to
the workspace and a merge pass combines them. ``choose_chunk_size`` is a pure function of the tiles' row counts and
KV ranges, the number of KV heads and of CTAs. It picks ONE chunk size ``C`` (a multiple of the kernel's KV granule:
its KV tile or page size); ``chunk_counts`` cuts every range longer than ``C`` into ``ceil(blocks / (C/granule))``
nearly equal pieces, and ``split_ranges`` places their boundaries on granule multiples.

The decision, with ``M`` = mean CTA load = total cost / P (costs from ``CostModel``, P = num_ctas):

1. No split if no range has ``2 * min_chunk`` tokens, or if the batch already balances: the estimated makespan
   without splitting is within ``BALANCED_EFFICIENCY`` of ``M``.
2. Else candidates ``C = f * M / beta`` for ``f`` in ``CANDIDATE_FRACTIONS`` (at least ``min_chunk``, rounded up to
   the granule) are scored by their estimated makespan plus ``split_fixed`` (the merge's one-time cost); the best
   wins if it beats not splitting by ``MIN_GAIN``. A candidate adding more than ``MAX_EXTRA_ITEMS_PER_CTA * P`` items
   is skipped, which bounds the plan's size for CUDA-graph capacities (``layout.capacity_bound``).

The makespan estimate of ``n`` items (largest ``x_max``, smallest ``x_min``) over ``P`` CTAs is
``max(x_max, min(ceil(n/P) * x_max, M + x_min))``: ``ceil(n/P) * x_max`` is exact for equal items (waves: 133 equal
items on 132 CTAs take two item times, not 1.01), and ``M + x_min`` is Graham's bound for LPT when the last item to
finish is a small one, which is the case when many small items fill the gaps.

Worked examples (Llama-3-8B decode: 8 KV heads, 4 rows per tile, granule 16; costs in KV tokens, so an unsplit item
of 1024 tokens costs 1024 + 4 + 64 = 1092; a piece also pays 2 per row for its partial state):

- D6, 128 x 2048 on 264 CTAs: 1024 items of 2116; M = 8207, estimate min(4 x 2116, 8207 + 2116) = 8464: 97 %,
  balanced, no split.
- D1, 16 x 1024 on 264 CTAs: 128 items of 1092; M = 529, estimate 1092 (48 %). f = 1 gives C = 544: each range cut
  in 2 x 512, 256 items of 588 in one wave: 588 + 128 = 716 < 1092: split (1.5x better).
- D1 on 132 CTAs: 128 items, M = 1059, estimate 1092 (97 %): no split. Splitting cannot beat one wave here.
- D4, 1 x 32768 on 132 CTAs: M = 1990. f = 1 (C = 2000) gives 17 pieces: 136 items, two waves of 2004: 4008.
  f = 0.5 (C = 1008) gives 33 pieces: 264 items, exactly two waves of ~1069: 2138 + 128. f = 0.5 wins.
- D8, 127 x 1024 + 1 x 32768 on 264 CTAs: M = 5198, unsplit estimate 32836 (16 %). f = 1 (C = 5200): 7 pieces of
  4681; 1072 items, estimate M' + 1092 = 6300 + 128: split; the pieces land on their own CTAs, the 1024s fill around.

``min_chunk`` (default 256 tokens, ``DEFAULT_MIN_CHUNK``) is the smallest piece: below that a piece's fixed latency
(``gamma``, ~64 tokens) and its partial-state write and merge read (~2 tokens per row) stop being small next to its
KV work. ``chunk_counts`` caps the pieces of a range so none is shorter than ``min_chunk`` (up to granule rounding).
"""

from __future__ import annotations

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
    choice = _choose(rows, n, stats, num_kv_heads, num_ctas, kv_granule, cost, min_chunk)
    return choice[0] * kv_granule if choice else 0


def _choose(rows, n: np.ndarray, stats, h: int, p: int, gr: int, cost: CostModel, min_chunk: int):
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
    ns = np.sort(n)
    prefix = np.add.accumulate(ns)
    n_sum = float(prefix[-1])
    n_max = float(ns[-1])
    # Capacity rule (provable): a tile of nb blocks cut at m adds k - 1 < nb / m items and nb < n / gr + 2, so
    # m >= H * (sum(n) / gr + 2T) / (MAX_EXTRA_ITEMS_PER_CTA * P) keeps the added items under that many per CTA.
    m_cap = math.ceil(h * (n_sum / gr + 2 * n_tiles) / (MAX_EXTRA_ITEMS_PER_CTA * p))
    blocks = sorted({max(min_blocks, m_cap, math.ceil(f * mean0 / cost.beta / gr)) for f in CANDIDATE_FRACTIONS})
    # A tile is cut when it has more than max(m, 2*min_blocks - 1) granules of KV (it then gives >= 2 pieces of
    # >= min_blocks); in tokens, n > that * gr is sufficient, and split_counts uses the same test.
    thresholds = [max(m, 2 * min_blocks - 1) * gr for m in blocks]
    whole = ns.searchsorted(thresholds, side="right")  # tiles at or below each threshold stay whole
    # Exact piece counts of the tiles any candidate cuts (the longest ones), per candidate. In decode there are few:
    # plain Python then beats a dozen small NumPy calls.
    first_cut = int(whole[0])  # thresholds ascend, so whole does
    long_n = ns[first_cut:]
    if long_n.shape[0] <= 32:
        lens = long_n.tolist()
        pieces_all = [
            sum(min(-(-((v + gr - 1) // gr) // m), ((v + gr - 1) // gr) // min_blocks) if v > thr else 1 for v in lens)
            for m, thr in zip(blocks, thresholds, strict=True)
        ]
    else:
        nb = long_n + (gr - 1)
        nb //= gr
        mcol = np.array(blocks)[:, None]
        k = nb + (mcol - 1)
        k //= mcol
        np.minimum(k, nb // min_blocks, out=k)
        k[long_n <= np.array(thresholds)[:, None]] = 1  # below this candidate's threshold: whole
        pieces_all = np.add.reduce(k, axis=1).tolist()
    whole = whole.tolist()
    small = ns.searchsorted([m * gr // 2 for m in blocks], side="right").tolist()  # tiles of at most half a chunk
    r_max = float(np.maximum.reduce(rows) if isinstance(rows, np.ndarray) else rows)
    fixed = cost.alpha * r_max + cost.gamma  # an item's cost apart from its KV (largest rows)
    best_e, best = e0 * (1.0 - MIN_GAIN), None
    for m, thr, i, pieces, j in zip(blocks, thresholds, whole, pieces_all, small, strict=True):
        n_cut = n_tiles - i
        if n_cut == 0:
            continue
        pieces -= i - first_cut  # pieces of the cut tiles only
        kv_whole, longest_whole = (float(prefix[i - 1]), float(ns[i - 1])) if i else (0.0, 0.0)
        kv_cut = n_sum - kv_whole
        added = pieces - n_cut
        # Big items: the pieces and the whole tiles over half a chunk. With more than P of them some CTA gets two:
        # they come in waves (pigeonhole), each about the mean big item.
        n_big = pieces + max(i - j, 0)
        kv_big = kv_cut + (kv_whole - (float(prefix[j - 1]) if j else 0.0) if i > j else 0.0)
        big = (cost.beta * kv_big + pieces * cost.partial_row * r_max) / n_big + fixed
        x_piece = cost.beta * min(m * gr, n_max) + fixed + cost.partial_row * r_max
        x_max = max(x_piece, cost.beta * longest_whole + fixed)
        work = h * (total0 + added * fixed + pieces * cost.partial_row * r_max)
        e = estimate_makespan(h * (n_tiles + added), work, x_max, x0min, p)
        e = max(e, math.ceil(h * n_big / p) * big)
        e += cost.split_fixed
        if e < best_e:
            best_e, best = e, (m, thr)
    return best


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
