"""The planning path of the public wrappers without a GPU: BatchDecode.plan / BatchPrefill.plan take a fast path for
1-D NumPy int32 index arrays (a few combined reductions instead of the interop validators) and memoise what does not
depend on the index arrays. Both must be invisible: the same plan and the same packed words as the validators' path
(int64 or list inputs), and the validators' error messages for bad int32 inputs."""

from __future__ import annotations

import numpy as np
import pytest
from cuinfer.planner import unpack

from cuinfer.decode import BatchDecode
from cuinfer.prefill import BatchPrefill
from cuinfer.prefill import policy as prefill_policy

DECODE = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16, q_dtype="bfloat16")
PREFILL = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, q_dtype="bfloat16")
ARRAYS = ("work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial",
          "merge_indptr", "merge_src", "merge_dst_token", "merge_dst_head")  # fmt: skip


def _table(rng, lens, ps, empty_last=1):
    """Page table of ``lens`` over a shuffled pool; requests without pages get last_page_len ``empty_last``."""
    lens = np.asarray(lens)
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(int(indptr[-1]) + 5)[: indptr[-1]].astype(np.int32)
    last = np.where(pages > 0, lens - (pages - 1) * ps, empty_last).astype(np.int32)
    return indptr, indices, last


def _same_work(a, b):
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert (a.num_partial_rows, a.chunk_size, a.num_ctas) == (b.num_partial_rows, b.chunk_size, b.num_ctas)


@pytest.mark.parametrize(
    "lens, empty_last",
    [
        pytest.param([1, 17, 513, 4097, 300, 33], 1, id="small-split"),
        pytest.param([0, 2000, 0, 77, 1500, 3] * 21, 1, id="126-with-empty"),
        pytest.param([0, 2000, 0, 77, 1500, 3] * 21, 0, id="empty-last-0"),
        pytest.param([1024] * 127 + [32768], 1, id="D8-like"),
    ],
)
def test_decode_fast_path_equals_validators(rng, lens, empty_last):
    indptr, indices, last = _table(rng, lens, 16, empty_last)
    fast, slow = BatchDecode(), BatchDecode()
    fast.plan(indptr, indices, last, **DECODE)
    slow.plan(indptr.astype(np.int64), indices.tolist(), last.astype(np.int64), **DECODE)
    a, b = fast._plan, slow._plan
    np.testing.assert_array_equal(a.kv_lens, b.kv_lens)
    np.testing.assert_array_equal(a.kv_lens, np.asarray(lens))
    assert (a.max_page, a.kv_range) == (b.max_page, b.kv_range) == (int(indices.max()), (min(lens), max(lens)))
    _same_work(a.work, b.work)
    np.testing.assert_array_equal(fast._pack_host(), slow._pack_host())


def test_decode_packed_words_read_back(rng):
    """The host pack holds the plan (planner.unpack) and the page table at the offsets run() passes the kernel."""
    lens = rng.integers(1, 3000, 131)
    lens[7] = 60000
    indptr, indices, last = _table(rng, lens, 16)
    w = BatchDecode()
    w.plan(indptr, indices, last, **DECODE)
    words = w._pack_host()
    plan = w._plan
    lay, off, total = w._words_layout(plan, w._host_holder)
    _same_work(unpack(words, lay), plan.work)
    b = len(lens)
    np.testing.assert_array_equal(words[off["page_indptr"] : off["page_indptr"] + b + 1], indptr)
    np.testing.assert_array_equal(words[off["kv_lens"] : off["kv_lens"] + b], lens)
    np.testing.assert_array_equal(words[off["page_indices"] : off["page_indices"] + indptr[-1]], indices)
    assert total >= off["page_indices"] + indptr[-1]


