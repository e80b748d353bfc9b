"""The fast paths of the prefill plan() (a new batch every call) against the plain-Python reference and the slow paths
they stand in for: the query tiles of new query lengths (per-length table, int32 arithmetic, the int64 fallback, the
cached structure of repeated lengths), the tile costs and their running sum, the split policy skipped on cost bounds,
the index-array validation of ``read_index_arrays_fast`` against the validators' path, the compact pack's prefill path
against the words of the general form, and the layouts built for new item counts against the dataclass construction.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuinfer.planner import CostModel, PlanCapacity, PlanLayout, layout, plan_work, split_kv, tiles, work, workplan
from cuinfer.planner.assign import POOL_SHARE
from cuinfer.planner.compact import COMPACT_FIELDS, compact_groups, pack_compact
from cuinfer.planner.cost import DEFAULT_COST
from test_planner import check_plan, reference_tiles

from cuinfer.prefill import BatchPrefill
from cuinfer.prefill.index import read_checked_index_arrays, read_index_arrays_fast


def _lengths(rng, b: int, qo_hi: int, *, empty: bool, more_queries: bool):
    """Random int32 (qo, kv) lengths: prefill onto a cache (kv >= qo), some requests without queries, some with more
    queries than keys (causal tiles that see nothing)."""
    qo = rng.integers(1, qo_hi + 1, b)
    kv = qo + rng.integers(0, 3 * qo_hi + 1, b)
    if empty:
        qo[rng.random(b) < 0.2] = 0
    if more_queries:
        short = rng.random(b) < 0.3
        kv[short] = rng.integers(0, qo[short] + 1)
    return qo.astype(np.int32), kv.astype(np.int32)


def _assert_tiles_are_reference(t, qo, kv, g: int, br: int, causal: bool) -> None:
    ref = reference_tiles(qo.tolist(), kv.tolist(), g, br, causal, -1)
    assert t.count == len(ref)
    assert t.req.tolist() == [r[0] for r in ref]
    assert t.index.tolist() == [r[1] for r in ref]
    assert np.broadcast_to(t.row_array(), (t.count,)).tolist() == [r[2] for r in ref]
    assert t.kv_start == 0 and t.kv_end.tolist() == [r[5] for r in ref]
    assert t.req.dtype == t.index.dtype == t.kv_end.dtype == np.int32  # packs without a cast
    if t.last is not None:
        assert t.last.dtype == np.intp  # (other index arrays cost a conversion on every use)
        assert t.short.dtype == np.int32


SHAPES = [
    pytest.param(4, 128, True, False, 2048, id="gqa4-br128-causal"),
    pytest.param(4, 128, False, False, 2048, id="gqa4-br128"),
    pytest.param(1, 16, True, True, 113, id="mha-br16-causal-empty"),
    pytest.param(8, 64, True, True, 1023, id="gqa8-br64-causal-empty"),
    pytest.param(2, 64, True, False, 40000, id="gqa2-long-past-the-table"),
]


@pytest.mark.parametrize("g, br, causal, empty, qo_hi", SHAPES)
def test_new_query_lengths_give_the_reference_tiles(g, br, causal, empty, qo_hi, rng):
    """Every call with new query lengths builds the tiles from scratch (the per-length table below
    ``_BY_LENGTH_MAX``, int32 arithmetic above it); the second call with the same lengths caches their structure
    and the third reads it: all three are the reference tiles."""
    b = int(rng.integers(1, 97))
    qo, kv = _lengths(rng, b, qo_hi, empty=empty, more_queries=causal)
    lo, hi = int(qo.min()), int(qo.max())
    for _ in range(3):  # new, cached, read from the cache
        t = tiles.whole_token_tiles(qo, kv, g, br, causal, lo, hi)
        _assert_tiles_are_reference(t, qo, kv, g, br, causal)
        kv = kv + rng.integers(0, 50, b).astype(np.int32)  # the same query lengths over a growing cache


@pytest.mark.parametrize("causal", [pytest.param(True, id="causal"), pytest.param(False, id="not-causal")])
def test_int64_fallback_is_the_int32_path(causal, rng):
    """A query maximum whose tile counts might pass int32 takes the int64 arithmetic (``wide``) and writes int32 rows;
    told a huge maximum, small batches take that path and must give the same tiles as the table."""
    qo, kv = _lengths(rng, 37, 517, empty=True, more_queries=causal)
    lo = int(qo.min())
    table = tiles._new_structure(qo, kv, 4, 128, causal, lo, int(qo.max()), None, None)
    wide = tiles._new_structure(qo, kv, 4, 128, causal, lo, 2**30, None, None)
    for name in ("req", "index", "kv_end", "last", "short"):
        a, b = getattr(table, name), getattr(wide, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    _assert_tiles_are_reference(wide, qo, kv, 4, 128, causal)


@pytest.mark.parametrize(
    "cost",
    [
        pytest.param(DEFAULT_COST, id="default-int32"),
        pytest.param(CostModel(alpha=2.0, beta=3.0, gamma=17.0), id="integral-alpha2-beta3"),
        pytest.param(CostModel(alpha=0.5, beta=1.25, gamma=64.5), id="float"),
    ],
)
def test_tile_costs_and_running_sum(cost, rng):
    """``beta * kv + alpha * rows + gamma`` of each tile (the short last tile of each request included) and their
    running sum, in float64 from the reference tiles."""
    qo, kv = _lengths(rng, 53, 1023, empty=True, more_queries=True)
    t = tiles.whole_token_tiles(qo, kv, 4, 128, True, int(qo.min()), int(qo.max()))
    costs, prefix = work._tile_costs(t, t.kv_end, cost, int(kv.max()))
    ref = reference_tiles(qo.tolist(), kv.tolist(), 4, 128, True, -1)
    want = np.array([cost.beta * (r[5] - r[4]) + cost.alpha * r[2] + cost.gamma for r in ref])
    np.testing.assert_allclose(costs.astype(np.float64), want, rtol=1e-12)
    if cost.int_terms is not None:
        assert costs.dtype.kind == "i"
    np.testing.assert_allclose(prefix.astype(np.float64)[-len(want) :], np.cumsum(want), rtol=1e-12)
    assert float(prefix[-1]) == pytest.approx(want.sum())


def test_cost_model_int_terms():
    assert DEFAULT_COST.int_terms == (1, 1, 64)
    assert CostModel(alpha=2.0, beta=3.0, gamma=5.0).int_terms == (2, 3, 5)
    assert CostModel(alpha=1.5).int_terms is None


@pytest.mark.parametrize(
    "b, qo_hi, num_ctas",
    [
        pytest.param(64, 2048, 264, id="P64-like"),
        pytest.param(113, 511, 132, id="113-requests"),
        pytest.param(17, 3001, 66, id="17-long-on-66"),
    ],
)
def test_bounds_settle_no_split(b, qo_hi, num_ctas, rng):
    """plan_checked skips the split policy when ``_bounds`` gives bounds and ``_balanced_under_bounds`` holds: the
    policy run on those bounds (what it would be given) must then find the batch balanced."""
    assert work._balanced_under_bounds()
    for _ in range(5):  # (no bounds when the first and last tile cost the same: rare, draw again)
        qo, kv = _lengths(rng, b, qo_hi, empty=False, more_queries=False)
        t = tiles.whole_token_tiles(qo, kv, 4, 128, True, int(qo.min()), int(qo.max()))
        costs, prefix = work._tile_costs(t, t.kv_end, DEFAULT_COST, int(kv.max()))
        bounds = work._bounds(costs, float(prefix[-1]), int(kv.max()), 128, 8, num_ctas, DEFAULT_COST)
        if bounds is not None:
            break
    assert bounds is not None, "these shapes are meant to give bounds"
    assert bounds[1] >= float(costs.max()) and bounds[2] >= float(costs.min())
    assert split_kv.choose_split(128, t.kv_end, bounds, 8, num_ctas, 64, DEFAULT_COST, 256) is None


def test_split_policy_runs_when_its_constants_change(monkeypatch):
    """The skip reads the policy's constants at call time: a balance demand the bounds cannot prove turns it off."""
    assert work._balanced_under_bounds()
    monkeypatch.setattr(split_kv, "BALANCED_EFFICIENCY", 0.999)
    assert not work._balanced_under_bounds()


