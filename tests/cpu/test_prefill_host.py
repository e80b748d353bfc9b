"""BatchPrefill / single_prefill on NumPy arrays (the CPU reference backend) and plan() without a GPU: the wiring of
layouts, masks (flat and bit-packed) and options to cuinfer.reference, and the work plan the kernel would run."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

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
