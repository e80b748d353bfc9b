"""The plan as the decode kernels read it, emulated in NumPy: every (CTA, item) computes the state of its KV range
for the query heads of its tile exactly as batch_decode_cuda_core / batch_decode_tensor_core do (query rows
qo_tile * rows_per_tile + r, write o/lse for item_partial = -1, else partial rows item_partial + r), then the merge
list combines the partials. The result must equal the reference: this pins the host/kernel contract (tile rows per
kernel, partial-row numbering, window clipping, the CTA lists) without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from cuinfer import reference
from cuinfer.decode import BatchDecode


def _emulate(w: BatchDecode, q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_start_of: np.ndarray):
    """q [B, Hq, D]; k/v ragged [nnz, Hkv, D] float64 with request b at rows kv_start_of[b]:...; sm_scale default."""
    plan = w._plan
    work = plan.work
    b_, hq, d = q.shape
    g = hq // plan.num_kv_heads
    br = plan.config.rows_per_tile
    scale = plan.options.sm_scale
    o = np.full((b_, hq, d), np.nan)
    lse = np.full((b_, hq), np.nan)
    po = np.full((work.num_partial_rows, d), np.nan)
    pl = np.full(work.num_partial_rows, np.nan)
    seen = np.zeros(work.n_items, bool)
    for c in range(work.num_ctas):
        for it in range(work.work_indptr[c], work.work_indptr[c + 1]):
            seen[it] = True
            b, h, t = work.item_req[it], work.item_kv_head[it], work.item_qo_tile[it]
            s0, s1, part = work.item_kv_start[it], work.item_kv_end[it], work.item_partial[it]
            kv_len = int(plan.kv_lens[b])
            if plan.options.window_left >= 0:  # the kernel's own clamp
                s0 = max(s0, kv_len - 1 - plan.options.window_left)
                s1 = max(s1, s0)
            for r in range(br):
                hig = t * br + r
                if hig >= g:
                    break
                head = h * g + hig
                keys = k[kv_start_of[b] + s0 : kv_start_of[b] + s1, h]
                vals = v[kv_start_of[b] + s0 : kv_start_of[b] + s1, h]
                if keys.shape[0]:
                    sc = keys @ q[b, head] * scale / np.log(2.0)
                    m = sc.max()
                    p = np.exp2(sc - m)
                    st_o, st_l = p @ vals / p.sum(), m + np.log2(p.sum())
                else:
                    st_o, st_l = np.zeros(d), -np.inf
                if part < 0:
                    o[b, head], lse[b, head] = st_o, st_l
                else:
                    po[part + r], pl[part + r] = st_o, st_l
    assert seen.all(), "every item belongs to exactly one CTA list"
    for i in range(work.n_merge):
        src = work.merge_src[work.merge_indptr[i] : work.merge_indptr[i + 1]]
        ls = pl[src]
        assert np.isfinite(po[src]).all(), "a merge source partial row was never written"
        m = ls.max()
        wgt = np.exp2(ls - m) if np.isfinite(m) else np.zeros_like(ls)
        tok, head = work.merge_dst_token[i], work.merge_dst_head[i]
        o[tok, head] = wgt @ po[src] / wgt.sum() if wgt.sum() > 0 else 0.0
        lse[tok, head] = m + np.log2(wgt.sum()) if wgt.sum() > 0 else -np.inf
    return o, lse


@pytest.mark.parametrize(
    ("lens", "heads", "tc", "split", "window", "sms"),
    [
        pytest.param((1, 17, 513, 4097, 300), (32, 8), None, None, -1, 7, id="tc-auto"),
        pytest.param((1, 17, 513, 4097, 300), (32, 32), None, 256, -1, 7, id="cc-split256"),
        pytest.param((5, 2000, 0, 700), (28, 4), True, 128, -1, 7, id="tc-g7-split-empty"),
        pytest.param((5, 2000, 40), (64, 2), True, 512, -1, 7, id="tc-g32-two-qo-tiles"),
        pytest.param((5, 2000, 40), (40, 8), False, None, 100, 7, id="cc-g5-window"),
        pytest.param((9000,), (16, 1), None, None, -1, 7, id="single-long-auto-split"),
        # 40 requests, 8 KV heads on 54 (81) CTAs: a lane cut with a partial lane of 6 (1) CTAs, and a window
        pytest.param((1, 900, 7, 300, 9000, 64, 700, 33) * 5, (32, 8), None, None, 5000, 27, id="lanes-window"),
        pytest.param((1, 900, 7, 300, 9000, 64, 700, 33) * 5, (24, 8), False, None, -1, 27, id="lanes-cuda-cores"),
    ],
)
def test_plan_contract_reproduces_the_reference(rng, lens, heads, tc, split, window, sms):
    hq, hkv = heads
    d, ps = 64, 16
    lens = np.asarray(lens)
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = np.arange(indptr[-1], dtype=np.int32)
    last = np.where(pages > 0, lens - (pages - 1) * ps, 1).astype(np.int32)
    w = BatchDecode(use_tensor_cores=tc)
    w.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="float16",
           fixed_split_size=split, window_left=window, num_sms=sms)  # fmt: skip
    if split is not None:
        assert w._plan.work.num_partial_rows > 0
    if len(lens) == 40:
        assert w._plan.work.assign_mode == "lanes" and w._plan.work.num_partial_rows > 0
    q = rng.standard_normal((lens.shape[0], hq, d))
    k = rng.standard_normal((int(lens.sum()), hkv, d))
    v = rng.standard_normal((int(lens.sum()), hkv, d))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    o, lse = _emulate(w, q, k, v, starts)
    ref_o = np.zeros_like(o)
    ref_lse = np.zeros_like(lse)
    for b in range(lens.shape[0]):
        sl = slice(starts[b], starts[b] + lens[b])
        ro, rl = reference.attention(q[b : b + 1], k[sl], v[sl], window_left=window)
        ref_o[b], ref_lse[b] = ro[0], rl[0]
    np.testing.assert_allclose(o, ref_o, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-9, atol=1e-9)
