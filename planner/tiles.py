"""Query tiles and the KV range each one attends to (sequence lengths in, one entry per tile out).

Rows are *packed*: the ``g = group_size`` query heads that share a KV head are fused into the rows of one tile, token
major (packed row ``r = token * g + h_in_group``). Request ``b`` with ``L_b`` query tokens has ``L_b * g`` packed rows
and ``ceil(L_b * g / Br)`` tiles; tile ``t`` covers packed rows ``[t*Br, min((t+1)*Br, L_b*g))``. Decode is
``L_b = 1``: one tile of ``g`` rows per request.

The KV range of a tile is the union of what its rows may see, so the kernel visits only KV that some row needs:

- causal (bottom-right aligned): the row of token ``i`` sees ``j <= i + kv_len - qo_len``, so the tile's range ends at
  ``kv_len - qo_len + last_token + 1``, clipped to ``[0, kv_len]``;
- sliding window ``w >= 0``: token ``i`` sees ``j >= i + kv_len - qo_len - w``; the range starts at that bound for the
  tile's *first* token (so every row of the tile is covered; the kernel still masks per row), clipped at 0.

A tile whose range is empty (causal, more query than KV tokens) keeps an empty range ``[start, start)``: the kernel
writes o = 0 and lse = -inf for its rows. Every ``start <= end``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(eq=False, slots=True)
class Tiles:
    """One entry per query tile, in request order then tile order.

    For speed, fields that are the same for every tile (decode: ``index = 0``, ``rows = g``, ``kv_start = 0``
    without a window) are Python ints instead of arrays; ``at`` reads either kind. ``req`` and ``index`` may be
    read-only arrays shared with earlier tiles of the same query lengths (``fixed``, see ``whole_token_tiles``).
    Slots: the plan path makes one per call (``_whole_tiles``) and reads it a dozen times.
    """

    count: int
    decode: bool  # every request has exactly one query token (token b of the batch is request b's)
    req: np.ndarray  # [T] request of each tile
    index: np.ndarray | int  # [T] tile index within its request
    rows: np.ndarray | int  # [T] packed rows in the tile (<= tile_rows)
    kv_start: np.ndarray | int  # [T] first KV token the tile attends to
    kv_end: np.ndarray  # [T] one past the last (kv_start <= kv_end)
    # When ``rows`` is the scalar tile_rows but each request's last tile is shorter: those tiles (intp) and the rows
    # each lacks (``rows - short`` are its rows).
    last: np.ndarray | None = None
    short: np.ndarray | None = None
    # ``req`` and ``index`` are cached read-only arrays: the same objects always hold the same values
    fixed: bool = False

    @property
    def last_rows(self) -> tuple | None:
        """``(last tiles, their rows)`` when ``rows`` is a scalar but those tiles are shorter, else None."""
        if self.last is None:
            return None
        return self.last, self.rows - self.short

    def row_array(self):
        """``rows`` with the last tiles' rows in (an array, or the scalar when every tile has it)."""
        if self.last is None:
            return self.rows
        rows = np.full(self.count, self.rows, dtype=self.req.dtype)
        rows[self.last] = self.rows - self.short
        return rows


def at(x, idx: np.ndarray):
    """``x[idx]`` for an array, ``x`` itself for a scalar field (same value for every tile)."""
    return x.take(idx) if isinstance(x, np.ndarray) else x


def as_lengths(x, name: str) -> np.ndarray:
    """A 1-D integer array of non-negative per-request lengths (NumPy, list, or host tensor)."""
    return lengths_and_range(x, name)[0]


