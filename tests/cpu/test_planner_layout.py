"""Packing plans into the int32 plan buffer: layout offsets, pack/unpack round trip, capacities, workspace size."""

from __future__ import annotations

import numpy as np
import pytest
from cuinfer.planner import (
    HEADER_WORDS,
    PLAN_MAGIC,
    PlanLayout,
    capacity_bound,
    capacity_of,
    kv_lens_from_pages,
    pack,
    plan_work,
    qo_lens_from_indptr,
    unpack,
    workspace_bytes,
    workspace_offsets,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ARRAYS = ("work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial",
          "merge_indptr", "merge_src", "merge_dst_token", "merge_dst_head")  # fmt: skip


def _plan(rng, *, decode=True, batch=37, ctas=132, **kw):
    kv = rng.integers(1, 20000, batch)
    kv[0] = 70001  # a long request, so something is split
    qo = None if decode else rng.integers(1, 300, batch)
    cfg = dict(num_kv_heads=4, group_size=3, tile_rows=16 if decode else 64, num_ctas=ctas, kv_granule=16)
    cfg.update(kw)
    return plan_work(qo, kv, **cfg), qo, kv, cfg


def test_layout_offsets_are_aligned_and_disjoint():
    lay = PlanLayout.for_capacity(max_items=1001, max_ctas=133, max_merge=17, max_merge_src=55)
    spans = sorted((lay.offsets[a], lay.offsets[a] + lay.size_of(a)) for a in ARRAYS)
    assert spans[0][0] == HEADER_WORDS
    for (_, a1), (b0, _) in zip(spans, spans[1:], strict=False):
        assert a1 <= b0, "arrays overlap"
    assert all(lay.offsets[a] % 4 == 0 for a in ARRAYS), "every array starts on 16 bytes"
    assert lay.total_words >= spans[-1][1] and lay.nbytes == 4 * lay.total_words
    assert lay.size_of("work_indptr") == 135 and lay.size_of("merge_indptr") == 18


@pytest.mark.parametrize("decode", [pytest.param(True, id="decode"), pytest.param(False, id="prefill-causal")])
def test_pack_unpack_round_trip(rng, decode):
    extra = {} if decode else {"fixed_split_size": 4096}
    plan, *_ = _plan(rng, decode=decode, causal=not decode, **extra)
    assert plan.n_merge > 0, "the case must exercise the merge list"
    lay = PlanLayout.for_capacity(plan.n_items + 13, 140, plan.n_merge + 5, plan.n_merge_src + 7)
    buf = np.full(lay.total_words + 9, 0x7EADBEEF, dtype=np.int32)  # poisoned: unwritten words show
    pack(plan, lay, buf, generation=41)
    hdr = buf[:HEADER_WORDS].tolist()
    assert hdr[:8] == [plan.n_items, plan.n_merge, plan.num_partial_rows, plan.num_ctas, plan.n_merge_src,
                       plan.chunk_size, 41, PLAN_MAGIC]  # fmt: skip
    assert hdr[8:12] == [lay.capacity.max_items, 140, lay.capacity.max_merge, lay.capacity.max_merge_src]
    back = unpack(buf, lay)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(back, name), getattr(plan, name), err_msg=name)
    # CTAs past num_ctas (a graph launched with max_ctas) get empty lists
    o = lay.offsets["work_indptr"]
    assert np.all(buf[o + plan.num_ctas + 1 : o + 141] == plan.n_items)
    assert np.all(buf[lay.total_words :] == 0x7EADBEEF), "pack wrote past the layout"


def test_pack_into_tight_layout(rng):
    plan, *_ = _plan(rng)
    lay = PlanLayout.for_plan(plan)
    assert capacity_of(plan) == lay.capacity
    back = unpack(pack(plan, lay, lay.empty()), lay)
    np.testing.assert_array_equal(back.item_partial, plan.item_partial)


@pytest.mark.parametrize(
    "field, shrink, what",
    [
        pytest.param("max_items", 1, "work items", id="items"),
        pytest.param("max_ctas", 1, "CTAs", id="ctas"),
        pytest.param("max_merge", 1, "merge entries", id="merge"),
        pytest.param("max_merge_src", 1, "partial-state rows", id="merge-src"),
    ],
)
def test_over_capacity_raises_with_the_rule_and_fix(rng, field, shrink, what):
    plan, *_ = _plan(rng)
    cap = capacity_of(plan)
    sizes = dict(max_items=cap.max_items, max_ctas=cap.max_ctas, max_merge=cap.max_merge,
                 max_merge_src=cap.max_merge_src)  # fmt: skip
    need = sizes[field]
    sizes[field] -= shrink
    lay = PlanLayout.for_capacity(**sizes)
    msg = (
        f"the plan needs {need} {what} but the plan buffer's layout holds {need - shrink} ({field}={need - shrink}). "
        "A plan must fit the layout fixed when the wrapper was built (CUDA graphs keep its pointers). Fix: build the "
        "wrapper with a larger max_batch_size (or workspace), sized by planner.capacity_bound(...), or leave "
        "CUDA-graph mode off so the buffer can grow with each plan."
    )
    with pytest.raises(ValueError) as err:
        pack(plan, lay, lay.empty())
    assert str(err.value) == msg


def test_pack_rejects_a_wrong_buffer(rng):
    plan, *_ = _plan(rng)
    lay = PlanLayout.for_plan(plan)
    with pytest.raises(ValueError, match="1-D int32 buffer of at least"):
        pack(plan, lay, np.zeros(lay.total_words, dtype=np.int64))
    with pytest.raises(ValueError, match="1-D int32 buffer of at least"):
        pack(plan, lay, np.zeros(lay.total_words - 1, dtype=np.int32))


