"""Split-KV: when and how finely to cut a tile's KV range into chunks that different CTAs process.

Splitting lets a few long requests spread over many CTAs, at a price: every chunk writes a float32 partial state to
the workspace and a merge pass combines them. The policy (``choose_chunk_size``) is a pure function of the tiles'
row counts and KV ranges, the number of KV heads and of CTAs; it picks ONE chunk size ``C`` (a multiple of the
kernel's KV granule: its KV tile or page size) and every tile longer than ``C`` is cut into nearly equal pieces of at
most ``C`` tokens, with boundaries on granule multiples (``split_ranges``).

How it decides (all costs from ``CostModel``; ``M`` = mean CTA load = total cost / num_ctas):

1. No split when nothing is long enough (no tile has ``2 * min_chunk`` KV tokens), or when the batch already balances:
   the makespan estimate without splitting is within 5 % of ``M``.
2. Otherwise candidate sizes ``C = a * M / beta`` for ``a`` in ``CANDIDATE_FRACTIONS`` (clamped to ``>= min_chunk``,
   rounded up to the granule) are scored by the estimated makespan plus the one-time merge cost, and the best wins if
   it beats not splitting by 3 %. A candidate that would add more than ``MAX_EXTRA_ITEMS_PER_CTA * num_ctas`` items
   is skipped, which bounds the plan's size for CUDA-graph capacities (``layout.capacity_bound``).

The makespan estimate is the *rounds bound*: sort the items by cost, deal them out in rounds of ``num_ctas``; a CTA
gets at most one item per round, so no CTA exceeds the sum over rounds of each round's largest item. It is exact for
equal items (``ceil(n / P)`` waves), which is where quantisation hurts most, and an upper bound otherwise.

Worked examples (Llama-3-8B decode: 8 KV heads, 4 rows per tile; 264 CTAs = 132 SMs x 2; costs in KV tokens, so an
item of 1024 tokens costs 1024 + 4 + 64 = 1092):

- D6, 128 x 2048: 1024 items of 2116 on 264 CTAs: M = 8207, rounds bound 4 x 2116 = 8464 (97 %): no split.
- D1, 16 x 1024: 128 items of 1092, M = 529, bound 1092 (48 %). ``C = 544`` (a = 1) cuts each into 2 x 512:
  256 items of 588 in one wave, bound 588 + 128 (merge) = 716 vs 1092: split, 1.5x better.
- D4, 1 x 32768 on 132 CTAs: 8 items, M = 1990. ``C = 2000`` (a = 1) gives 17 chunks, 136 items: two waves, bound
  3856; ``C = 1008`` (a = 0.5) gives 33 chunks, 264 items in exactly two waves of ~1000: bound 2186. The second wins.
- Pieces never go below ``min_chunk`` (default 256 tokens): below that a chunk's partial-state write and merge read
  (~2 tokens per row) and its fixed item latency (~64 tokens) stop being small next to its KV work.
"""

from __future__ import annotations

import numpy as np

from .cost import CostModel

#: Default smallest chunk, in KV tokens (see the module docstring).
DEFAULT_MIN_CHUNK = 256
#: Chunk sizes tried, as fractions of the mean CTA load (in KV tokens).
CANDIDATE_FRACTIONS = (2.0, 1.5, 1.0, 0.75, 0.5, 1.0 / 3.0, 0.25)
#: Splitting may add at most this many items per CTA (bounds the plan for fixed CUDA-graph capacities).
MAX_EXTRA_ITEMS_PER_CTA = 8
#: No split when the unsplit makespan estimate is within this factor of the mean load.
BALANCED_EFFICIENCY = 0.95
#: A split must improve the estimated makespan by this fraction to be worth its merge.
MIN_GAIN = 0.03


