"""The decode lane plan (``planner/decode_plan.py``, ``planner/lanes.py``) and the pack memos it relies on.

Property tests over decode batches with more requests than lanes (the lane plan's domain, which the batches of
test_planner.py rarely reach), the cached structures checked against a fresh computation over consecutive "serving"
steps (every length +1), and the packed buffer of memoised packs checked word for word against a full pack.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuinfer.planner import PlanLayout, capacity_bound, pack, plan_work
from cuinfer.planner import decode_plan as dp
from cuinfer.planner import decode_structure as ds
from cuinfer.planner.lanes import expand, lanes_of
from cuinfer.planner.layout import used_words
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_planner import check_plan

ARRAYS = ("work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial",
          "merge_indptr", "merge_src", "merge_dst_token", "merge_dst_head")  # fmt: skip


@st.composite
def many_requests(draw):
    """A decode batch of 20-300 requests (lengths from one of four shapes) and a configuration."""
    b = draw(st.integers(20, 300))
    shape = draw(st.sampled_from(["uniform", "onelong", "zipf", "short"]))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    if shape == "uniform":
        kv = rng.integers(0, 6000, b)
    elif shape == "onelong":
        kv = np.full(b, draw(st.integers(1, 3000)))
        kv[draw(st.integers(0, b - 1))] = draw(st.integers(20000, 200000))
    elif shape == "zipf":
        kv = np.clip(rng.zipf(1.5, b) * draw(st.integers(50, 3000)), 0, 300000)
    else:
        kv = rng.integers(0, 300, b)
    h = draw(st.integers(1, 8))
    cfg = dict(
        num_kv_heads=h,
        group_size=draw(st.integers(1, 8)),
        tile_rows=16,
        num_ctas=draw(st.integers(1, 300)),
        kv_granule=draw(st.sampled_from([1, 16, 48, 64, 128])),
        window_left=draw(st.one_of(st.just(-1), st.just(-1), st.integers(0, 5000))),
    )
    return kv.astype(np.int32), cfg


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(many_requests())
def test_lane_plans_are_valid(batch):
    kv, cfg = batch
    plan = plan_work(None, kv, **cfg)
    check_plan(plan, None, kv, **cfg)  # coverage, granule boundaries, partial blocks, merge list, Graham's bound
    event(f"mode={plan.assign_mode}")


def _fresh(monkeypatch):
    """Empty every cache the decode plan keeps (structures, pack blocks, ramps)."""
    monkeypatch.setattr(ds, "_STRUCTURES", {})
    monkeypatch.setattr(dp, "_BLOCKS", {})
    dp.decode_planner.cache_clear()
    dp._ramp.cache_clear()


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(("onelong", 128, -1, 264), id="D8-264ctas"),
        pytest.param(("zipf", 128, -1, 132), id="D9-132ctas-partial-lane"),
        pytest.param(("few-long", 77, 12000, 131), id="window-odd-ctas"),
        # cuts that land at the start of requests shorter than min_chunk: _cut's memo keys (req, keeps_start, fits)
        # then give two keys of one structure as the lengths grow
        pytest.param(("short", 211, -1, 264), id="short-requests"),
    ],
)
def test_cached_structure_equals_a_fresh_plan(shape, monkeypatch):
    """Consecutive steps (every length + 1) reuse the cached structure when the cuts stay put; every plan must equal
    the plan of the same lengths computed with empty caches."""
    dist, b, window, ctas = shape
    rng = np.random.default_rng(7)
    if dist == "onelong":
        kv = np.full(b, 1024)
        kv[0] = 32 * 1024
    elif dist == "zipf":
        kv = np.clip(rng.zipf(1.5, b) * 512, 16, 131072)
    elif dist == "short":
        kv = rng.integers(17, 251, b)
        kv[[3, 100]] = 9000
    else:  # a window of 12001 tokens over requests of up to 30000
        kv = rng.integers(100, 2000, b)
        kv[[5, 40, 41]] = 30000
    kv = kv.astype(np.int32)
    cfg = dict(num_kv_heads=8, group_size=4, tile_rows=16, num_ctas=ctas, kv_granule=64, window_left=window)
    plans = [plan_work(None, kv + step, **cfg) for step in range(12 if dist != "short" else 40)]
    assert all(p.assign_mode == "lanes" for p in plans), [p.assign_mode for p in plans]
    _fresh(monkeypatch)
    for step, plan in enumerate(plans):
        fresh = plan_work(None, kv + step, **cfg)
        for name in ARRAYS:
            np.testing.assert_array_equal(getattr(plan, name), getattr(fresh, name), err_msg=f"step {step} {name}")
        assert (plan.num_partial_rows, plan.chunk_size) == (fresh.num_partial_rows, fresh.chunk_size)


@pytest.mark.parametrize("window", [pytest.param(-1, id="no-window"), pytest.param(500, id="window")])
@pytest.mark.parametrize("dist", ["equal", "onelong", "uniform"])
def test_memoised_packs_equal_full_packs(dist, window):
    """The pack blocks (lane plans, equal requests) and the shape memo give the words a full pack writes, in a tight
    layout and a CUDA-graph one, over consecutive steps that keep and change the structure."""
    rng = np.random.default_rng(11)
    b = 97
    kv = {"equal": np.full(b, 1500), "onelong": np.full(b, 700), "uniform": rng.integers(50, 4000, b)}[dist]
    kv = kv.astype(np.int32)
    if dist == "onelong":
        kv[3] = 40000
    cfg = dict(num_kv_heads=4, group_size=5, tile_rows=16, num_ctas=50, kv_granule=64, window_left=window)
    graph = PlanLayout.for_capacity(**capacity_bound(b, b, 4, 5, 16, 50).__dict__)
    memo_bufs = {}
    for step in range(10):
        plan = plan_work(None, kv + 3 * step, **cfg)
        for lay in (PlanLayout.for_plan(plan), graph):
            buf, memo = memo_bufs.get(id(lay), (None, None))
            if buf is None or memo[0] is not lay:
                buf = np.full(lay.total_words, 0x7EADBEEF, dtype=np.int32)
                memo = (lay, {})
                memo_bufs[id(lay)] = (buf, memo)
            pack(plan, lay, buf, generation=step, memo=memo[1])
            blocks, plan.pack_blocks = plan.pack_blocks, None
            ref = np.full(lay.total_words, 0x7EADBEEF, dtype=np.int32)
            pack(plan, lay, ref, generation=step)
            plan.pack_blocks = blocks
            words = _read_words(plan, lay)
            np.testing.assert_array_equal(buf[words], ref[words], err_msg=f"step {step} {plan.assign_mode}")
            assert used_words(plan, lay) <= lay.total_words


def _read_words(plan, lay) -> np.ndarray:
    """Indices of the words a kernel reads: the header and each array up to its count."""
    off, n, nm = lay.offsets, plan.n_items, plan.n_merge
    parts = [np.arange(16), off["work_indptr"] + np.arange(plan.num_ctas + 1)]
    parts += [off[a] + np.arange(n) for a in ARRAYS[1:7]]
    parts += [off["merge_indptr"] + np.arange(nm + 1)]
    if nm:
        parts += [off["merge_src"] + np.arange(plan.n_merge_src)]
        parts += [off[a] + np.arange(nm) for a in ("merge_dst_token", "merge_dst_head")]
    return np.concatenate(parts)


@pytest.mark.parametrize(
    "ctas, heads, per_cta",
    [
        pytest.param(264, 8, None, id="33-full-lanes"),
        pytest.param(132, 8, (2, 2, 2, 2), id="partial-4ctas-2heads"),
        pytest.param(131, 8, (3, 3, 2), id="partial-3ctas"),
        pytest.param(5, 8, (2, 2, 2, 1, 1), id="only-a-partial-lane"),
    ],
)
def test_lane_expansion(ctas, heads, per_cta):
    """Full lane l: CTA l*H + h runs head h of the lane's groups; the partial lane's CTA j runs heads j, j+r, ..."""
    lanes = lanes_of(ctas, heads)
    rng = np.random.default_rng(3)
    sizes = rng.integers(0, 5, lanes.count)
    gptr = np.concatenate([[0], np.cumsum(sizes)])
    wi, ig, ih = expand(gptr, lanes)
    assert wi.shape == (ctas + 1,) and wi[0] == 0 and wi[-1] == heads * gptr[-1]
    for c in range(ctas):
        lane, j = divmod(c, heads)
        items = slice(wi[c], wi[c + 1])
        groups = np.arange(gptr[lane], gptr[lane + 1])
        if lane < lanes.full:
            np.testing.assert_array_equal(ig[items], groups)
            assert np.all(ih[items] == j)
        else:
            hs = np.arange(j, heads, lanes.rest)
            assert hs.shape[0] == per_cta[j]
            np.testing.assert_array_equal(ig[items], np.tile(groups, hs.shape[0]))
            np.testing.assert_array_equal(ih[items], hs.repeat(groups.shape[0]))
    if per_cta is not None:
        assert lanes.weight == pytest.approx(1.0 / max(per_cta))


def test_graham_fallback_reassigns_the_pieces(monkeypatch):
    """When the loads of a lane cut would break Graham's bound, the same pieces are assigned item by item."""
    kv = np.full(60, 900, dtype=np.int32)
    kv[0] = 50000
    cfg = dict(num_kv_heads=8, group_size=4, tile_rows=16, num_ctas=132, kv_granule=64)
    planner = dp.decode_planner(8, 4, 16, 132, 64)
    monkeypatch.setattr(planner, "slack", 1e12)  # take the exact test ...
    monkeypatch.setattr(dp, "_worst_load", lambda *a: float("inf"))  # ... and fail it
    plan = planner.plan(kv)
    assert plan.assign_mode.startswith("lanes-") and plan.pack_blocks is None
    check_plan(plan, None, kv, **cfg)