@st.composite
def bounded_batches(draw):
    max_b = draw(st.integers(1, 48))
    decode = draw(st.booleans())
    b = draw(st.integers(1, max_b))
    kv = draw(st.lists(st.integers(0, 40000), min_size=b, max_size=b))
    qo = None if decode else draw(st.lists(st.integers(1, 600), min_size=b, max_size=b))
    max_q = max_b if decode else draw(st.integers(sum(qo), sum(qo) + 500))
    cfg = dict(
        num_kv_heads=draw(st.integers(1, 8)),
        group_size=draw(st.integers(1, 8)),
        tile_rows=draw(st.sampled_from([16, 32, 64, 128])),
        num_ctas=draw(st.integers(1, 264)),
        kv_granule=draw(st.sampled_from([1, 16, 64])),
        causal=draw(st.booleans()),
        window_left=draw(st.one_of(st.just(-1), st.integers(0, 3000))),
    )
    mode = draw(st.sampled_from(["auto", "auto", "fixed", "disable"]))
    return max_b, max_q, qo, kv, cfg, mode, draw(st.integers(1, 40))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bounded_batches())
def test_capacity_bound_holds(batch):
    max_b, max_q, qo, kv, cfg, mode, fixed_mult = batch
    extra = {}
    bound_kw = {}
    if mode == "fixed":
        extra["fixed_split_size"] = bound_kw["fixed_split_size"] = cfg["kv_granule"] * fixed_mult
        bound_kw["max_kv_len"] = 40000
    elif mode == "disable":
        extra["disable_split"] = bound_kw["disable_split"] = True
    plan = plan_work(qo, kv, **cfg, **extra)
    bound = capacity_bound(max_b, max_q, cfg["num_kv_heads"], cfg["group_size"], cfg["tile_rows"], cfg["num_ctas"],
                           **bound_kw)  # fmt: skip
    assert bound.fits(capacity_of(plan)), (bound, capacity_of(plan))
    assert workspace_bytes(bound, 128) >= workspace_bytes(plan, 128)


def test_capacity_bound_needs_max_kv_len_for_fixed_splits():
    with pytest.raises(ValueError, match="fixed_split_size needs max_kv_len"):
        capacity_bound(8, 8, 8, 4, 16, 132, fixed_split_size=256)


@pytest.mark.parametrize(
    "rows, dv, lse_at, total",
    [
        pytest.param(0, 128, 0, 0, id="none"),
        pytest.param(1, 128, 512, 768, id="one-row"),
        pytest.param(1000, 128, 512000, 512000 + 4096, id="d128"),
        pytest.param(33, 64, 8448, 8448 + 256, id="d64-odd-rows"),
    ],
)
def test_workspace_layout(rows, dv, lse_at, total):
    assert workspace_offsets(rows, dv) == (lse_at, total)
    assert lse_at % 256 == 0 and total % 256 == 0


def test_kv_lengths_from_page_table():
    kv_indptr = np.array([0, 3, 3, 4, 9], dtype=np.int32)
    last = np.array([5, 16, 16, 1], dtype=np.int32)
    np.testing.assert_array_equal(kv_lens_from_pages(kv_indptr, last, 16), [37, 0, 16, 65])
    np.testing.assert_array_equal(qo_lens_from_indptr(np.array([0, 4, 4, 11])), [4, 0, 7])
    with pytest.raises(ValueError, match="non-decreasing"):
        qo_lens_from_indptr(np.array([0, 4, 3]))
    with pytest.raises(ValueError, match="len\\(kv_indptr\\) == len\\(kv_last_page_len\\) \\+ 1"):
        kv_lens_from_pages(kv_indptr, last[:2], 16)


@pytest.mark.parametrize("graph", [pytest.param(False, id="tight"), pytest.param(True, id="graph-layout")])
def test_memoised_pack_matches_a_full_pack(rng, graph):
    """A buffer packed with a memo (shape-only fields skipped when it holds them, cached views) ends every step with
    the words of one packed without: prefill plans whose shape changes (window, split, natural/explicit order)."""
    cap = capacity_bound(23, 23 * 700, 3, 5, 64, 61)
    fixed = PlanLayout.for_capacity(cap.max_items, cap.max_ctas, cap.max_merge, cap.max_merge_src)
    poison = (np.arange(fixed.total_words + 64, dtype=np.int64) * 7919 % 2**31).astype(np.int32)
    bufs = {}
    for step in range(24):
        batch = int(rng.integers(1, 24)) if step % 3 == 0 else 17
        qo = rng.integers(1, 700, batch)
        kv = qo + rng.integers(0, 900 if step % 4 else 30000, batch)
        # the same batch without and with a window (same items, the starts a fill or per item) and back
        for window in (-1, int(rng.integers(0, 300)), -1):
            kw = dict(causal=bool(step % 2), window_left=window)
            plan = plan_work(qo, kv, num_kv_heads=3, group_size=5, tile_rows=64, num_ctas=61, kv_granule=16, **kw)
            lay = fixed if graph else PlanLayout.for_plan(plan)
            if id(lay) not in bufs or bufs[id(lay)][0] is not lay:
                bufs[id(lay)] = (lay, poison.copy(), poison.copy(), {})
            _, memo_buf, plain_buf, memo = bufs[id(lay)]
            for _ in range(2):  # the second pack of the same plan skips the shape-only fields
                pack(plan, lay, memo_buf, generation=step, memo=memo)
                pack(plan, lay, plain_buf, generation=step)
                np.testing.assert_array_equal(memo_buf, plain_buf, err_msg=f"step {step} {plan.assign_mode} {kw}")