def rounds_makespan(costs: np.ndarray, mult: np.ndarray | int, num_ctas: int) -> float:
    """Upper bound on the makespan of dealing items out in rounds of ``num_ctas`` (largest first).

    ``costs[i]`` occurs ``mult[i]`` times (``mult`` may be a scalar). The bound sums the largest item of each round:
    the ``0``-th, ``P``-th, ``2P``-th ... largest item.
    """
    order = np.argsort(-costs, kind="stable")
    cs = costs[order]
    if np.ndim(mult) == 0:
        m = int(mult)
        n = cs.shape[0] * m
        ranks = np.arange(0, n, num_ctas)
        return float(cs[ranks // m].sum())
    cum = np.cumsum(np.asarray(mult)[order])
    ranks = np.arange(0, int(cum[-1]), num_ctas)
    return float(cs[np.searchsorted(cum, ranks, side="right")].sum())


def block_counts(kv_start: np.ndarray, kv_end: np.ndarray, granule: int) -> np.ndarray:
    """Granule blocks each range touches (``ceil(end/gr) - floor(start/gr)``; 0 for an empty range)."""
    nb = -(-kv_end // granule) - kv_start // granule
    return np.where(kv_end > kv_start, nb, 0)


def chunk_counts(nb: np.ndarray, chunk_blocks: int, min_blocks: int) -> np.ndarray:
    """Pieces per range: ``ceil(nb / chunk_blocks)``, but no piece under ``min_blocks`` blocks; at least 1."""
    k = -(-nb // chunk_blocks)
    return np.maximum(np.minimum(k, nb // max(min_blocks, 1)), 1)


def choose_chunk_size(
    rows: np.ndarray,
    kv_start: np.ndarray,
    kv_end: np.ndarray,
    *,
    num_kv_heads: int,
    num_ctas: int,
    kv_granule: int,
    cost: CostModel = CostModel(),
    min_chunk: int = DEFAULT_MIN_CHUNK,
) -> int:
    """The KV chunk size (tokens, a multiple of ``kv_granule``) to split tiles at, or 0 for no split.

    Every argument array has one entry per query tile; each tile is ``num_kv_heads`` identical items.
    """
    n_tiles = rows.shape[0]
    if n_tiles == 0:
        return 0
    gr = int(kv_granule)
    p = int(num_ctas)
    h = int(num_kv_heads)
    n = kv_end - kv_start
    min_blocks = -(-int(min_chunk) // gr)
    nb = block_counts(kv_start, kv_end, gr)
    if int(nb.max()) < 2 * min_blocks:
        return 0  # nothing can be cut into two pieces of min_chunk
    x0 = cost.item_cost(rows, n)
    mean = h * float(x0.sum()) / p
    e0 = rounds_makespan(x0, h, p)
    if mean >= BALANCED_EFFICIENCY * e0:
        return 0

    best_e, best_c = e0 * (1.0 - MIN_GAIN), 0
    tried = set()
    max_extra = MAX_EXTRA_ITEMS_PER_CTA * p
    for a in CANDIDATE_FRACTIONS:
        blocks = max(min_blocks, -(-int(a * mean / cost.beta) // gr), 1)
        if blocks in tried:
            continue
        tried.add(blocks)
        k = chunk_counts(nb, blocks, min_blocks)
        extra = h * int(k.sum() - n_tiles)
        if extra == 0 or extra > max_extra:
            continue
        split = k > 1
        x = cost.item_cost(rows, n / k, split)
        e = rounds_makespan(x, h * k, p) + cost.split_fixed
        if e < best_e:
            best_e, best_c = e, blocks * gr
    return best_c


def split_ranges(kv_start: np.ndarray, kv_end: np.ndarray, counts: np.ndarray, granule: int):
    """Cut range ``t`` into ``counts[t]`` nearly equal pieces whose inner boundaries are multiples of ``granule``.

    Returns ``(tile, piece, start, end)``, one entry per piece, tiles in order and pieces in KV order. A range of
    ``nb`` granule blocks cut in ``k`` gives each piece ``floor(nb/k)`` or ``ceil(nb/k)`` blocks (the first and last
    block may be partial when the range is not aligned). ``counts[t] == 1`` keeps the range as it is (empty ones too).
    """
    n_tiles = counts.shape[0]
    ends = np.cumsum(counts)
    n_pieces = int(ends[-1]) if n_tiles else 0
    tile = np.repeat(np.arange(n_tiles, dtype=np.int64), counts)
    piece = np.arange(n_pieces, dtype=np.int64) - np.repeat(ends - counts, counts)
    s = kv_start[tile]
    e = kv_end[tile]
    k = counts[tile]
    b0 = s // granule
    nb = -(-e // granule) - b0
    start = np.maximum(s, (b0 + piece * nb // k) * granule)
    end = np.minimum(e, (b0 + (piece + 1) * nb // k) * granule)
    return tile, piece, start, end
