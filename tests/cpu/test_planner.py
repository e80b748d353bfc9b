"""Property tests of ``cuinfer.planner.plan_work`` over random batches, and the plan checker the other planner tests
import (``check_plan``).

The checker rebuilds the query tiles and their KV ranges with plain Python loops straight from docs/internals.md
("Work plans") and docs/api.md (causal bottom-right, sliding window), then checks every invariant of a ``WorkPlan``:
coverage of each (request, tile, KV head) range exactly once by contiguous pieces, chunk boundaries on the granule,
CTA-major lists, partial blocks disjoint and in bounds, the merge list, and Graham's bound on the balance.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuinfer.planner import CostModel, WorkPlan, plan_work
from cuinfer.planner.assign import POOL_SHARE
from cuinfer.planner.cost import DEFAULT_COST
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st


def reference_tiles(qo_lens, kv_lens, g: int, br: int, causal: bool, window_left: int):
    """``[(req, tile, rows, first_packed_row, start, end)]`` in request, tile order."""
    out = []
    for b, (lq, lk) in enumerate(zip(qo_lens, kv_lens, strict=True)):
        lq, lk = int(lq), int(lk)
        total = lq * g
        for t in range(-(-total // br)):
            r0, r1 = t * br, min((t + 1) * br, total)
            first_tok, last_tok = r0 // g, (r1 - 1) // g
            end = lk
            if causal:
                end = min(max(lk - lq + last_tok + 1, 0), lk)
            start = 0
            if window_left >= 0:
                start = max(0, first_tok + lk - lq - window_left)
            start = min(start, end)
            out.append((b, t, r1 - r0, r0, start, end))
    return out


def item_costs(plan: WorkPlan, rows: np.ndarray, cost: CostModel) -> np.ndarray:
    kv = plan.item_kv_end.astype(np.float64) - plan.item_kv_start
    split = plan.item_partial >= 0
    return cost.alpha * rows + cost.beta * kv + cost.gamma + cost.partial_row * rows * split


def check_plan(
    plan: WorkPlan,
    qo_lens,
    kv_lens,
    *,
    num_kv_heads: int,
    group_size: int,
    tile_rows: int,
    num_ctas: int,
    kv_granule: int,
    causal: bool = False,
    window_left: int = -1,
    fixed_split_size: int | None = None,
    disable_split: bool = False,
    cost: CostModel = DEFAULT_COST,
    pool_share: float = 0.0,
) -> dict:
    """Assert every invariant; return a few statistics (loads, ...) for further checks."""
    h, g, br, p = num_kv_heads, group_size, tile_rows, num_ctas
    decode = qo_lens is None
    qo = np.ones(len(kv_lens), dtype=np.int64) if decode else np.asarray(qo_lens, dtype=np.int64)
    tiles = reference_tiles(qo, kv_lens, g, br, causal, window_left)
    n = plan.n_items

    # --- work_indptr: CTA-major, every CTA index valid --------------------------------------------------------
    wi = plan.work_indptr
    assert plan.num_ctas == p
    assert wi.shape == (p + 1,) and wi[0] == 0 and wi[-1] == n - plan.n_pool, (wi[:3], wi[-3:], n, plan.n_pool)
    assert np.all(np.diff(wi) >= 0)

    req, tile, head = plan.item_req, plan.item_qo_tile, plan.item_kv_head
    s, e, part = plan.item_kv_start, plan.item_kv_end, plan.item_partial
    for a in (req, tile, head, s, e, part):
        assert a.shape == (n,)
    assert np.all((head >= 0) & (head < h))
    assert np.all(s <= e)

    # --- coverage: every (request, tile, head) range covered exactly once, in pieces --------------------------
    ref = {(b, t): (rows, r0, st, en) for b, t, rows, r0, st, en in tiles}
    assert n >= len(ref) * h
    order = np.lexsort((s, head, tile, req))
    rs, ts, hs, ss, es, ps = (a[order] for a in (req, tile, head, s, e, part))
    key = (rs.astype(np.int64) * (1 << 20) + ts) * 64 + hs
    bounds = np.flatnonzero(np.diff(key)) + 1
    starts = np.concatenate(([0], bounds)) if n else bounds  # (no item: no run)
    stops = np.concatenate((bounds, [n])) if n else bounds
    assert len(starts) == len(ref) * h, (len(starts), len(ref) * h)
    rows_of_item = np.empty(n, dtype=np.float64)
    partial_blocks = []
    split_units = {}
    for a, z in zip(starts.tolist(), stops.tolist(), strict=True):
        b, t, hh = int(rs[a]), int(ts[a]), int(hs[a])
        assert (b, t) in ref, f"item for a tile that does not exist: request {b} tile {t}"
        rows, r0, st, en = ref[(b, t)]
        rows_of_item[order[a:z]] = rows
        k = z - a
        assert ss[a] == st and es[z - 1] == en, ((b, t, hh), (ss[a], es[z - 1]), (st, en))
        assert np.all(ss[a + 1 : z] == es[a : z - 1]), "pieces of one tile must be contiguous (no gap, no overlap)"
        if k == 1:
            assert ps[a] == -1, f"an unsplit tile writes the output directly (partial -1), got {ps[a]}"
            continue
        assert st < en, "an empty range is never split"
        assert np.all(es[a:z] > ss[a:z]), "pieces are never empty"
        assert not disable_split
        assert np.all(ps[a:z] >= 0), "pieces of a split tile all write partial states"
        inner = es[a : z - 1]
        step = fixed_split_size if fixed_split_size is not None else kv_granule
        assert np.all(inner % step == 0), f"inner piece boundaries must be multiples of {step}: {inner}"
        if fixed_split_size is not None:
            assert np.all(es[a:z] - ss[a:z] <= fixed_split_size)
        partial_blocks += [(int(q), rows) for q in ps[a:z]]
        split_units[(b, t, hh)] = (rows, r0, [int(q) for q in ps[a:z]])
    if disable_split:
        assert n == len(ref) * h
    if fixed_split_size is not None:  # every tile longer than the chunk is cut at its multiples
        for (b, t), (_rows, _r0, st, en) in ref.items():
            want = max(1, -(-en // fixed_split_size) - st // fixed_split_size) if en > st else 1
            got = 1 if (b, t, 0) not in split_units else len(split_units[(b, t, 0)][2])
            assert got == want, ((b, t), got, want)

    # --- partial blocks: disjoint, inside num_partial_rows ---------------------------------------------------
    used = np.zeros(plan.num_partial_rows, dtype=np.int64)
    for q, rows in partial_blocks:
        assert 0 <= q and q + rows <= plan.num_partial_rows, (q, rows, plan.num_partial_rows)
        used[q : q + rows] += 1
    assert np.all(used <= 1), "partial blocks overlap"

    # --- merge list: one entry per packed row of every split (tile, head); sources in KV order ---------------
    mi, src = plan.merge_indptr, plan.merge_src
    tok, qh = plan.merge_dst_token, plan.merge_dst_head
    assert mi.shape == (plan.n_merge + 1,) and mi[0] == 0 and mi[-1] == src.shape[0]
    assert np.all(np.diff(mi) >= 2), "a merge entry combines at least two partial states"
    qo_start = np.concatenate(([0], np.cumsum(qo)))
    expect = {}
    for (b, _t, hh), (rows, r0, blocks) in split_units.items():
        for x in range(rows):
            token, hig = divmod(r0 + x, g)
            expect[(int(qo_start[b] + token), hh * g + hig)] = [q + x for q in blocks]
    got = {}
    for m in range(plan.n_merge):
        dst = (int(tok[m]), int(qh[m]))
        assert dst not in got, f"two merge entries write token {dst[0]} head {dst[1]}"
        got[dst] = src[mi[m] : mi[m + 1]].tolist()
    assert got == expect
    assert plan.n_merge_src == sum(r for _, r in partial_blocks)

    # --- balance: Graham's bound for list scheduling --------------------------------------------------------
    costs = item_costs(plan, rows_of_item, cost)
    cta = np.repeat(np.arange(p), np.diff(wi))
    n_static = n - plan.n_pool
    loads = np.bincount(cta, weights=costs[:n_static], minlength=p)
    mean = costs.sum() / p
    if plan.n_pool:
        # --- shared tail: the smallest items, whole groups (all heads of a tile piece), largest first ---------------
        pool = costs[n_static:]
        assert plan.n_pool % h == 0 and n_static >= min(n, p), (plan.n_pool, h, n_static, p)
        assert np.all(np.diff(pool) <= 1e-9), "the pool is taken largest first"
        assert pool.max() <= costs[:n_static].min() + 1e-9, "the pool holds the smallest items"
        for c in pool:  # the CTAs take it as they finish: at the model's speed, the least-loaded takes the next
            loads[loads.argmin()] += c
    if n:
        assert loads.max() <= mean + costs.max() + 1e-6 * max(1.0, mean), (loads.max(), mean, costs.max())
    return {"loads": loads, "mean": mean, "max_item": costs.max() if n else 0.0, "split_units": len(split_units)}


# --- random batches ---------------------------------------------------------------------------------------------


@st.composite
def batches(draw, decode=None):
    """A random batch and planner configuration (lengths 0..40000, query lengths 1..600, ...)."""
    is_decode = draw(st.booleans()) if decode is None else decode
    b = draw(st.integers(1, 6 if not is_decode else 40))
    kv = draw(st.lists(st.one_of(st.integers(0, 40000), st.integers(0, 300)), min_size=b, max_size=b))
    qo = None if is_decode else draw(st.lists(st.integers(1, 600), min_size=b, max_size=b))
    cfg = dict(
        num_kv_heads=draw(st.integers(1, 8)),
        group_size=draw(st.integers(1, 8)),
        tile_rows=draw(st.sampled_from([16, 32, 64, 128])),
        num_ctas=draw(st.integers(1, 264)),
        kv_granule=draw(st.sampled_from([1, 16, 64, 128])),
        causal=draw(st.booleans()),
        window_left=draw(st.one_of(st.just(-1), st.integers(0, 5000))),
    )
    mode = draw(st.sampled_from(["auto", "auto", "fixed", "disable"]))
    if mode == "fixed":
        cfg["fixed_split_size"] = cfg["kv_granule"] * draw(st.integers(1, 64))
    elif mode == "disable":
        cfg["disable_split"] = True
    if qo is not None and draw(st.booleans()):
        kv = [max(k, q) for k, q in zip(kv, qo, strict=True)]  # prefill onto a cache holding the new tokens
    cfg["pool_share"] = draw(st.sampled_from([0.0, 0.0, POOL_SHARE, 0.3]))
    if mode == "fixed":  # (a prefill batch split every key: up to 6 x 300 tiles x 40000 pieces x 8 heads, ~24 GB)
        tiles = [1] * b if qo is None else [-(-q * cfg["group_size"] // cfg["tile_rows"]) for q in qo]
        pieces = sum(t * -(-max(k, 1) // cfg["fixed_split_size"]) for t, k in zip(tiles, kv, strict=True))
        assume(pieces * cfg["num_kv_heads"] <= 200_000)
    return qo, kv, cfg


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(batches())
def test_random_plans_are_valid(batch):
    qo, kv, cfg = batch
    plan = plan_work(qo, np.asarray(kv), **cfg)
    stats = check_plan(plan, qo, kv, **cfg)
    event(f"mode={plan.assign_mode}")
    event(f"split={'yes' if stats['split_units'] else 'no'}")
    event(f"pool={'yes' if plan.n_pool else 'no'}")


@pytest.mark.parametrize("share", [pytest.param(POOL_SHARE, id="default"), pytest.param(0.25, id="quarter")])
def test_pool_takes_the_smallest_share_and_round_trips(share, rng):
    """A prefill batch of P3's shape: the sorted deal leaves the smallest whole groups holding at most ``share`` of
    the cost to the shared tail, and the packed buffer tells the kernel where the tail starts and ends."""
    from cuinfer.planner import PlanLayout, pack, unpack

    qo = rng.integers(512, 2049, 16)
    cfg = dict(num_kv_heads=8, group_size=4, tile_rows=128, num_ctas=264, kv_granule=64, causal=True)
    plan = plan_work(qo, qo, pool_share=share, **cfg)
    check_plan(plan, qo, qo, pool_share=share, **cfg)
    n, h, p = plan.n_items, 8, 264
    assert plan.assign_mode == "snake+pool" and 0 < plan.n_pool < n and plan.work_indptr[-1] == n - plan.n_pool
    kv = (plan.item_kv_end - plan.item_kv_start).astype(np.float64)
    rows = np.minimum(128, qo[plan.item_req] * 4 - plan.item_qo_tile * 128)
    cost = DEFAULT_COST.beta * kv + DEFAULT_COST.alpha * rows + DEFAULT_COST.gamma
    pooled = cost[n - plan.n_pool :].sum()
    assert pooled <= share * cost.sum() + 1e-6, (pooled, cost.sum())
    assert pooled + cost[: n - plan.n_pool].min() * h > share * cost.sum(), "one more group would not fit"
    for max_ctas in (p, p + 5):  # a graph-mode layout may hold more CTAs than the plan
        lay = PlanLayout.for_capacity(n, max_ctas, 0, 0)
        buf = pack(plan, lay, lay.empty())
        wi = buf[lay.offsets["work_indptr"] : lay.offsets["work_indptr"] + max_ctas + 2]
        assert wi[p] == n - plan.n_pool and np.all(wi[p + 1 :] == n), "the pool ends at n; CTAs past P: no items"
        back = unpack(buf, lay)
        assert back.n_pool == plan.n_pool
        np.testing.assert_array_equal(back.work_indptr, plan.work_indptr)
        np.testing.assert_array_equal(back.item_kv_end, plan.item_kv_end)


def test_no_pool_unless_asked_or_sorted():
    """Plans without ``pool_share`` (the decode wrapper's: its kernel takes no tail) and linear cuts keep every item
    on a CTA's list."""
    cfg = dict(num_kv_heads=8, group_size=4, tile_rows=128, num_ctas=264, kv_granule=64, causal=True)
    lens = np.arange(512, 2048, 96)
    assert plan_work(lens, lens, **cfg).n_pool == 0
    assert plan_work(None, lens, **cfg).n_pool == 0
    tiny = np.full(64, 32)  # equal one-tile items (32 tokens x 4 heads = 128 rows, not causal): the linear cut
    plan = plan_work(tiny, tiny, pool_share=0.3, **{**cfg, "causal": False})
    assert plan.assign_mode == "linear" and plan.n_pool == 0


def test_always_sort_deals_largest_first_with_a_pool():
    """``always_sort`` (the Hopper prefill kernel's plans): the items the linear cut would take in natural order are
    dealt largest first, the smallest ~share of the cost left to the pool, every item exactly once."""
    cfg = dict(num_kv_heads=32, group_size=1, tile_rows=128, num_ctas=132, kv_granule=128, causal=True)
    lens = np.full(4, 4096)  # P2: 4096 small items, the linear cut's case
    lin = plan_work(lens, lens, pool_share=0.04, **cfg)
    assert lin.assign_mode == "linear" and lin.n_pool == 0
    plan = plan_work(lens, lens, pool_share=0.04, always_sort=True, **cfg)
    assert plan.assign_mode.startswith("snake") and plan.n_pool > 0
    keys = sorted(zip(plan.item_req.tolist(), plan.item_qo_tile.tolist(), plan.item_kv_head.tolist(), strict=True))
    assert len(set(keys)) == len(keys) == lin.n_items
    pool = plan.item_kv_end[-plan.n_pool :] - plan.item_kv_start[-plan.n_pool :]
    assert (np.diff(pool) <= 0).all(), "the pool runs largest first"
    assert pool.max() <= (plan.item_kv_end - plan.item_kv_start)[: -plan.n_pool].min(), "the pool holds the smallest"


@_SETTINGS
@given(batches(decode=True))
def test_random_decode_plans_are_valid(batch):
    qo, kv, cfg = batch
    plan = plan_work(None, np.asarray(kv, dtype=np.int32), **cfg)
    stats = check_plan(plan, None, kv, **cfg)
    event(f"mode={plan.assign_mode}")
    event(f"split={'yes' if stats['split_units'] else 'no'}")


@_SETTINGS
@given(batches(decode=True))
def test_random_fp8_decode_plans_are_valid(batch):
    """The fp8 cost model's lane cuts (a piece's own fixed cost, its thresholds) keep every plan invariant."""
    from cuinfer.planner import FP8_COST

    qo, kv, cfg = batch
    plan = plan_work(None, np.asarray(kv, dtype=np.int32), cost=FP8_COST, **cfg)
    stats = check_plan(plan, None, kv, cost=FP8_COST, **cfg)
    event(f"mode={plan.assign_mode}")
    event(f"split={'yes' if stats['split_units'] else 'no'}")


@_SETTINGS
@given(batches(decode=False), st.integers(1, 4))
def test_query_length_one_is_decode(batch, _):
    """Prefill lengths that are all 1 plan exactly as decode (qo_lens=None)."""
    _, kv, cfg = batch
    ones = [1] * len(kv)
    a = plan_work(ones, kv, **cfg)
    b = plan_work(None, kv, **cfg)
    for name in ("work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end",
                 "item_partial", "merge_indptr", "merge_src", "merge_dst_token", "merge_dst_head"):  # fmt: skip
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize(
    "qo, kv, causal, window, want",
    [
        pytest.param([20], [3], True, -1, [(0, 0), (0, 3)], id="causal-tile-before-the-keys-is-empty"),
        pytest.param([4], [10], True, -1, [(0, 10)], id="causal-one-tile-ends-at-last-row"),
        pytest.param([1], [100], False, 7, [(92, 100)], id="decode-window-sees-w-plus-1"),
        pytest.param([3], [10], True, 2, [(5, 10)], id="window-starts-at-first-token"),
        pytest.param([2], [0], False, -1, [(0, 0)], id="no-kv-is-empty"),
    ],
)
def test_tile_ranges_examples(qo, kv, causal, window, want):
    """Hand-worked ranges (one tile of 16 rows, g=1): bottom-right causal, window from the tile's first token."""
    plan = plan_work(qo, kv, num_kv_heads=1, group_size=1, tile_rows=16, num_ctas=4, kv_granule=16,
                     causal=causal, window_left=window)  # fmt: skip
    got = list(zip(plan.item_kv_start.tolist(), plan.item_kv_end.tolist(), strict=True))
    assert got == want
    assert plan.item_partial.tolist() == [-1] * len(want)


def test_tiles_split_tokens_across_heads():
    """g=3 and 16-row tiles: a token's heads straddle two tiles; causal end uses the tile's last token."""
    qo, kv = [7], [20]
    plan = plan_work(qo, kv, num_kv_heads=2, group_size=3, tile_rows=16, num_ctas=8, kv_granule=1, causal=True,
                     disable_split=True)  # fmt: skip
    check_plan(plan, qo, kv, num_kv_heads=2, group_size=3, tile_rows=16, num_ctas=8, kv_granule=1, causal=True,
               disable_split=True)  # fmt: skip
    by_tile = dict(zip(plan.item_qo_tile.tolist(), plan.item_kv_end.tolist(), strict=True))
    # tile 0 = packed rows 0..15 = tokens 0..5 (token 5 only heads 0): ends at 20 - 7 + 5 + 1 = 19
    # tile 1 = rows 16..20 = tokens 5..6: ends at 20
    assert by_tile == {0: 19, 1: 20}


def test_bad_arguments_raise_with_the_fix():
    msg = r"fixed_split_size=100 must be a positive multiple of kv_granule=16.*96 or 112"
    with pytest.raises(ValueError, match=msg):
        plan_work(None, [1000], num_kv_heads=1, group_size=1, tile_rows=16, num_ctas=4, kv_granule=16,
                  fixed_split_size=100)  # fmt: skip
    with pytest.raises(ValueError, match="contradict"):
        plan_work(None, [1000], num_kv_heads=1, group_size=1, tile_rows=16, num_ctas=4, kv_granule=16,
                  fixed_split_size=64, disable_split=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"num_ctas=0 must be >= 1"):
        plan_work(None, [1000], num_kv_heads=1, group_size=1, tile_rows=16, num_ctas=0, kv_granule=16)
    with pytest.raises(ValueError, match=r"kv_lens must be >= 0, got kv_lens\[1\] = -3"):
        plan_work(None, [5, -3], num_kv_heads=1, group_size=1, tile_rows=16, num_ctas=4, kv_granule=16)
    with pytest.raises(ValueError, match="qo_lens has 1 requests but kv_lens has 2"):
        plan_work([3], [5, 6], num_kv_heads=1, group_size=1, tile_rows=16, num_ctas=4, kv_granule=16)
    for share in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=rf"pool_share={share} must be in \[0, 1\).*0 for none"):
            plan_work([3], [5], num_kv_heads=1, group_size=1, tile_rows=16, num_ctas=4, kv_granule=16, pool_share=share)