def _page_table(rng, kv, ps: int, zero_pages: bool):
    pages = -(-kv // ps)
    if zero_pages:
        pages[rng.random(len(kv)) < 0.15] = 0
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.where(pages > 0, kv - (np.maximum(pages, 1) - 1) * ps, rng.integers(1, ps + 1, len(kv)))
    indices = rng.permutation(int(indptr[-1]) + int(rng.integers(0, 9))).astype(np.int32)
    return indptr, indices, last.astype(np.int32)


@pytest.mark.parametrize(
    "paged, b, ps, zero_pages",
    [
        pytest.param(True, 64, 16, False, id="paged-64-page16"),
        pytest.param(True, 113, 5, True, id="paged-113-page5-empty-requests"),
        pytest.param(True, 1, 1, False, id="paged-1-page1"),
        pytest.param(False, 97, 1, False, id="ragged-97"),
    ],
)
def test_fast_index_arrays_are_the_validators(paged, b, ps, zero_pages, rng):
    """``read_index_arrays_fast`` (one reduction, ``item`` reads) gives what the validators' path gives."""
    qo = rng.integers(0, 900, b)
    kv = qo + rng.integers(1, 700, b)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    if paged:
        kvi, indices, last = _page_table(rng, kv, ps, zero_pages)
    else:
        kvi, indices, last = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32), None, None
    fast, slow = {}, {}
    assert read_index_arrays_fast(fast, paged, qo_indptr, kvi, indices, last, ps)
    read_checked_index_arrays(slow, paged, qo_indptr, kvi, indices, last, ps)
    assert fast.keys() == slow.keys()
    for name, a in fast.items():
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, slow[name], err_msg=name)
        else:
            assert a == slow[name], (name, a, slow[name])


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("negative-page", id="negative-page"),
        pytest.param("last-page-0", id="last-page-0"),
        pytest.param("decreasing-qo", id="decreasing-qo"),
        pytest.param("2d-indptr", id="2d-indptr"),
        pytest.param("negative-kv-end", id="negative-kv-end"),
        pytest.param("kv-len-over-int32", id="kv-len-over-int32"),
    ],
)
def test_fast_index_arrays_hand_bad_input_to_the_validators(bad, rng):
    """Anything the fast path cannot vouch for goes to the validators (None), which then name the problem."""
    kv = rng.integers(1, 300, 9)
    qo = rng.integers(1, 100, 9)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    kvi, indices, last = _page_table(rng, kv, 16, False)
    if bad == "negative-page":
        indices[int(rng.integers(0, int(kvi[-1])))] = -3
    elif bad == "last-page-0":
        last[4] = 0
    elif bad == "decreasing-qo":
        qo_indptr[5] = qo_indptr[4] - 1
    elif bad == "negative-kv-end":  # (no page count to slice kv_indices with)
        kvi[-1] = -1
    elif bad == "kv-len-over-int32":  # (pages x page_size past int32: the fast path's int32 lengths would wrap)
        ps = 2**20
        kvi[1:] = np.arange(1, 10, dtype=np.int32) * 4096
        indices, last = np.zeros(int(kvi[-1]), np.int32), np.full(9, ps, np.int32)
    else:
        qo_indptr = qo_indptr.reshape(1, -1)
    ps = 2**20 if bad == "kv-len-over-int32" else 16
    out = {}
    assert not read_index_arrays_fast(out, True, qo_indptr, kvi, indices, last, ps)
    assert out == {}
    with pytest.raises(ValueError):
        read_checked_index_arrays(out, True, qo_indptr, kvi, indices, last, ps)