def lengths_and_range(x, name: str) -> tuple[np.ndarray, int, int]:
    """``(as_lengths(x, name), min, max)`` (``(.., 0, 0)`` when empty): the planner needs the range anyway."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array with one length per request, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        if a.size and (a.dtype.kind != "f" or not np.all(a == np.floor(a))):
            raise ValueError(f"{name} must hold integers, got dtype {a.dtype}; pass an int32 or int64 array")
        a = a.astype(np.int64)
    if not a.size:
        return a, 0, 0
    lo = int(np.minimum.reduce(a))
    if lo < 0:
        i = int(np.argmin(a))
        raise ValueError(f"{name} must be >= 0, got {name}[{i}] = {int(a[i])}")
    return a, lo, int(np.maximum.reduce(a))


def qo_lens_from_indptr(qo_indptr) -> np.ndarray:
    """``qo_indptr[b+1] - qo_indptr[b]``, checked non-decreasing."""
    ind = np.asarray(qo_indptr)
    if ind.ndim != 1 or ind.shape[0] < 1 or ind.dtype.kind not in "iu":
        raise ValueError(
            f"qo_indptr must be a 1-D integer array of len(batch) + 1 offsets, got shape {ind.shape} dtype {ind.dtype}"
        )
    lens = ind[1:] - ind[:-1]
    if lens.size and lens.min() < 0:
        b = int(np.argmin(lens))
        raise ValueError(
            f"qo_indptr must be non-decreasing, but qo_indptr[{b + 1}] = {int(ind[b + 1])} < qo_indptr[{b}] = "
            f"{int(ind[b])}; it holds the CSR offsets of each request's query rows (0, then running sums)"
        )
    return lens


def kv_lens_from_pages(kv_indptr, kv_last_page_len, page_size: int) -> np.ndarray:
    """KV length of each request of a paged cache: ``page_size * (num_pages - 1) + last_page_len``.

    ``kv_indptr`` holds the CSR offsets of each request's pages in ``kv_indices``; ``1 <= last_page_len <=
    page_size`` for a request with pages. A request with no page has length 0 whatever its ``last_page_len``.
    Checking the page table itself (ranges, monotonic offsets) is the caller's job (``interop.validate``).
    """
    ind = np.asarray(kv_indptr)
    last = np.asarray(kv_last_page_len)
    if ind.ndim != 1 or last.ndim != 1 or last.shape[0] != ind.shape[0] - 1:
        raise ValueError(
            f"kv_indptr has shape {ind.shape} and kv_last_page_len has shape {last.shape}; they must be 1-D with "
            f"len(kv_indptr) == len(kv_last_page_len) + 1 (one entry per request plus the leading 0)"
        )
    lens = ind[1:] - ind[:-1]
    lens *= page_size
    lens += last
    lens -= page_size
    return np.maximum(lens, 0, out=lens)  # no page: 0 (the formula gave last_page_len - page_size <= 0)


def query_tiles(
    qo_lens,
    kv_lens,
    *,
    group_size: int,
    tile_rows: int,
    causal: bool = False,
    window_left: int = -1,
) -> Tiles:
    """The query tiles of a batch and the KV range of each (``qo_lens=None`` means decode: one token per request)."""
    kv = as_lengths(kv_lens, "kv_lens")
    g = int(group_size)
    br = int(tile_rows)
    if g < 1 or br < 1:
        raise ValueError(f"group_size={group_size} and tile_rows={tile_rows} must both be >= 1")
    w = int(window_left)
    b = kv.shape[0]

    if qo_lens is None:
        qo = None
    else:
        qo = as_lengths(qo_lens, "qo_lens")
        if qo.shape[0] != b:
            raise ValueError(
                f"qo_lens has {qo.shape[0]} requests but kv_lens has {b}; give one length per request in both"
            )
        if b and int(qo.max()) == 1 and int(qo.min()) == 1:
            qo = None  # decode

    return tiles_of(qo, kv, g, br, causal, w)


def tiles_of(qo, kv: np.ndarray, g: int, br: int, causal: bool, w: int, qo_min: int | None = None) -> Tiles:
    """``query_tiles`` on checked arrays (``qo`` None: decode); ``qo_min`` is ``qo.min()`` when the caller has it."""
    b = kv.shape[0]
    if qo is None and g <= br:
        # Decode: one tile of g rows per request; causal changes nothing (the only token is the last one).
        start = np.maximum(kv - (w + 1), 0) if w >= 0 else 0
        return Tiles(count=b, decode=True, req=np.arange(b), index=0, rows=g, kv_start=start, kv_end=kv)
    if qo is not None and w < 0 and br % g == 0 and b:
        return whole_token_tiles(qo, kv, g, br, causal, int(qo.min()) if qo_min is None else qo_min)
    decode = qo is None
    if decode:
        qo = np.ones(b, dtype=np.int64)

    qo = qo.astype(np.int64, copy=False)
    kv = kv.astype(np.int64, copy=False)
    rows_b = qo * g
    nt_b = rows_b + (br - 1)
    nt_b //= br
    ends = np.add.accumulate(nt_b)
    n_tiles = int(ends[-1]) if b else 0
    # Per-request values are spread over the tiles with repeat (cheaper than gathers by a tile->request index).
    req = np.arange(b).repeat(nt_b)
    index = np.arange(n_tiles)
    index -= (ends - nt_b).repeat(nt_b)
    row0 = index * br
    rows = rows_b.repeat(nt_b)
    rows -= row0  # packed rows from the tile's first to the request's end
    np.minimum(rows, br, out=rows)
    if causal:
        # token i sees j <= i + kv - qo; the tile's last token is (row0 + rows - 1) // g. The end is never past
        # kv (the last token is at most qo - 1) and is clipped at 0 (more queries than keys).
        end = row0 + rows
        end -= 1
        end //= g
        end += (kv - qo + 1).repeat(nt_b)
        np.maximum(end, 0, out=end)
    else:
        end = kv.repeat(nt_b)
    if w >= 0:
        start = row0 // g  # first token of the tile
        start += (kv - qo - w).repeat(nt_b)
        np.maximum(start, 0, out=start)
        np.minimum(start, end, out=start)
    else:
        start = 0
    return Tiles(count=n_tiles, decode=decode, req=req, index=index, rows=rows, kv_start=start, kv_end=end)


def whole_token_tiles(qo: np.ndarray, kv: np.ndarray, g: int, br: int, causal: bool, qo_min: int,
                       qo_max: int | None = None) -> Tiles:  # fmt: skip
    """Tiles that hold whole tokens (``Br % g == 0``, ``t = Br / g`` tokens each) and no window, in about fifteen
    NumPy calls (on request and tile arrays alike they cost ~1 us each, so every call counts), six when the query
    lengths repeat (their structure is cached, below). ``qo_min`` / ``qo_max``: the range of ``qo`` (the maximum is
    found when not given).

    Tile ``j`` of the batch (the ``index``-th of request ``b``) holds tokens ``[index*t, min((index+1)*t, qo))``;
    causal, it sees keys below ``kv - qo + min((index+1)*t, qo)``, which is ``(j+1)*t + c_b`` with
    ``c_b = kv_b - q_b`` and ``q_b = qo_b + first_b * t`` (``first_b`` its first tile), except the request's last
    tile, which sees all ``kv_b``. Rows are ``Br`` except in each request's last tile (``last``, ``short``).

    The tile arrays are computed in the lengths' dtype with operands of that dtype (int32: no cast, half the memory
    traffic of int64). ``q_b`` and ``c_b`` may wrap in int32, but they only feed the ends, which fit int32: the ends
    are the same modulo 2**32 as in int64, so the same.

    Everything but the ends depends on the query lengths alone (the *structure*: requests, tile indices, the last
    tiles, their rows). When the query lengths of one ``(Br, g, dtype, causal)`` come twice in a row, their structure
    is kept (``req`` and ``index`` read-only) until other query lengths come: a batch with the same query lengths
    (the same batch planned again; chunked prefill of equal chunks over growing caches) then only computes its ends,
    and its ``req`` and ``index`` are the same array objects as before, which ``layout.pack`` uses to skip
    rewriting them into a buffer that holds them (``workplan.FIXED``). Other batches pay a copy of their query
    lengths and one comparison.
    """
    dtype = qo.dtype
    if dtype is not _I32 or kv.dtype is not _I32:  # int32 packs without a cast; anything else goes to int64
        dtype = _I32 if dtype == _I32 and kv.dtype == _I32 else _I64
        qo, kv = qo.astype(dtype, copy=False), kv.astype(dtype, copy=False)
    key = (br, g, dtype is _I32, causal)  # (the dtype is int32 or int64 here: a bool hashes faster)
    qb = qo.tobytes()  # (a copy of b words: cheaper than any comparison that does not keep one)
    hit = _STRUCTURES.get(key)
    if hit is None or hit[0] != qb:  # new query lengths: remembered, their structure is kept if they come again
        if len(_STRUCTURES) >= 32:
            _STRUCTURES.clear()
        _STRUCTURES[key] = (qb, None)
        return _new_structure(qo, kv, g, br, causal, qo_min, qo_max, None, None)
    st = hit[1]
    if st is None:
        return _new_structure(qo, kv, g, br, causal, qo_min, qo_max, key, qb)
    n, nt = st.count, st.nt
    line = _LINES.get(key[:3])
    if line is None or line[6] < n:
        line = _line(br, g, dtype, n)
    if causal:
        end = np.subtract(kv, st.q).repeat(nt)
        end += line[1][:n]  # (j+1)*t + c_b
        end[st.last] = kv if st.has is None else kv[st.has]  # the last tiles see all the keys
        np.maximum(end, line[2][:n], out=end)  # (see _new_structure)
    else:
        end = kv.repeat(nt)
    return _whole_tiles(n, st.req, st.index, br, end, st.last, st.short, True)


def _new_structure(qo: np.ndarray, kv: np.ndarray, g: int, br: int, causal: bool, qo_min: int, qo_max: int | None,
                   key: tuple | None, qb: bytes | None) -> Tiles:  # fmt: skip
    """``whole_token_tiles`` without a cached structure: the tiles, and (``key`` given) their structure cached for
    the query lengths ``qb``. Caching costs a few microseconds (read-only flags, the record), which is why query
    lengths are only cached the second time they come.

    Every NumPy call costs about a microsecond here, a mixed-dtype one (a cast) up to twice that, so: the tile
    count and the short last tile's missing rows of each request are read from a table by query length (one gather,
    ``_by_length``); the other per-request values go, in the tiles' dtype, into the rows of ONE array ``[request,
    -first tile, c_b (not causal: kv_b), one past the last tile]`` (the first a copy of a cached ramp), and the first
    three reach the tiles in ONE repeat. Past the table, int32 lengths are computed in int32 when the tile counts and
    their running sum surely fit it (``qo_max``: always but for absurd lengths), else in int64 (``wide``, the rows
    then take int32 casts of what fits them)."""
    t = br // g
    b = qo.shape[0]
    dtype = qo.dtype
    line = _LINES.get((br, g, dtype is _I32))  # constants, ramps
    if line is None or line[6] < b:
        line = _line(br, g, dtype, b)
    if qo_max is None:
        qo_max = int(np.maximum.reduce(qo))
    wide = dtype is _I32 and b * (qo_max + t) >= 2**31
    rows = line[7].get(b)
    rows = _request_rows(line[7], b, dtype) if rows is None else rows.copy()
    by_length = line[8]
    if qo_max < by_length[0]:
        per = by_length[1].take(qo, axis=1)  # one gather in place of five calls
        nt, short = per[0], per[1]
    elif qo_max < _BY_LENGTH_MAX and not wide:
        by_length = _by_length(line, t, g, dtype, qo_max)
        per = by_length[1].take(qo, axis=1)
        nt, short = per[0], per[1]
    else:
        c_t1, c_t, c_g = line[4] if wide else line[3]  # 0-d operands of the arithmetic's dtype
        nt = (qo.astype(_I64) if wide else qo) + c_t1
        nt //= c_t  # tiles per request
        short = nt * c_t
        short -= qo
        short *= c_g  # rows the last tile lacks: g * (t * tiles - tokens), < Br
        if wide:
            short = short.astype(_I32)
    ends = np.add.accumulate(nt) if wide else np.add.accumulate(nt, out=rows[3])
    n = ends.item(-1)
    if dtype is _I32 and not 0 <= (n + 1) * t < 2**31:  # (absurd sizes) the tile line does not fit int32
        return whole_token_tiles(qo.astype(_I64), kv.astype(_I64), g, br, causal, qo_min, qo_max)
    # each request's last tile, as intp: NumPy converts other index arrays on every use (~2 us each)
    last = np.subtract(ends, line[5])
    if line[6] < n:
        line = _line(br, g, dtype, n)
    neg_first = np.subtract(nt, ends, out=rows[1])
    c = rows[2]
    if causal:
        np.multiply(neg_first, line[3][1], out=c)
        c += kv
        c -= qo  # kv - (qo + first * t): may wrap in int32, like the ends it feeds (see whole_token_tiles)
    else:
        c[...] = kv  # the ends, spread with the rest
    nt64 = nt if nt.dtype is _I64 else nt.astype(_I64)  # (repeat takes intp counts: others cost a cast inside)
    spread = rows[:3].repeat(nt64, axis=1)
    req, index, end = spread[0], spread[1], spread[2]
    index += line[0][:n]  # j - first (in-place operators: the cheapest NumPy calls)
    has = None if qo_min > 0 else nt > 0  # requests without query tokens have no tile
    if has is not None:
        last, short = last[has], short[has]
    q = None
    if causal:
        end += line[1][:n]  # (j+1)*t + c_b
        end[last] = kv if has is None else kv[has]  # the last tile sees all the keys (the others end below kv)
        # More queries than keys: the first tiles see nothing (a clamp over the tiles is cheaper than finding out
        # whether any request needs it: a reduction costs more than this pass). Against an array of zeros: NumPy's
        # maximum is vectorised for two arrays, not for an array and a scalar.
        np.maximum(end, line[2][:n], out=end)
        if key is not None:
            q = np.subtract(kv, c)  # qo + first * t, what the cached path subtracts from the next KV lengths
    fixed = key is not None and n <= _CACHE_TILES
    if fixed:
        # req and index go into plans (and pack's FIXED fields): read-only. The other arrays of the structure are
        # only read by the planner. (setflags: half the cost of the flags attribute)
        req.setflags(write=False)
        index.setflags(write=False)
        if len(_STRUCTURES) >= 32:
            _STRUCTURES.clear()
        _STRUCTURES[key] = (qb, _Structure(n, nt64, req, index, last, short, has, q))
    return _whole_tiles(n, req, index, br, end, last, short, fixed)


def _whole_tiles(n: int, req, index, br: int, end, last, short, fixed: bool) -> Tiles:
    """``Tiles`` of whole tokens without a window (``kv_start`` 0), without the dataclass ``__init__`` (its keyword
    handling costs a microsecond on the plan path)."""
    tiles = object.__new__(Tiles)
    tiles.count, tiles.decode, tiles.req, tiles.index, tiles.rows = n, False, req, index, br
    tiles.kv_start, tiles.kv_end, tiles.last, tiles.short, tiles.fixed = 0, end, last, short, fixed
    return tiles


class _Structure:
    """What the tiles of one set of query lengths share whatever the KV lengths (``req`` and ``index`` read-only, the
    other arrays never written after they are made)."""

    __slots__ = ("count", "nt", "req", "index", "last", "short", "has", "q")

    def __init__(self, count, nt, req, index, last, short, has, q) -> None:
        self.count, self.nt, self.req, self.index, self.last, self.short = count, nt, req, index, last, short
        self.has, self.q = has, q


#: Structures (``whole_token_tiles``) of at most this many tiles are cached (a few arrays of as many words).
_CACHE_TILES = 1 << 20
_STRUCTURES: dict = {}  # (Br, g, int32?, causal) -> (the query lengths' bytes, _Structure)


_I32 = np.dtype(np.int32)
_I64 = np.dtype(np.int64)


_LINES: dict = {}


def _line(br: int, g: int, dtype, n: int) -> tuple:
    """``(arange(m), (arange(m) + 1) * t, zeros(m), 0-d (t - 1, t, g) of the dtype, the same in int64, 0-d int64 1,
    m, {batch: request rows}, [M, per-length table])`` for ``t = Br / g``, ``m >= n``: what ``whole_token_tiles``
    reads, read-only (the rows: see ``_request_rows``; the table: ``_by_length``), cached per ``(Br, g, dtype)`` and
    grown by doubling."""
    t = br // g
    old = _LINES.get((br, g, dtype is _I32))
    m = max(n, 2 * (0 if old is None else old[0].shape[0]), 4096)
    ramp = np.arange(m, dtype=np.int64)
    steps = ramp + 1
    steps *= t
    if dtype is _I32:  # (only the first n with (n + 1) * t < 2**31 are ever read)
        np.minimum(steps, 2**31 - 1, out=steps)
        np.minimum(ramp, 2**31 - 1, out=ramp)
    ramp, steps, zeros = ramp.astype(dtype), steps.astype(dtype), np.zeros(m, dtype=dtype)
    ramp.flags.writeable = steps.flags.writeable = zeros.flags.writeable = False
    if len(_LINES) >= 32:
        _LINES.clear()
    line = _LINES[(br, g, dtype is _I32)] = (
        ramp, steps, zeros, _consts(dtype, t - 1, t, g), _consts(_I64, t - 1, t, g), _consts(_I64, 1)[0], m,
        {} if old is None else old[7], [0, None] if old is None else old[8],
    )  # fmt: skip
    return line


#: Query lengths below this use the table of ``_by_length`` (two rows of int32 per length: 256 KB at most).
_BY_LENGTH_MAX = 1 << 15


def _by_length(line: tuple, t: int, g: int, dtype, qo_max: int) -> list:
    """Grow ``line[8] = [M, table]``: ``table[:, q]`` is ``[tiles, rows the last tile lacks]`` of a request of ``q``
    query tokens, ``q < M`` (``M > qo_max``, doubled, at most ``_BY_LENGTH_MAX``): what ``_new_structure`` would
    compute with five NumPy calls, gathered with one."""
    m = min(max(4096, 2 * line[8][0], 1 << int(qo_max).bit_length()), _BY_LENGTH_MAX)
    q = np.arange(m, dtype=np.int64)
    tiles = -(-q // t)
    table = np.stack([tiles, g * (t * tiles - q)]).astype(dtype)
    table.flags.writeable = False
    line[8][:] = [m, table]
    return line[8]


def _request_rows(kept: dict, b: int, dtype) -> np.ndarray:
    """A fresh ``(4, b)`` array for ``_new_structure``, its row 0 ``arange(b)``; the first of each batch size is
    kept (read-only, in ``kept``) and copied for the next ones."""
    rows = np.zeros((4, b), dtype=dtype)
    rows[0] = np.arange(b)
    rows.flags.writeable = False
    if len(kept) >= 64:
        kept.clear()
    kept[b] = rows
    return rows.copy()


@functools.lru_cache(maxsize=64)
def _consts(dtype, *values) -> tuple:
    """0-d operands (NumPy calls with Python scalars cost about twice as much on small arrays)."""
    out = tuple(np.array(v, dtype=dtype) for v in values)
    for c in out:
        c.flags.writeable = False
    return out