def test_empty_batch():
    plan = plan_work(None, np.zeros(0, dtype=np.int32), num_kv_heads=8, group_size=4, tile_rows=16, num_ctas=132,
                     kv_granule=16)  # fmt: skip
    assert plan.n_items == 0 and plan.n_merge == 0 and plan.work_indptr.tolist() == [0] * 133


# --- the prefill fast path: whole-token tiles and bounds in place of exact cost statistics -------------------------

_ITEM_ARRAYS = ("work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end",
                "item_partial", "merge_indptr", "merge_src", "merge_dst_token", "merge_dst_head")  # fmt: skip


def _assert_same_plan(a: WorkPlan, b: WorkPlan) -> None:
    assert (a.assign_mode, a.chunk_size, a.num_partial_rows) == (b.assign_mode, b.chunk_size, b.num_partial_rows)
    for name in _ITEM_ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@st.composite
def prefill_batches(draw):
    """Prefill batches of many requests (where the linear cut and the bounds apply), some with no query tokens or
    more queries than keys."""
    b = draw(st.integers(1, 70))
    qo = draw(st.lists(st.one_of(st.integers(0, 2000), st.integers(0, 40)), min_size=b, max_size=b))
    kv = draw(st.lists(st.one_of(st.integers(0, 5000), st.integers(0, 64)), min_size=b, max_size=b))
    if draw(st.booleans()):
        kv = [k + q for k, q in zip(kv, qo, strict=True)]  # prefill onto a cache holding the new tokens
    g = draw(st.sampled_from([1, 2, 4, 7, 8]))
    br = draw(st.sampled_from([16, 64, 128]))
    cfg = dict(
        num_kv_heads=draw(st.sampled_from([1, 2, 8])), group_size=g, tile_rows=br,
        num_ctas=draw(st.sampled_from([7, 132, 264])), kv_granule=draw(st.sampled_from([1, 16, 64])),
        causal=draw(st.booleans()),
    )  # fmt: skip
    return np.array(qo, dtype=np.int32), np.array(kv, dtype=np.int32), cfg