@pytest.mark.parametrize(
    "dist, b, window",
    [
        pytest.param("onelong", 131, -1, id="onelong"),
        pytest.param("few-long", 128, 12000, id="window"),
        pytest.param("huge", 40, -1, id="line-over-int32"),
    ],
)
def test_int32_line_equals_int64_line(dist, b, window):
    """int32 lengths whose line fits in int32 are cut in int32 (one dtype for every NumPy call); the plan and its
    packed words must equal those of the same lengths in int64. Lengths near 2**31 keep an int64 line."""
    rng = np.random.default_rng(5)
    if dist == "onelong":
        kv = np.full(b, 1031)
        kv[7] = 33001
    elif dist == "few-long":  # a window of 12001 tokens over requests of up to 30000
        kv = rng.integers(100, 2000, b)
        kv[[5, 40, 41]] = 30000
    else:  # 40 requests of up to 2**31 - 1 tokens: b * (longest + o) is far above 2**31
        kv = rng.integers(1, 2**30, b)
        kv[0] = 2**31 - 1
    cfg = dict(num_kv_heads=8, group_size=4, tile_rows=16, num_ctas=132, kv_granule=64, window_left=window)
    p32 = plan_work(None, kv.astype(np.int32), **cfg)
    p64 = plan_work(None, kv.astype(np.int64), **cfg)
    assert p32.assign_mode == p64.assign_mode == "lanes"
    line = np.int64 if dist == "huge" else np.int32
    assert p32.lane_cuts[2].dtype == line and p64.lane_cuts[2].dtype == np.int64
    check_plan(p32, None, kv.astype(np.int32), **cfg)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(p32, name), getattr(p64, name), err_msg=name)
    lay = PlanLayout.for_plan(p32)
    w32, w64 = lay.empty(), lay.empty()
    pack(p32, lay, w32)
    pack(p64, lay, w64)
    np.testing.assert_array_equal(w32, w64)


