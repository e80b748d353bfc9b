"""Reference paged KV: page tables vs ragged tensors, layouts, appends, and bit-packed masks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuinfer import reference as R


@pytest.fixture
def rng(request):
    seed = int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"random seed for {request.node.name}: {seed}")
    return np.random.default_rng(seed)


def build_paged(rng, k, v, kv_lens, page_size, layout, as_tuple, spare_pages=3):
    """Scatter ragged k/v into randomly permuted pages (plus unused junk pages); returns the page table."""
    hkv, d, dv = k.shape[1], k.shape[2], v.shape[2]
    n_pages = [-(-n // page_size) for n in kv_lens]
    total = sum(n_pages) + spare_pages
    perm = rng.permutation(total)
    k_cache = rng.standard_normal((total, page_size, hkv, d)).astype(k.dtype)  # junk everywhere first
    v_cache = rng.standard_normal((total, page_size, hkv, dv)).astype(v.dtype)
    kv_indptr = np.cumsum([0, *n_pages]).astype(np.int32)
    kv_indices = perm[: kv_indptr[-1]].astype(np.int32)
    last = np.array([n - page_size * (p - 1) if p else 0 for n, p in zip(kv_lens, n_pages, strict=True)], np.int32)
    start = 0
    for b, n in enumerate(kv_lens):
        for t in range(n):
            page = kv_indices[kv_indptr[b] + t // page_size]
            k_cache[page, t % page_size] = k[start + t]
            v_cache[page, t % page_size] = v[start + t]
        start += n
    if layout == "HND":
        k_cache, v_cache = k_cache.transpose(0, 2, 1, 3).copy(), v_cache.transpose(0, 2, 1, 3).copy()
    cache = (k_cache, v_cache) if as_tuple else np.stack([k_cache, v_cache], axis=1)
    return cache, kv_indptr, kv_indices, last


PAGED_CASES = [
    pytest.param(1, "NHD", False, id="page1-nhd"),
    pytest.param(5, "NHD", False, id="page5-nhd"),
    pytest.param(16, "NHD", True, id="page16-nhd-tuple"),
    pytest.param(5, "HND", False, id="page5-hnd"),
    pytest.param(16, "HND", True, id="page16-hnd-tuple"),
]
KV_LENS = [37, 1, 0, 16, 80, 5]


@pytest.mark.parametrize(("page_size", "layout", "as_tuple"), PAGED_CASES)
def test_paged_kv_to_ragged_recovers_tokens(rng, page_size, layout, as_tuple):
    n = sum(KV_LENS)
    k = rng.standard_normal((n, 2, 8)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((n, 2, 6 if as_tuple else 8)).astype(ml_dtypes.bfloat16)  # a 5-D cache has D == Dv
    cache, indptr, indices, last = build_paged(rng, k, v, KV_LENS, page_size, layout, as_tuple)
    k2, v2, indptr_tok = R.paged_kv_to_ragged(cache, indptr, indices, last, kv_layout=layout)
    assert k2.dtype == k.dtype and v2.dtype == v.dtype
    np.testing.assert_array_equal(k2.astype(np.float32), k.astype(np.float32))
    np.testing.assert_array_equal(v2.astype(np.float32), v.astype(np.float32))
    np.testing.assert_array_equal(indptr_tok, np.cumsum([0, *KV_LENS]))


@pytest.mark.parametrize(("page_size", "layout", "as_tuple"), PAGED_CASES)
def test_batch_decode_paged_equals_ragged(rng, page_size, layout, as_tuple):
    hq, hkv, d = 28, 4, 16
    n = sum(KV_LENS)
    k, v = rng.standard_normal((n, hkv, d)), rng.standard_normal((n, hkv, d))
    cache, indptr, indices, last = build_paged(rng, k, v, KV_LENS, page_size, layout, as_tuple)
    q = rng.standard_normal((len(KV_LENS), hq, d))
    opts = dict(window_left=6, pos_encoding="rope_llama", logits_soft_cap=7.0, k_scale=0.8, v_scale=1.3)
    o, lse = R.batch_decode_paged(q, cache, indptr, indices, last, kv_layout=layout, **opts)
    kv_indptr = np.cumsum([0, *KV_LENS])
    o_r, lse_r = R.batch_attention_ragged(q, k, v, np.arange(len(KV_LENS) + 1), kv_indptr, **opts)
    np.testing.assert_array_equal(o, o_r)
    np.testing.assert_array_equal(lse, lse_r)
    assert np.all(o[2] == 0.0) and np.all(lse[2] == -np.inf)  # the request with no pages
    # a decode query sits at kv_len - 1: with window_left = 6 it sees exactly keys kv_len-7 .. kv_len-1
    b = 4
    ks = slice(kv_indptr[b + 1] - 7, kv_indptr[b + 1])
    o_nr, _ = R.batch_decode_paged(q, cache, indptr, indices, last, kv_layout=layout, window_left=6)
    o_w, _ = R.attention(q[b : b + 1], k[ks], v[ks])
    np.testing.assert_allclose(o_nr[b], o_w[0], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("page_size", "layout", "as_tuple"), PAGED_CASES)
def test_batch_prefill_paged_equals_ragged(rng, page_size, layout, as_tuple):
    hq, hkv, d = 6, 3, 8
    dv = 12 if as_tuple else d  # a 5-D cache has D == Dv
    qo_lens = [5, 1, 3, 16, 9, 7]  # request 5 has more queries than keys
    n = sum(KV_LENS)
    k, v = rng.standard_normal((n, hkv, d)), rng.standard_normal((n, hkv, dv))
    cache, indptr, indices, last = build_paged(rng, k, v, KV_LENS, page_size, layout, as_tuple)
    qo_indptr = np.cumsum([0, *qo_lens])
    q = rng.standard_normal((qo_indptr[-1], hq, d))
    mask = rng.random(sum(a * b for a, b in zip(qo_lens, KV_LENS, strict=True))) < 0.8
    opts = dict(causal=True, custom_mask=mask, pos_encoding="alibi")
    o, lse = R.batch_prefill_paged(q, cache, qo_indptr, indptr, indices, last, kv_layout=layout, **opts)
    o_r, lse_r = R.batch_attention_ragged(q, k, v, qo_indptr, np.cumsum([0, *KV_LENS]), **opts)
    np.testing.assert_array_equal(o, o_r)
    np.testing.assert_array_equal(lse, lse_r)
    assert not np.isnan(o).any()
    assert np.all(lse[qo_indptr[5] : qo_indptr[5] + 2] == -np.inf)  # 7 queries over 5 keys: 2 empty rows


def test_nhd_and_hnd_caches_agree(rng):
    kv_lens, page_size = [13, 29], 4
    n = sum(kv_lens)
    k, v = rng.standard_normal((n, 2, 8)), rng.standard_normal((n, 2, 8))
    q = rng.standard_normal((2, 4, 8))
    rng_state = rng.bit_generator.state
    nhd = build_paged(rng, k, v, kv_lens, page_size, "NHD", False)
    rng.bit_generator.state = rng_state  # same permutation for the HND copy
    hnd = build_paged(rng, k, v, kv_lens, page_size, "HND", False)
    np.testing.assert_array_equal(hnd[0], nhd[0].transpose(0, 1, 3, 2, 4))
    o1, l1 = R.batch_decode_paged(q, *nhd, kv_layout="NHD")
    o2, l2 = R.batch_decode_paged(q, *hnd, kv_layout="HND")
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(l1, l2)


def test_get_batch_indices_positions_by_hand():
    batch, pos = R.get_batch_indices_positions([0, 2, 5, 5], [4, 3, 9], nnz=7)
    np.testing.assert_array_equal(batch, [0, 0, 1, 1, 1, -1, -1])
    np.testing.assert_array_equal(pos, [2, 3, 0, 1, 2, -1, -1])
    with pytest.raises(ValueError, match="seq_lens"):
        R.get_batch_indices_positions([0, 5], [3], nnz=5)


@pytest.mark.parametrize(
    ("page_size", "layout", "dtype"),
    [
        pytest.param(1, "NHD", np.float16, id="page1-nhd-fp16"),
        pytest.param(5, "HND", ml_dtypes.bfloat16, id="page5-hnd-bf16"),
        pytest.param(16, "NHD", ml_dtypes.float8_e4m3fn, id="page16-nhd-e4m3"),
    ],
)
def test_append_paged_kv_cache_extends_each_request(rng, page_size, layout, dtype):
    old_lens, new_lens = [7, 0, 16, 3], [2, 5, 1, 30]
    hkv, d = 2, 8
    seq_lens = [a + b for a, b in zip(old_lens, new_lens, strict=True)]
    k_all = rng.standard_normal((sum(seq_lens), hkv, d)).astype(dtype)
    v_all = rng.standard_normal((sum(seq_lens), hkv, d)).astype(dtype)
    cache, indptr, indices, last = build_paged(rng, k_all, v_all, seq_lens, page_size, layout, False)
    seq_indptr = np.cumsum([0, *seq_lens])
    # Poison the slots of the new tokens, then append them back.
    k_new = np.concatenate([k_all[seq_indptr[b] + old_lens[b] : seq_indptr[b + 1]] for b in range(4)])
    v_new = np.concatenate([v_all[seq_indptr[b] + old_lens[b] : seq_indptr[b + 1]] for b in range(4)])
    append_indptr = np.cumsum([0, *new_lens])
    batch, pos = R.get_batch_indices_positions(append_indptr, seq_lens, nnz=append_indptr[-1] + 3)
    k_view, v_view = (cache[:, 0], cache[:, 1])
    for t in range(append_indptr[-1]):
        b, p = batch[t], pos[t]
        page, slot = indices[indptr[b] + p // page_size], p % page_size
        if layout == "NHD":
            k_view[page, slot], v_view[page, slot] = np.nan, np.nan
        else:
            k_view[page, :, slot], v_view[page, :, slot] = np.nan, np.nan
    k_pad = np.concatenate([k_new, rng.standard_normal((3, hkv, d)).astype(dtype)])  # 3 padding rows, skipped
    v_pad = np.concatenate([v_new, rng.standard_normal((3, hkv, d)).astype(dtype)])
    before = cache.copy()
    R.append_paged_kv_cache(k_pad, v_pad, batch, pos, cache, indices, indptr, last, kv_layout=layout)
    k2, v2, _ = R.paged_kv_to_ragged(cache, indptr, indices, last, kv_layout=layout)
    np.testing.assert_array_equal(k2.astype(np.float32), k_all.astype(np.float32))
    np.testing.assert_array_equal(v2.astype(np.float32), v_all.astype(np.float32))
    changed = ~np.isnan(before.astype(np.float32)) & (before.astype(np.float32) != cache.astype(np.float32))
    assert not changed.any()  # nothing but the poisoned slots moved


def test_append_rejects_position_past_kv_len(rng):
    k = rng.standard_normal((4, 1, 8))
    cache, indptr, indices, last = build_paged(rng, k, k, [4], 4, "NHD", False)
    with pytest.raises(ValueError, match="kv_len is 4"):
        R.append_paged_kv_cache(k[:1], k[:1], [0], [4], cache, indices, indptr, last)


def test_page_table_errors(rng):
    k = rng.standard_normal((10, 1, 8))
    cache, indptr, indices, last = build_paged(rng, k, k, [10], 4, "NHD", False)
    with pytest.raises(ValueError, match=r"kv_last_page_len\[0\] = 5"):
        R.paged_kv_to_ragged(cache, indptr, indices, [5])
    with pytest.raises(ValueError, match="kv_indices must name pages"):
        R.paged_kv_to_ragged(cache, indptr, indices + 100, last)
    with pytest.raises(ValueError, match="kv_layout"):
        R.paged_kv_to_ragged(cache, indptr, indices, last, kv_layout="NDH")


def test_packbits_little_and_big_by_hand():
    x = np.array([1, 0, 1, 1, 0, 0, 1, 1], bool)
    assert R.packbits(x).tolist() == [0b11001101]  # little: element k is bit k
    assert R.packbits(x, bitorder="big").tolist() == [0b10110011]
    assert R.packbits(np.ones(9, bool)).tolist() == [255, 1]
    with pytest.raises(ValueError, match="bitorder"):
        R.packbits(x, bitorder="middle")


@pytest.mark.parametrize("bitorder", [pytest.param("little", id="little"), pytest.param("big", id="big")])
def test_segment_packbits_round_trip(rng, bitorder):
    qo_lens, kv_lens = [3, 1, 0, 7, 2], [5, 8, 4, 13, 0]
    seg = [a * b for a, b in zip(qo_lens, kv_lens, strict=True)]
    x = rng.random(sum(seg)) < 0.5
    indptr = np.cumsum([0, *seg])
    packed, new_indptr = R.segment_packbits(x, indptr, bitorder=bitorder)
    np.testing.assert_array_equal(new_indptr, np.cumsum([0, *[(s + 7) // 8 for s in seg]]))
    for b in range(len(seg)):
        want = np.packbits(x[indptr[b] : indptr[b + 1]], bitorder=bitorder)
        np.testing.assert_array_equal(packed[new_indptr[b] : new_indptr[b + 1]], want)
    back = R.unpack_custom_mask(packed, np.cumsum([0, *qo_lens]), np.cumsum([0, *kv_lens]), bitorder=bitorder)
    np.testing.assert_array_equal(back, x)