# Split-policy constants under which bounds that prove the linear cut no longer prove "no split" (by default they do:
# with every tile under 1/16 of a CTA's load, neither the balance test nor the capacity rule lets a tile be cut).
_EAGER_SPLIT = dict(
    BALANCED_EFFICIENCY=0.999, MIN_GAIN=-1.0, CANDIDATE_FRACTIONS=(0.01,), MAX_EXTRA_ITEMS_PER_CTA=10**6
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefill_batches(), st.booleans())
def test_bounds_plan_as_exact_statistics(batch, eager_split):
    """plan_work decides the split and the assignment on bounds of the tile costs (from the KV range) where they
    settle it, instead of the costs' exact maximum and minimum; the plan must be the one the exact values give
    (``_bounds`` disabled). ``eager_split`` makes the split policy cut what the bounds cannot rule out, so the exact
    values decide again."""
    qo, kv, cfg = batch
    from cuinfer.planner import split_kv, work

    saved = {name: getattr(split_kv, name) for name in _EAGER_SPLIT}
    bounds = work._bounds
    if eager_split:
        for name, value in _EAGER_SPLIT.items():
            setattr(split_kv, name, value)
    try:
        fast = plan_work(qo, kv, **cfg)
        ranges = dict(kv_range=(int(kv.min()), int(kv.max())), qo_range=(int(qo.min()), int(qo.max())))
        given_ranges = plan_work(qo, kv, **cfg, **ranges)
        work._bounds = lambda *args: None
        exact = plan_work(qo, kv, **cfg)
    finally:
        work._bounds = bounds
        for name, value in saved.items():
            setattr(split_kv, name, value)
    _assert_same_plan(fast, exact)
    _assert_same_plan(given_ranges, exact)
    if not eager_split:  # (eager plans hold many pieces: the Python checker would take seconds)
        check_plan(fast, qo.tolist(), kv.tolist(), **cfg)
    event(f"mode={fast.assign_mode}")
    event(f"split={'yes' if fast.n_merge else 'no'}")


