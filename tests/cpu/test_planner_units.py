"""``planner.units.item_units``: the per-item merge unit and piece count the decode kernels merge with, checked
against the partial-row layout of planner/merge.py rebuilt from each item's (request, tile, KV head, KV range)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from cuinfer.planner import plan_work
from cuinfer.planner.units import item_units
from hypothesis import given, settings
from hypothesis import strategies as st


def _check(plan, rows_of) -> int:
    units = item_units(plan)
    partial = plan.item_partial
    if plan.n_merge == 0:
        assert units is None
        return 0
    merge, pieces = units
    assert merge.dtype == np.int32 and pieces.dtype == np.int32
    assert merge.shape == pieces.shape == partial.shape
    np.testing.assert_array_equal(merge < 0, partial < 0)
    assert (pieces[partial < 0] == 0).all()
    # The pieces of one (request, tile, KV head), in KV order, are exactly the items that name one unit U; piece j
    # holds its rows at U + j * rows, and the unit's piece count is theirs.
    by_unit = defaultdict(list)
    req, tile, head = plan.item_req, plan.item_qo_tile, plan.item_kv_head
    start = plan.item_kv_start
    for i in np.flatnonzero(partial >= 0):
        by_unit[int(merge[i])].append((int(start[i]), int(partial[i]), int(pieces[i]), (req[i], tile[i], head[i])))
    seen = set()
    for u, items in by_unit.items():
        items.sort()
        keys = {k for *_, k in items}
        assert len(keys) == 1, f"unit {u} mixes tiles {keys}"
        key = keys.pop()
        assert key not in seen
        seen.add(key)
        r = rows_of(key)
        assert [p for _, p, _, _ in items] == [u + j * r for j in range(len(items))]
        assert {k for _, _, k, _ in items} == {len(items)} and len(items) >= 2
    return len(by_unit)


@settings(max_examples=60, deadline=None)
@given(
    kv=st.lists(st.integers(0, 40000), min_size=1, max_size=200),
    heads=st.sampled_from([(8, 4), (4, 1), (2, 7), (1, 16)]),
    ctas=st.sampled_from([16, 132, 264]),
)
def test_decode_plans(kv, heads, ctas):
    h, g = heads
    plan = plan_work(None, np.array(kv), num_kv_heads=h, group_size=g, tile_rows=16, num_ctas=ctas, kv_granule=64)
    _check(plan, lambda key: g)


@pytest.mark.parametrize(
    "kv",
    [pytest.param([32768], id="D4"), pytest.param([1024] * 16, id="D1"), pytest.param([32768] + [1024] * 127, id="D8")],
)
def test_standard_shapes_are_split_and_covered(kv):
    plan = plan_work(None, np.array(kv), num_kv_heads=8, group_size=4, tile_rows=16, num_ctas=264, kv_granule=64)
    assert _check(plan, lambda key: 4) > 0


def test_prefill_tiles_with_rows_per_tile():
    qo, kv = np.array([37, 577, 1]), np.array([4097, 4097, 9000])
    plan = plan_work(qo, kv, num_kv_heads=2, group_size=4, tile_rows=64, num_ctas=132, kv_granule=64,
                     fixed_split_size=1024)  # fmt: skip
    rows = {}
    for b, lq in enumerate(qo):
        for t in range(-(-lq * 4 // 64)):
            rows[b, t] = min(64, lq * 4 - 64 * t)
    assert _check(plan, lambda key: rows[int(key[0]), int(key[1])]) > 0


def test_unsplit_plan_has_no_units():
    plan = plan_work(None, np.full(128, 2048), num_kv_heads=8, group_size=4, tile_rows=16, num_ctas=264, kv_granule=64)
    assert plan.n_merge == 0 and item_units(plan) is None