@pytest.mark.parametrize("window", [pytest.param(-1, id="no-window"), pytest.param(6000, id="window")])
def test_memo_skipped_blocks_leave_the_same_words(window):
    """pack with a memo skips the block copies when the buffer holds the blocks of the plan's structure; every word
    of the buffer (padding included) must equal a pack without the memo, over a serving loop whose structure changes
    and comes back, plans without blocks in between, two buffers taking turns and a CUDA-graph layout."""
    rng = np.random.default_rng(3)
    b = 113
    onelong = np.full(b, 640, dtype=np.int32)
    onelong[9] = 30011
    equal = np.full(b, 1500, dtype=np.int32)
    uniform = rng.integers(50, 4000, b).astype(np.int32)  # whole requests, item by item: no pack blocks
    cfg = dict(num_kv_heads=8, group_size=4, tile_rows=16, num_ctas=226, kv_granule=64, window_left=window)
    graph = PlanLayout.for_capacity(**capacity_bound(b, b, 8, 4, 16, 226).__dict__)
    steps = [onelong + s for s in range(12)] + [equal, equal + 1, onelong, uniform, onelong + 3, equal + 2]
    steps += [onelong + 5, uniform, onelong + 5]  # a plan without blocks between two of one structure
    poison = np.arange(graph.total_words + 4096, dtype=np.int32) * 7919
    # buffers (two taking turns every third step) x (tight layout, graph layout), each with its memo
    memo_bufs = {key: poison.copy() for key in ((0, 0), (0, 1), (1, 0), (1, 1))}
    plain_bufs = {key: poison.copy() for key in memo_bufs}
    memos = {key: (None, {}) for key in memo_bufs}  # (layout, memo): a new memo when the layout changes
    modes, skipped = set(), 0
    for step, kv in enumerate(steps):
        plan = plan_work(None, kv, **cfg)
        modes.add(plan.assign_mode)
        for j, lay in enumerate((PlanLayout.for_plan(plan), graph)):
            key = (step // 3 % 2, j)
            if memos[key][0] is not lay:
                memos[key] = (lay, {})
            memo = memos[key][1]
            entry = None if plan.pack_blocks is None else plan.pack_blocks.get(id(lay))
            skipped += entry is not None and memo.get("block") is entry
            pack(plan, lay, memo_bufs[key], generation=step, memo=memo)
            pack(plan, lay, plain_bufs[key], generation=step)
            np.testing.assert_array_equal(memo_bufs[key], plain_bufs[key], err_msg=f"step {step} {plan.assign_mode}")
    assert {"lanes", "linear"} <= modes and len(modes) >= 3, modes
    assert skipped >= 4, skipped


# --- small batches of long requests: equal pieces, one per lane (DecodePlanner._aligned) --------------------------


def _water_fill(n: list, lanes: int, piece_min: int) -> list:
    """Piece counts by the definition: each extra lane, one at a time, to the request with the largest pieces that
    may still be cut (pieces of at least piece_min tokens). An independent reference for _aligned's NumPy form."""
    k = [1] * len(n)
    for _ in range(lanes - len(n)):
        best = max((r for r in range(len(n)) if n[r] // (k[r] + 1) >= piece_min and n[r] // piece_min > k[r]),
                   key=lambda r: (n[r] / k[r], -r), default=None)  # fmt: skip
        if best is None:
            break
        k[best] += 1
    return k


@st.composite
def long_small_batches(draw):
    """A few requests, each longer than the mean lane load, on CTAs that make whole lanes of H."""
    h = draw(st.integers(1, 8))
    lanes = draw(st.integers(2, 40))
    b = draw(st.integers(1, lanes - 1))
    lo = draw(st.integers(600, 20000))
    kv = draw(st.lists(st.integers(lo, 3 * lo), min_size=b, max_size=b))
    cfg = dict(num_kv_heads=h, group_size=draw(st.integers(1, 8)), tile_rows=16, num_ctas=h * lanes,
               kv_granule=draw(st.sampled_from([1, 16, 48, 64])),
               window_left=draw(st.one_of(st.just(-1), st.integers(lo, 4 * lo))))  # fmt: skip
    return np.asarray(kv, dtype=np.int32), cfg


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_small_batches())
def test_small_batches_of_long_requests_get_equal_pieces_one_per_lane(batch):
    kv, cfg = batch
    h, p, gr = cfg["num_kv_heads"], cfg["num_ctas"], cfg["kv_granule"]
    planner = dp.decode_planner(h, cfg["group_size"], 16, p, gr, cfg["window_left"])
    w = cfg["window_left"] + 1 if cfg["window_left"] >= 0 else 0
    n = np.minimum(kv, w) if w else kv
    lanes = p // h
    if (int(n.min()) + planner.o) * lanes < int(n.sum()) + kv.shape[0] * planner.o:
        event("a request under the mean lane load: not this path")
        return
    plan = plan_work(None, kv, **cfg)
    check_plan(plan, None, kv, **cfg)  # coverage, granule boundaries, partial blocks, merge list, Graham's bound
    if plan.num_partial_rows == 0:
        event("not split")
        return
    event("split")
    assert plan.assign_mode == "lanes"
    assert np.all(np.diff(plan.work_indptr) <= 1), "one piece per CTA"
    want = np.asarray(_water_fill(n.tolist(), lanes, planner.piece_min))
    got = np.bincount(plan.item_req, minlength=kv.shape[0]) // h
    # in granules (on the absolute grid: a window's start need not be on one), the largest piece is the water
    # fill's; pieces that would not lower it are not cut
    start = (kv - n).astype(np.int64)
    tiles = -(-(start + n) // max(gr, 1)) - start // max(gr, 1)
    largest = int((-(-tiles // want)).max())
    assert got.sum() <= lanes and np.all(got <= want)
    assert int((-(-tiles // got)).max()) == largest
    assert np.all((got == 1) | (-(-tiles // (got - 1).clip(1)) > largest)), "one piece fewer would be longer"
    size = plan.item_kv_end - plan.item_kv_start
    for r in range(kv.shape[0]):
        pieces = size[plan.item_req == r]
        # equal pieces, up to the rounding of each cut to the granule (half a granule each way: a piece between two
        # cuts moves by up to one granule) and of n / k to whole tokens
        assert pieces.max() - pieces.min() <= 2 * max(gr, 1) + 1, (r, np.unique(pieces))


@st.composite
def mixed_small_batches(draw):
    """A few long requests among short ones, on CTAs that make whole lanes of H."""
    h = draw(st.integers(1, 8))
    lanes = draw(st.integers(4, 40))
    n_long = draw(st.integers(1, max(1, lanes // 4)))
    n_short = draw(st.integers(1, lanes - n_long))
    long_len = st.integers(2000, 60000)
    short_len = st.integers(0, 600)
    kv = draw(st.lists(long_len, min_size=n_long, max_size=n_long)) + draw(
        st.lists(short_len, min_size=n_short, max_size=n_short)
    )
    kv = draw(st.permutations(kv))
    cfg = dict(num_kv_heads=h, group_size=draw(st.integers(1, 8)), tile_rows=16, num_ctas=h * lanes,
               kv_granule=draw(st.sampled_from([1, 16, 48, 64])),
               window_left=draw(st.one_of(st.just(-1), st.just(-1), st.integers(1000, 30000))))  # fmt: skip
    return np.asarray(kv, dtype=np.int32), cfg


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_small_batches())
def test_small_batches_of_long_and_short_requests(batch):
    """The mixed small-batch plan (DecodePlanner._mixed) or the tile pipeline: a valid plan either way; the mixed
    plan puts each long piece alone on its CTAs and keeps every lane within MIXED_BALANCE of the mean (+ a granule
    and a cut piece's partial states)."""
    kv, cfg = batch
    h, p, gr = cfg["num_kv_heads"], cfg["num_ctas"], cfg["kv_granule"]
    plan = plan_work(None, kv, **cfg)
    check_plan(plan, None, kv, **cfg)  # coverage, granule boundaries, partial blocks, merge list, Graham's bound
    event(f"mode={plan.assign_mode}")
    if plan.assign_mode != "lanes":
        return
    planner = dp.decode_planner(h, cfg["group_size"], 16, p, gr, cfg["window_left"])
    w = cfg["window_left"] + 1 if cfg["window_left"] >= 0 else 0
    n = np.minimum(kv, w) if w else kv
    t = (int(n.sum()) + kv.shape[0] * planner.o) / (p // h)
    split = plan.item_partial >= 0
    per_cta = np.diff(plan.work_indptr)
    owner = np.repeat(np.arange(p), per_cta)
    assert np.all(per_cta[owner[split]] == 1), "a piece of a cut request runs alone on its CTA"
    if int(n.min()) + planner.o >= t:
        event("every request above the mean lane load: _aligned")  # (its pieces are bounded by piece_min instead)
        return
    cost = (plan.item_kv_end - plan.item_kv_start).astype(np.float64) + planner.o
    cost += 2 * planner.xp * (plan.item_partial >= 0)
    loads = np.bincount(np.repeat(np.arange(p), np.diff(plan.work_indptr)), weights=cost, minlength=p)
    assert loads.max() <= dp.MIXED_BALANCE * (t + 2 * planner.xp + gr) + 1e-6


def test_small_batch_worked_examples():
    """D1 (16 x 1024 on 264 CTAs): 32 pieces of 512, one lane empty. D2: the water fill gives the longest request
    (1021) three pieces and the others two, but at 64-token tiles two pieces of 1021 are no longer than the largest
    (8 tiles): every request in two pieces, one item per CTA. D4 (1 x 32768): 32 pieces of 1024, not 33."""
    from bench.cases import DECODE_CASES

    cases = {c.id: c for c in DECODE_CASES}
    cfg = dict(num_kv_heads=8, group_size=4, tile_rows=16, num_ctas=264, kv_granule=64)
    d1 = plan_work(None, np.full(16, 1024, dtype=np.int32), **cfg)
    assert d1.assign_mode == "lanes" and d1.n_items == 256
    assert np.all(d1.item_kv_end - d1.item_kv_start == 512)
    lens = cases["D2"].lengths.draw(cases["D2"].seed).astype(np.int32)
    d2 = plan_work(None, lens, **cfg)
    check_plan(d2, None, lens, **cfg)
    pieces = np.bincount(d2.item_req, minlength=16) // 8
    assert pieces.tolist() == [2] * 16
    assert np.all(np.diff(d2.work_indptr) <= 1)
    assert int((d2.item_kv_end - d2.item_kv_start).max()) == 512
    d4 = plan_work(None, np.array([32768], dtype=np.int32), **cfg)
    assert d4.n_items == 256 and np.all(d4.item_kv_end - d4.item_kv_start == 1024)