@pytest.mark.parametrize(
    "qo, kv, g, br, causal",
    [
        pytest.param([113, 0, 1, 1023, 33], [4097, 5, 0, 1023, 7], 4, 128, True, id="gqa4-causal-empty-and-clipped"),
        pytest.param([113, 0, 1, 1023, 33], [4097, 5, 0, 1023, 7], 4, 128, False, id="gqa4-not-causal"),
        pytest.param([17, 31, 2], [40, 31, 200], 1, 16, True, id="mha-16-rows"),
        pytest.param([0, 0, 9], [3, 0, 9], 8, 64, True, id="leading-empty-requests"),
        pytest.param([300, 7], [100, 2], 2, 64, True, id="more-queries-than-keys"),
    ],
)
def test_whole_token_tiles_match_reference(qo, kv, g, br, causal):
    """Tiles of whole tokens (``Br % g == 0``), the fast path of ``query_tiles``: requests, tile indices, rows (the
    short last tile of each request) and KV ranges as the plain-Python reference builds them, int32 in and out."""
    from cuinfer.planner import query_tiles

    tiles = query_tiles(np.array(qo, dtype=np.int32), np.array(kv, dtype=np.int32), group_size=g, tile_rows=br,
                        causal=causal)  # fmt: skip
    ref = reference_tiles(qo, kv, g, br, causal, -1)
    assert tiles.count == len(ref)
    assert tiles.req.tolist() == [r[0] for r in ref]
    assert tiles.index.tolist() == [r[1] for r in ref]
    assert np.broadcast_to(tiles.row_array(), (tiles.count,)).tolist() == [r[2] for r in ref]
    assert tiles.kv_start == 0 and tiles.kv_end.tolist() == [r[5] for r in ref]
    assert tiles.req.dtype == tiles.kv_end.dtype == np.int32  # packs without a cast
    last, rows = tiles.last_rows
    assert rows.tolist() == [ref[i][2] for i in last.tolist()]
