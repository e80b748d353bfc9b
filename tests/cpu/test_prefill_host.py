"""BatchPrefill / single_prefill on NumPy arrays (the CPU reference backend) and plan() without a GPU: the wiring of
layouts, masks (flat and bit-packed) and options to cuinfer.reference, and the work plan the kernel would run."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from cuinfer.planner.assign import POOL_SHARE

from cuinfer import reference
from cuinfer.prefill import BatchPrefill, single_prefill

BF16 = ml_dtypes.bfloat16


def _lens(rng, b, lo, hi):
    return rng.integers(lo, hi + 1, b)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ragged_matches_reference(layout, rng):
    qo, kv = _lens(rng, 3, 1, 23), _lens(rng, 3, 5, 41)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)])
    kv_indptr = np.concatenate([[0], np.cumsum(kv)])
    q = rng.standard_normal((qo_indptr[-1], 8, 64)).astype(np.float16)
    k = rng.standard_normal((kv_indptr[-1], 2, 64)).astype(np.float16)
    v = rng.standard_normal((kv_indptr[-1], 2, 64)).astype(np.float16)
    w = BatchPrefill(paged=False, kv_layout=layout)
    w.plan(qo_indptr, kv_indptr, num_qo_heads=8, num_kv_heads=2, head_dim=64, causal=True, q_dtype="float16",
           logits_soft_cap=20.0, window_left=7)  # fmt: skip
    kk, vv = (k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy()) if layout == "HND" else (k, v)
    o, lse = w.run(q, kk, vv, return_lse=True)
    o_ref, lse_ref = reference.batch_attention_ragged(
        q, k, v, qo_indptr, kv_indptr, causal=True, logits_soft_cap=20.0, window_left=7
    )
    assert o.dtype == np.float16 and lse.dtype == np.float32
    np.testing.assert_array_equal(o, o_ref.astype(np.float16))
    np.testing.assert_array_equal(lse, lse_ref.astype(np.float32))


def test_flat_and_packed_masks_agree(rng):
    qo, kv = np.array([3, 5]), np.array([7, 4])
    qo_indptr = np.concatenate([[0], np.cumsum(qo)])
    kv_indptr = np.concatenate([[0], np.cumsum(kv)])
    mask = rng.random(int((qo * kv).sum())) < 0.6
    packed, _ = reference.segment_packbits(mask, np.concatenate([[0], np.cumsum(qo * kv)]), bitorder="little")
    q = rng.standard_normal((8, 4, 128)).astype(BF16)
    k = rng.standard_normal((11, 4, 128)).astype(BF16)
    v = rng.standard_normal((11, 4, 128)).astype(BF16)
    outs = []
    for kw in (dict(custom_mask=mask), dict(packed_custom_mask=packed)):
        w = BatchPrefill(paged=False)
        w.plan(qo_indptr, kv_indptr, num_qo_heads=4, num_kv_heads=4, head_dim=128, q_dtype="bfloat16", **kw)
        np.testing.assert_array_equal(w._plan.mask_bytes, packed)
        outs.append(w.run(q, k, v))
    o_ref, _ = reference.batch_attention_ragged(q, k, v, qo_indptr, kv_indptr, custom_mask=mask)
    for o in outs:
        np.testing.assert_array_equal(o, o_ref.astype(BF16))


def test_paged_matches_reference_with_out_and_lse(rng):
    page, hkv, d = 5, 2, 64
    kv = np.array([9, 1, 13])
    pages = (kv + page - 1) // page
    kv_indptr = np.concatenate([[0], np.cumsum(pages)])
    last = kv - page * (pages - 1)
    indices = rng.permutation(12)[: kv_indptr[-1]]
    cache = rng.standard_normal((12, 2, page, hkv, d)).astype(BF16)
    qo_indptr = np.array([0, 4, 5, 9])
    q = rng.standard_normal((9, 4, d)).astype(BF16)
    w = BatchPrefill(paged=True)
    w.plan(qo_indptr, kv_indptr, indices, last, num_qo_heads=4, num_kv_heads=hkv, head_dim=d, page_size=page,
           causal=True, q_dtype="bfloat16", pos_encoding="alibi")  # fmt: skip
    out = np.full((9, 4, d), np.nan, dtype=BF16)
    lse = np.full((9, 4), np.nan, dtype=np.float32)
    got = w.run(q, cache, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    o_ref, lse_ref = reference.batch_prefill_paged(
        q, cache, qo_indptr, kv_indptr, indices, last, causal=True, pos_encoding="alibi"
    )
    np.testing.assert_array_equal(out, o_ref.astype(BF16))
    np.testing.assert_array_equal(lse, lse_ref.astype(np.float32))


def test_single_prefill_on_host(rng):
    q = rng.standard_normal((6, 4, 64)).astype(np.float16)
    k = rng.standard_normal((9, 1, 64)).astype(np.float16)
    v = rng.standard_normal((9, 1, 64)).astype(np.float16)
    mask = rng.random((6, 9)) < 0.7
    o, lse = single_prefill(q, k, v, causal=True, custom_mask=mask, return_lse=True)
    o_ref, lse_ref = reference.attention(q, k, v, causal=True, custom_mask=mask)
    np.testing.assert_array_equal(o, o_ref.astype(np.float16))
    np.testing.assert_array_equal(lse, lse_ref.astype(np.float32))


def test_plan_covers_every_row_once_with_the_chosen_tile(rng):
    """The plan the kernel would run: every (request, packed row, kv head) in exactly one unsplit item or merged."""
    qo, kv = np.array([1, 17, 37, 127]), np.array([54, 97, 512, 127])
    qo_indptr = np.concatenate([[0], np.cumsum(qo)])
    kv_indptr = np.concatenate([[0], np.cumsum(kv)])
    w = BatchPrefill(paged=False)
    w.plan(qo_indptr, kv_indptr, num_qo_heads=28, num_kv_heads=4, head_dim=128, causal=True, q_dtype="bfloat16")
    plan = w._plan
    g, br = 7, plan.config.tile_q
    assert br == 128  # average packed length (182 tokens x 7 heads) / 4 requests > 64
    work = plan.work
    seen = np.zeros((int(qo_indptr[-1]) * g, 4), dtype=int)
    for i in range(work.n_items):
        b, t, h = work.item_req[i], work.item_qo_tile[i], work.item_kv_head[i]
        rows = np.arange(t * br, min((t + 1) * br, qo[b] * g))
        if work.item_partial[i] < 0:
            seen[qo_indptr[b] * g + rows, h] += 1
    for m in range(work.n_merge):
        seen[work.merge_dst_token[m] * g + work.merge_dst_head[m] % g, work.merge_dst_head[m] // g] += 1
    assert np.all(seen == 1)


def test_workspace_size_matches_the_plan(rng):
    """workspace_size() takes plan()'s arguments and names the bytes the plan's split-KV partial states need."""
    from cuinfer.planner import layout as plan_layout

    qo_indptr, kv_indptr = [0, 300, 301], [0, 4000, 8000]
    kw = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, causal=True, q_dtype="bfloat16", fixed_split_size=512)
    w = BatchPrefill(paged=False)
    need = w.workspace_size(qo_indptr, kv_indptr, **kw)
    w.plan(qo_indptr, kv_indptr, **kw)
    assert w._plan.work.num_partial_rows > 0
    assert need == plan_layout.workspace_bytes(w._plan.work, 128) > 0


@pytest.mark.parametrize(
    "paged, causal, group",
    [
        pytest.param(True, True, 4, id="paged-causal-gqa4"),
        pytest.param(True, False, 7, id="paged-gqa7"),
        pytest.param(False, True, 1, id="ragged-causal-mha"),
    ],
)
def test_plan_work_of_plan_is_the_public_planners(paged, causal, group, rng):
    """plan() hands its checked lengths and their ranges straight to the planner (``plan_checked``); the work plan
    must be the one ``planner.plan_work`` makes from the bare lengths (which checks and reduces them itself)."""
    from cuinfer.planner import plan_work

    b, ps = 61, 5 if paged else 1
    qo = _lens(rng, b, 0, 700)
    kv = qo + _lens(rng, b, 0, 900)
    kw = dict(num_qo_heads=2 * group, num_kv_heads=2, head_dim=128, causal=causal, q_dtype="bfloat16")
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    w = BatchPrefill(paged=paged)
    if paged:
        pages = -(-kv // ps)
        kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        last = np.where(pages > 0, kv - (pages - 1) * ps, 1).astype(np.int32)
        indices = rng.permutation(int(kv_indptr[-1]) + 7).astype(np.int32)
        w.plan(qo_indptr, kv_indptr, indices, last, page_size=ps, **kw)
    else:
        w.plan(qo_indptr, np.concatenate([[0], np.cumsum(kv)]).astype(np.int32), **kw)
    plan = w._plan
    want = plan_work(qo, kv, num_kv_heads=2, group_size=group, tile_rows=plan.config.tile_q,
                     num_ctas=plan.work.num_ctas, kv_granule=plan.config.tile_kv, causal=causal,
                     pool_share=POOL_SHARE)  # fmt: skip
    got = plan.work
    assert (got.assign_mode, got.chunk_size, got.n_pool) == (want.assign_mode, want.chunk_size, want.n_pool)
    for name in ("work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end",
                 "item_partial", "merge_src", "merge_dst_token"):  # fmt: skip
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


def test_plan_options_follow_each_call():
    """plan() keeps the facts of its last arguments (compared by identity, then by value): a call with other options,
    or with tile sizes given as an array, must plan with those."""
    w = BatchPrefill(paged=False)
    qo, kv = [0, 37, 50], [0, 90, 130]
    kw = dict(num_qo_heads=8, num_kv_heads=2, head_dim=128, q_dtype="bfloat16")
    for causal, window in ((True, -1), (False, -1), (True, 11), (True, -1)):
        w.plan(qo, kv, causal=causal, window_left=window, **kw)
        assert (w._plan.options.causal, w._plan.options.window_left) == (causal, window)
    w.plan(qo, kv, causal=True, tile_sizes=(64, 32), **kw)
    assert (w._plan.config.tile_q, w._plan.config.tile_kv) == (64, 32)
    w.plan(qo, kv, causal=True, tile_sizes=np.array([16, 64]), **kw)  # unhashable, and ambiguous under ==
    assert (w._plan.config.tile_q, w._plan.config.tile_kv) == (16, 64)