@pytest.mark.parametrize(
    "mutate, match",
    [
        pytest.param(
            lambda t: t[1].__setitem__(4, -2),
            r"kv_indices must be non-negative but kv_indices\[4\] = -2",
            id="negative-page",
        ),
        pytest.param(
            lambda t: t[2].__setitem__(1, 17),
            r"kv_last_page_len\[1\] must be in \[1, page_size=16\]",
            id="last-too-long",
        ),
        pytest.param(
            lambda t: t[2].__setitem__(2, 0), r"kv_last_page_len\[2\] must be in \[1, page_size=16\]", id="last-zero"
        ),
        pytest.param(lambda t: t[0].__setitem__(2, 1), r"kv_indptr must be non-decreasing", id="indptr-drops"),
    ],
)
def test_decode_fast_path_errors_name_the_argument(rng, mutate, match):
    table = _table(rng, [40, 33, 70, 5], 16)
    mutate(table)
    with pytest.raises(ValueError, match=match):
        BatchDecode().plan(*table, **DECODE)


def test_decode_indices_shorter_than_the_table(rng):
    indptr, indices, last = _table(rng, [40, 33, 70, 5], 16)
    # 3 + 3 + 5 + 1 pages of 16 tokens
    with pytest.raises(ValueError, match=r"kv_indices must have at least 12 entries but has 9"):
        BatchDecode().plan(indptr, indices[:9], last, **DECODE)


@pytest.mark.parametrize("paged", [pytest.param(True, id="paged"), pytest.param(False, id="ragged")])
@pytest.mark.parametrize("causal", [pytest.param(True, id="causal"), pytest.param(False, id="full")])
def test_prefill_fast_path_equals_validators(rng, paged, causal):
    qo = rng.integers(1, 700, 37)
    qo[5] = 0  # a request without query tokens
    kv = qo + rng.integers(0, 900, 37)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    kw = dict(PREFILL, causal=causal)
    fast, slow = BatchPrefill(paged=paged), BatchPrefill(paged=paged)
    if paged:
        indptr, indices, last = _table(rng, kv, 16)
        fast.plan(qo_indptr, indptr, indices, last, page_size=16, **kw)
        slow.plan(qo_indptr.astype(np.int64), indptr.astype(np.int64), indices.tolist(), last.tolist(),
                  page_size=16, **kw)  # fmt: skip
        assert fast._plan.max_page == slow._plan.max_page == int(indices.max())
    else:
        kv_indptr = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32)
        fast.plan(qo_indptr, kv_indptr, **kw)
        slow.plan(qo_indptr.astype(np.int64), kv_indptr.tolist(), **kw)
    a, b = fast._plan, slow._plan
    np.testing.assert_array_equal(a.kv_lens, kv)
    np.testing.assert_array_equal(a.qo_lens, b.qo_lens)
    assert (a.qo_range, a.kv_range, a.config) == (b.qo_range, b.kv_range, b.config)
    _same_work(a.work, b.work)
    np.testing.assert_array_equal(fast._pack_host(), slow._pack_host())


def test_prefill_fast_path_errors_name_the_argument(rng):
    qo_indptr = np.array([0, 5, 9, 20], dtype=np.int32)
    indptr, indices, last = _table(rng, [40, 33, 70], 16)
    bad = qo_indptr.copy()
    bad[2] = 4
    with pytest.raises(ValueError, match=r"qo_indptr must be non-decreasing but qo_indptr\[1\] = 5 > qo_indptr\[2\]"):
        BatchPrefill().plan(bad, indptr, indices, last, page_size=16, **PREFILL)
    last[1] = 0
    with pytest.raises(ValueError, match=r"kv_last_page_len\[1\] must be in \[1, page_size=16\]"):
        BatchPrefill().plan(qo_indptr, indptr, indices, last, page_size=16, **PREFILL)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_tile_memo_follows_the_policy(head_dim):
    """BatchPrefill memoises the tile policy by query_tile(average packed query length), the only way choose_tiles
    reads that average. Planning batches of many averages through one wrapper must give choose_tiles' answers."""
    w = BatchPrefill(paged=False)
    for avg_tokens in (1, 3, 4, 5, 8, 15, 16, 17, 31, 33, 64, 100, 1000, 5000):
        qo_indptr = np.array([0, avg_tokens, 2 * avg_tokens], dtype=np.int32)
        w.plan(qo_indptr, qo_indptr, num_qo_heads=8, num_kv_heads=2, head_dim=head_dim, q_dtype="float16")
        want = prefill_policy.choose_tiles(avg_tokens * 4, head_dim, head_dim, paged=False)
        assert w._plan.config == want, avg_tokens
