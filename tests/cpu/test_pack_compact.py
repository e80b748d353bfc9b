"""The compact plan-buffer form of natural-order prefill plans (planner.compact.pack_compact): the kernel reads item
``i``'s facts at entry ``i % G`` and takes KV head ``i // G`` and partial -1 (prefill.cuh ``item_ref``). Checked here by
doing the kernel's lookup on the host against the full pack of the same plan, for every item."""

from __future__ import annotations

import numpy as np
import pytest
from cuinfer.planner import PlanLayout, pack, plan_work
from cuinfer.planner.compact import COMPACT_FIELDS, compact_groups, pack_compact

from cuinfer.prefill import BatchPrefill

ITEM_FIELDS = ("item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial")


def _prefill_plan(qo, kv, *, ctas=264, **kw):
    cfg = dict(num_kv_heads=8, group_size=4, tile_rows=128, num_ctas=ctas, kv_granule=16, causal=True)
    cfg.update(kw)
    return plan_work(np.asarray(qo), np.asarray(kv), **cfg)


def _kernel_view(words: np.ndarray, lay: PlanLayout, g: int, n: int) -> dict:
    """Item arrays as the kernel sees a compact buffer: entry i % G, head i // G, partial -1."""
    off = lay.offsets
    item = np.arange(n)
    entry, head = item % g, item // g
    view = {name: words[off[name] : off[name] + g][entry] for name in COMPACT_FIELDS}
    view["item_kv_head"] = head
    view["item_partial"] = np.full(n, -1)
    return view


# (qo lengths, kv lengths, whether the planner must keep natural order with nothing split, i.e. compact)
CASES = {
    "P64-like": (None, None, True),  # 64 x U[512, 2048], drawn below
    "80-appends": (None, None, True),  # 80 x qo U[100, 600) on kv U[600, 1200), drawn below
    "mixed-split": ([1, 17, 37, 127, 577, 5, 300], [54, 97, 512, 2048, 4097, 5, 300], False),
    "chunked-append": ([256] * 16, [1024 + 256 * i for i in range(16)], False),
    "one-long": ([8192], [8192], False),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("window", [-1, 700])
def test_compact_pack_reads_like_the_full_pack(name, window):
    qo, kv, natural = CASES[name]
    if name == "P64-like":
        rng = np.random.default_rng(3)
        qo = kv = rng.integers(512, 2049, 64)
    elif name == "80-appends":
        rng = np.random.default_rng(1)
        qo, kv = rng.integers(100, 600, 80), rng.integers(600, 1200, 80)
    plan = _prefill_plan(qo, kv, window_left=window)
    g = compact_groups(plan)
    if plan.item_group is not None or plan.num_partial_rows > 0:  # sorted by cost or split: the full form
        assert not natural, f"{name}: expected a natural plan, got {plan.assign_mode}"
        assert g == 0
        return
    assert g == plan.n_groups > 0, f"{name}: a natural plan with nothing split must pack compactly"
    lay = PlanLayout.for_plan(plan)
    full = pack(plan, lay, np.full(lay.total_words, -7, dtype=np.int32), generation=5)
    compact = np.full(lay.total_words, -7, dtype=np.int32)
    assert pack_compact(plan, lay, compact, generation=5) == g
    off = lay.offsets
    np.testing.assert_array_equal(compact[:16], full[:16], err_msg="header")
    o = off["work_indptr"]
    np.testing.assert_array_equal(compact[o : o + plan.num_ctas + 1], full[o : o + plan.num_ctas + 1])
    n = plan.n_items
    view = _kernel_view(compact, lay, g, n)
    for field in ITEM_FIELDS:
        np.testing.assert_array_equal(view[field], full[off[field] : off[field] + n], err_msg=f"{name}: {field}")
    assert compact[off["merge_indptr"]] == 0
    # the compact form writes G words per array, not G x H
    assert (compact[off["item_req"] + g : off["item_req"] + n] == -7).all()


def test_split_and_sorted_plans_are_not_compact():
    split = _prefill_plan([4096] * 2, [4096] * 2, fixed_split_size=512)
    assert split.num_partial_rows > 0 and compact_groups(split) == 0
    # few long items on many CTAs: the planner sorts them (snake / fill), not natural order
    sorted_plan = _prefill_plan([8192], [8192])
    if sorted_plan.item_group is not None:
        assert compact_groups(sorted_plan) == 0
    with pytest.raises(ValueError, match="compact_groups"):
        pack_compact(split, PlanLayout.for_plan(split), np.zeros(PlanLayout.for_plan(split).total_words, np.int32))


PREFILL = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16, q_dtype="bfloat16", causal=True)


def _table(lens):
    pages = (lens + 15) // 16
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = np.random.default_rng(5).permutation(int(indptr[-1])).astype(np.int32)
    return indptr, indices, ((lens - 1) % 16 + 1).astype(np.int32)


def test_wrapper_packs_natural_plans_compactly_but_not_for_cuda_graphs():
    lens = np.random.default_rng(7).integers(512, 2049, 64)
    qo = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    table = _table(lens)
    w = BatchPrefill(paged=True)
    w.plan(qo, *table, num_sms=132, **PREFILL)
    words = w._pack_host()
    plan = w._plan
    g = compact_groups(plan.work)
    assert g > 0 and plan.compact_groups == g
    lay = w._words_layout(plan)[0]
    full = pack(plan.work, lay, np.zeros(lay.total_words, dtype=np.int32))
    view = _kernel_view(words, lay, g, plan.work.n_items)
    for field in ITEM_FIELDS:
        o = lay.offsets[field]
        np.testing.assert_array_equal(view[field], full[o : o + plan.work.n_items], err_msg=field)
    # a split plan next, into the same buffer: the full form, every item word rewritten
    w.plan(qo, *table, num_sms=132, fixed_split_size=256, **PREFILL)
    words = w._pack_host(words)
    assert w._plan.compact_groups == 0
    lay = w._words_layout(w._plan)[0]
    used = lay.offsets["merge_indptr"]
    want = pack(w._plan.work, lay, np.zeros(lay.total_words, dtype=np.int32))
    n = w._plan.work.n_items
    for field in ITEM_FIELDS:
        o = lay.offsets[field]
        np.testing.assert_array_equal(words[o : o + n], want[o : o + n], err_msg=f"after compact: {field}")
    assert used > 0
    # CUDA-graph wrappers keep the full form (the captured kernel arguments are the first plan's)
    gw = BatchPrefill(paged=True, use_cuda_graph=True, max_batch_size=64)
    gw.plan(qo, *table, num_sms=132, **PREFILL)
    gw._pack_host()
    assert gw._plan.compact_groups == 0