def test_new_batches_plan_as_the_planner_and_as_repeated_batches(rng):
    """A serving loop of new batches through BatchPrefill.plan (every structure new), then the same batch planned
    again (its structure cached): every work plan is the planner's from the bare lengths and passes the checker."""
    kw = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16, causal=True, q_dtype="bfloat16")
    w = BatchPrefill(paged=True)
    batches = []
    for _ in range(4):
        qo = rng.integers(512, 2049, 64)
        kvi, indices, last = _page_table(rng, qo, 16, False)
        batches.append((qo, np.concatenate([[0], np.cumsum(qo)]).astype(np.int32), kvi, indices, last))
    for qo, qo_indptr, kvi, indices, last in batches + [batches[-1]] * 2:
        w.plan(qo_indptr, kvi, indices, last, **kw)
        got, cfg = w._plan.work, w._plan.config
        want = plan_work(qo, qo, num_kv_heads=8, group_size=4, tile_rows=cfg.tile_q, num_ctas=got.num_ctas,
                         kv_granule=cfg.tile_kv, causal=True, pool_share=POOL_SHARE)  # fmt: skip
        assert (got.assign_mode, got.chunk_size, got.n_pool) == (want.assign_mode, want.chunk_size, want.n_pool)
        for name in ("work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end",
                     "item_partial"):  # fmt: skip
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    check_plan(got, qo, qo, num_kv_heads=8, group_size=4, tile_rows=cfg.tile_q, num_ctas=got.num_ctas,
               kv_granule=cfg.tile_kv, causal=True)  # fmt: skip


def _words_of_compact_pack(plan, lay, generation: int, sentinel: int) -> np.ndarray:
    """The words ``pack_compact`` writes, from the plan's item arrays and the layout alone (the general form: the
    header from a tuple, ``work_indptr`` then ``n`` up to ``max_ctas + 2``, the first ``G`` items of each compact
    field), every other word left at ``sentinel``."""
    n, g, p = plan.n_items, plan.n_groups, plan.num_ctas
    off, cap = lay.offsets, lay.capacity
    out = np.full(lay.total_words, sentinel, dtype=np.int32)
    out[:16] = lay.header
    out[:7] = (n, 0, 0, p, 0, plan.chunk_size, generation)
    o = off["work_indptr"]
    out[o : o + p + 1] = plan.work_indptr
    out[o + p + 1 : o + cap.max_ctas + 2] = n
    for name in COMPACT_FIELDS:
        out[off[name] : off[name] + g] = getattr(plan, name)[:g]  # items 0..G-1: head 0, groups 0..G-1
    out[off["merge_indptr"]] = 0
    return out


@pytest.mark.parametrize(
    "b, lo, hi, tight",
    [
        pytest.param(64, 512, 2048, True, id="P64-tight"),
        pytest.param(64, 512, 2048, False, id="P64-graph-capacity"),
        pytest.param(97, 300, 1200, True, id="97-shorter-tight"),
        pytest.param(113, 100, 1500, False, id="113-graph-capacity"),
    ],
)
def test_compact_pack_fast_path_writes_the_general_words(b, lo, hi, tight, rng):
    """``pack_compact`` of a prefill plan (the shape ``natural_pack_fields`` gives: scalar header writes, one word
    of ``work_indptr`` tail in a tight layout, the starts' zeros) writes exactly the words of the general form into
    a buffer of stale words, and no other word."""
    qo = rng.integers(lo, hi + 1, b).astype(np.int32)
    kv = (qo + rng.integers(0, 300, b)).astype(np.int32)
    plan = plan_work(qo, kv, num_kv_heads=8, group_size=4, tile_rows=128, num_ctas=264, kv_granule=64,
                     causal=True, pool_share=POOL_SHARE)  # fmt: skip
    g = compact_groups(plan)
    assert g == plan.n_groups and plan.pack_fields()[0] is workplan.PREFILL_SHAPE
    if tight:
        lay = PlanLayout.for_plan(plan)
    else:  # a CUDA-graph style layout: room for more CTAs and items than the plan has
        lay = PlanLayout.for_capacity(plan.n_items + int(rng.integers(1, 999)), 264 + int(rng.integers(1, 40)), 7, 9)
    sentinel = int(rng.integers(-(2**31), 2**31))
    out = np.full(lay.total_words, sentinel, dtype=np.int32)
    generation = int(rng.integers(0, 2**31))
    assert pack_compact(plan, lay, out, generation=generation, groups=g) == g
    np.testing.assert_array_equal(out, _words_of_compact_pack(plan, lay, generation, sentinel))


def test_layout_build_is_the_dataclass_layout(rng):
    """``PlanLayout._build`` (no dataclass __init__) gives the offsets, size, header and capacity that the field by
    field construction gives, for random capacities; the capacity compares and hashes like one built normally."""
    for _ in range(300):
        caps = [int(v) for v in rng.integers(0, 70000, 4)]
        caps[1] = max(caps[1], 1)
        lay = layout.PlanLayout._build(*caps)
        cap = PlanCapacity(*caps)
        offsets, pos = {}, layout.HEADER_WORDS
        for name, by, extra in layout._ARRAYS:
            offsets[name] = pos
            pos = -(-(pos + getattr(cap, by) + extra) // 4) * 4
        assert lay.offsets == offsets and lay.total_words == pos
        assert lay.capacity == cap and hash(lay.capacity) == hash(cap) and repr(lay.capacity) == repr(cap)
        header = np.array([0] * 7 + [layout.PLAN_MAGIC] + caps + [0] * 4, dtype=np.int32)
        np.testing.assert_array_equal(lay.header, header)
        assert lay.header.dtype == np.int32 and not lay.header.flags.writeable
        assert lay == layout.PlanLayout(cap, offsets, pos, header)


@pytest.mark.parametrize(
    "caps, rule",
    [
        pytest.param((-1, 4, 0, 0), "max_items must be >= 0, got -1", id="negative-items"),
        pytest.param((9, 0, 0, 0), "max_ctas must be >= 1, got 0", id="no-ctas"),
        pytest.param((9, 4, 0, -5), "max_merge_src must be >= 0, got -5", id="negative-merge-src"),
    ],
)
def test_layout_build_names_the_bad_capacity(caps, rule):
    with pytest.raises(ValueError, match=rule):
        PlanLayout.for_capacity(*caps)
