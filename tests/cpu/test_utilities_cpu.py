"""The serving utilities on NumPy inputs (the CPU reference route): results against formulas written here, odd shapes
(page sizes 1 / 5 / 16, lengths that are not multiples of a page, strided inputs, partial rotary dims, interleave,
Llama 3.1 frequencies, positions up to 10^6), in-place semantics and output dtypes, and every validation message."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import cuinfer

I32 = np.int32
BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2


# ---- get_batch_indices_positions, get_seq_lens ---------------------------------------------------------------------


def test_batch_indices_positions_by_hand():
    b, p = cuinfer.get_batch_indices_positions(np.array([0, 2, 2, 5], I32), np.array([4, 1, 9], I32), 7)
    assert b.dtype == np.int32 and p.dtype == np.int32
    np.testing.assert_array_equal(b, [0, 0, 2, 2, 2, -1, -1])  # request 1 appends nothing; 2 padding rows
    np.testing.assert_array_equal(p, [2, 3, 6, 7, 8, -1, -1])


def test_batch_indices_positions_random(rng):
    append_lens = rng.integers(0, 40, size=23)
    seq_lens = append_lens + rng.integers(0, 3000, size=23)
    indptr = np.concatenate([[0], np.cumsum(append_lens)]).astype(I32)
    b, p = cuinfer.get_batch_indices_positions(indptr, seq_lens.astype(I32), int(indptr[-1]) + 5)
    for req in range(23):
        rows = slice(indptr[req], indptr[req + 1])
        assert (b[rows] == req).all()
        np.testing.assert_array_equal(p[rows], np.arange(seq_lens[req] - append_lens[req], seq_lens[req]))
    assert (b[indptr[-1] :] == -1).all() and (p[indptr[-1] :] == -1).all()


def test_seq_lens_by_hand():
    lens = cuinfer.get_seq_lens(np.array([0, 2, 2, 5, 6], I32), np.array([3, 0, 1, 16], I32), 16)
    assert lens.dtype == np.int32
    np.testing.assert_array_equal(lens, [19, 0, 33, 16])  # a request without pages has 0 tokens


@pytest.mark.parametrize(
    ("call", "match"),
    [
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.array([0, 2.0]), np.array([2], I32), 2),
                     "append_indptr must have dtype int32 or int64 but has dtype float64", id="indptr-dtype"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.array([0, 2]), np.array([2**31]), 2),
                     "seq_lens must fit in int32", id="seq-lens-int32"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.zeros((2, 2), I32), np.array([2], I32), 2),
                     "append_indptr must have 1 dimensions", id="indptr-2d"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.zeros(0, I32), np.zeros(0, I32), 2),
                     "append_indptr must have batch_size", id="indptr-empty"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.array([0, 2], I32), np.array([2, 3], I32), 2),
                     r"seq_lens must have shape \(1,\) but has shape \(2,\)", id="seq-lens-length"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.array([0, 2], I32), np.array([2], I32), -1),
                     "nnz must be an integer >= 0 but is -1", id="nnz-negative"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.array([0, 2], I32), np.array([2], I32), True),
                     "nnz must be an integer", id="nnz-bool"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.array([0, 5], I32), np.array([5], I32), 4),
                     "append_indptr must end at most at nnz = 4 but ends at 5", id="nnz-short"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.array([0, 5, 3], I32), np.array([5, 5], I32), 6),
                     "append_indptr must be non-decreasing", id="indptr-decreasing"),
        pytest.param(lambda: cuinfer.get_batch_indices_positions(np.array([0, 5], I32), np.array([3], I32), 5),
                     "seq_lens", id="seq-lens-short"),
        pytest.param(lambda: cuinfer.get_seq_lens(np.array([0, 2], I32), np.array([1], I32), 0),
                     "page_size must be an integer >= 1 but is 0", id="page-size"),
        pytest.param(lambda: cuinfer.get_seq_lens(np.array([0, 2], I32), np.array([1, 1], I32), 4),
                     r"kv_last_page_len must have shape \(1,\)", id="last-page-len-length"),
        pytest.param(lambda: cuinfer.get_seq_lens(np.array([1, 2], I32), np.array([1], I32), 4),
                     "kv_indptr must start at 0", id="kv-indptr-start"),
    ],
)  # fmt: skip
def test_index_utility_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---- append_paged_kv_cache -----------------------------------------------------------------------------------------


def make_table(rng, kv_lens, page_size, num_pages):
    """A page table over randomly chosen distinct pages of a cache with num_pages pages."""
    n_pages = [-(-n // page_size) for n in kv_lens]
    pages = rng.permutation(num_pages)[: sum(n_pages)].astype(I32)
    indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(I32)
    last = np.array([n - page_size * (p - 1) if p else 0 for n, p in zip(kv_lens, n_pages, strict=True)], I32)
    return pages, indptr, last


def expected_append(cache_k, cache_v, k, v, bidx, pos, indices, indptr, page_size, layout):
    """The append written token by token (cache_k / cache_v are 4-D copies in the given layout)."""
    for t in range(k.shape[0]):
        if bidx[t] < 0:
            continue
        page = indices[indptr[bidx[t]] + pos[t] // page_size]
        slot = pos[t] % page_size
        if layout == "NHD":
            cache_k[page, slot], cache_v[page, slot] = k[t], v[t]
        else:
            cache_k[page, :, slot], cache_v[page, :, slot] = k[t], v[t]


APPEND_CASES = [
    pytest.param(1, "NHD", False, np.float16, id="page1-nhd-fp16"),
    pytest.param(5, "NHD", True, BF16, id="page5-nhd-tuple-bf16"),
    pytest.param(5, "HND", False, np.float16, id="page5-hnd-fp16"),
    pytest.param(16, "HND", True, BF16, id="page16-hnd-tuple-bf16"),
    pytest.param(16, "NHD", False, BF16, id="page16-nhd-bf16"),
]


@pytest.mark.parametrize(("page_size", "layout", "as_tuple", "dtype"), APPEND_CASES)
def test_append_writes_each_row_in_place(rng, page_size, layout, as_tuple, dtype):
    hq, hkv, d = 3, 2, 16
    old, new = np.array([7, 0, 16, 3, 41]), np.array([2, 5, 1, 30, 0])
    seq = old + new
    num_pages = sum(-(-n // page_size) for n in seq) + 4
    indices, indptr, last = make_table(rng, seq, page_size, num_pages)
    shape = (num_pages, page_size, hkv, d) if layout == "NHD" else (num_pages, hkv, page_size, d)
    if as_tuple:
        cache = (rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
        ck, cv = cache
    else:
        cache = rng.standard_normal((num_pages, 2, *shape[1:])).astype(dtype)
        ck, cv = cache[:, 0], cache[:, 1]
    want_k, want_v = ck.copy(), cv.copy()
    # k and v are slices of a fused qkv tensor (strided rows), plus 3 padding rows
    nnz = int(new.sum()) + 3
    qkv = rng.standard_normal((nnz, hq + 2 * hkv, d)).astype(dtype)
    k, v = qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    append_indptr = np.concatenate([[0], np.cumsum(new)]).astype(I32)
    bidx, pos = cuinfer.get_batch_indices_positions(append_indptr, cuinfer.get_seq_lens(indptr, last, page_size), nnz)
    expected_append(want_k, want_v, k, v, bidx, pos, indices, indptr, page_size, layout)
    out = cuinfer.append_paged_kv_cache(k, v, bidx, pos, cache, indices, indptr, last, kv_layout=layout)
    assert out is None
    np.testing.assert_array_equal(ck.view(np.uint16), want_k.view(np.uint16))  # bit-exact, in the given arrays
    np.testing.assert_array_equal(cv.view(np.uint16), want_v.view(np.uint16))


def test_append_into_a_strided_cache_view(rng):
    """A cache that is a view (every other page of a bigger array) is written through, not copied."""
    big = np.zeros((12, 2, 4, 1, 8), np.float16)
    cache = big[::2]
    indices, indptr, last = make_table(rng, [9], 4, 6)
    k = rng.standard_normal((9, 1, 8)).astype(np.float16)
    bidx, pos = np.zeros(9, I32), np.arange(9, dtype=I32)
    cuinfer.append_paged_kv_cache(k, k, bidx, pos, cache, indices, indptr, last)
    for t in range(9):
        np.testing.assert_array_equal(big[2 * indices[t // 4], 0, t % 4], k[t])
    assert not big[1::2].any()


def _append_inputs(rng, dtype=np.float16, layout="NHD"):
    """A valid append of 6 rows into two requests over 5 pages of 4 slots."""
    cache = np.zeros((5, 2, 4, 2, 8), dtype)
    k = rng.standard_normal((6, 2, 8)).astype(dtype)
    indices, indptr, last = np.array([4, 0, 2], I32), np.array([0, 2, 3], I32), np.array([3, 2], I32)
    bidx, pos = np.array([0, 0, 0, 1, 1, -1], I32), np.array([4, 5, 6, 0, 1, -1], I32)
    return dict(append_key=k, append_value=k.copy(), batch_indices=bidx, positions=pos, paged_kv_cache=cache,
                kv_indices=indices, kv_indptr=indptr, kv_last_page_len=last, kv_layout=layout)  # fmt: skip


def test_append_inputs_are_valid(rng):
    args = _append_inputs(rng)
    cuinfer.append_paged_kv_cache(**args)
    cache, k = args["paged_kv_cache"], args["append_key"]
    np.testing.assert_array_equal(cache[2, 0, 0], k[3])  # request 1 (page 2), position 0
    np.testing.assert_array_equal(cache[0, 0, 2], k[2])  # request 0 (pages 4, 0), position 6


def _edit(**changes):
    def make(rng):
        args = _append_inputs(rng)
        for key, fn in changes.items():
            args[key] = fn(args.get(key))
        return args

    return make


APPEND_ERRORS = [
    (_edit(kv_layout=lambda _: "NDH"), ValueError, "kv_layout must be 'NHD' or 'HND' but is 'NDH'"),
    (_edit(paged_kv_cache=lambda c: c[:, 0]), ValueError, "paged_kv_cache must have 5 dimensions but has 4"),
    (_edit(paged_kv_cache=lambda c: np.concatenate([c, c], axis=1)), ValueError,
     r"paged_kv_cache must have shape \(\*, 2, \*, \*, \*\) but has shape \(5, 4, 4, 2, 8\)"),
    (_edit(paged_kv_cache=lambda c: (c[:, 0], c[:, 1], c[:, 1])), ValueError,
     "paged_kv_cache must be one 5-D array or a .k_cache, v_cache. tuple but is a tuple of 3 arrays"),
    (_edit(paged_kv_cache=lambda c: (c[:, 0], c[:, 1, :3])), ValueError,
     "k_cache and v_cache must have the same num_pages, page_size and num_kv_heads"),
    (_edit(paged_kv_cache=lambda c: (c[:, 0], c[:, 1, 0])), ValueError, "v_cache must have 4 dimensions but has 3"),
    (_edit(paged_kv_cache=lambda c: c.astype(np.float32)), ValueError,
     "paged_kv_cache must have dtype one of float16, bfloat16, float8_e4m3fn, float8_e5m2 but has dtype float32"),
    # fp8 caches: the format of uint8 codes, the scales
    (_edit(paged_kv_cache=lambda c: c.view(np.uint8)[..., ::2]), ValueError,
     "paged_kv_cache is uint8: say which fp8 format it holds"),
    (_edit(paged_kv_cache=lambda c: c.view(np.uint8)[..., ::2], kv_dtype=lambda _: "float16"), ValueError,
     "paged_kv_cache is uint8 but kv_dtype=float16"),
    (_edit(kv_dtype=lambda _: "float8_e4m3fn"), ValueError,
     "paged_kv_cache has dtype float16 but kv_dtype=float8_e4m3fn"),
    (_edit(kv_dtype=lambda _: "uint8"), ValueError, "kv_dtype=uint8: say which fp8 format"),
    (_edit(k_scale=lambda _: 0.5), ValueError,
     r"k_scale = 0.5 but the cache is float16 \(rows are copied bit-exact\)"),
    (_edit(paged_kv_cache=lambda c: c.astype(ml_dtypes.float8_e4m3fn), append_key=lambda k: k.astype(FP8),
           append_value=lambda v: v.astype(FP8), v_scale=lambda _: 2.0), ValueError,
     r"v_scale = 2.0 but the rows are already float8_e4m3fn"),
    (_edit(paged_kv_cache=lambda c: c.astype(ml_dtypes.float8_e4m3fn), k_scale=lambda _: 0.0), ValueError,
     "k_scale must be a finite, nonzero number"),
    (_edit(paged_kv_cache=lambda c: c.astype(ml_dtypes.float8_e4m3fn), v_scale=lambda _: float("inf")), ValueError,
     "v_scale must be a finite, nonzero number"),
    (_edit(paged_kv_cache=lambda c: c.astype(ml_dtypes.float8_e4m3fn), k_scale=lambda _: 1e-60), ValueError,
     "k_scale = 1e-60 is outside float32's range"),
    (_edit(paged_kv_cache=lambda c: c.astype(ml_dtypes.float8_e4m3fn), k_scale=lambda _: np.ones(2)), ValueError,
     "k_scale must be a number but is an array of shape .2,.: append_paged_kv_cache quantises with one scale"),
    (_edit(paged_kv_cache=lambda c: c.astype(ml_dtypes.float8_e4m3fn), k_scale=lambda _: "0.5"), TypeError,
     "k_scale must be a number .or None for 1.0. but is '0.5'"),
    (_edit(paged_kv_cache=lambda c: c.astype(ml_dtypes.float8_e4m3fn), append_key=lambda k: k.astype(E5M2),
           append_value=lambda v: v.astype(E5M2)), ValueError,
     "paged_kv_cache and append_key must have the same dtype but paged_kv_cache is float8_e4m3fn and append_key is "
     "float8_e5m2"),
    (_edit(paged_kv_cache=lambda c: c.astype(ml_dtypes.float8_e4m3fn), append_value=lambda v: v.astype(BF16)),
     ValueError, "append_key and append_value must have the same dtype"),
    (_edit(append_key=lambda k: k[:, 0]), ValueError, "append_key must have 3 dimensions but has 2"),
    (_edit(append_key=lambda k: k[:, :1]), ValueError,
     r"append_key must have shape \(6, 2, 8\) but has shape \(6, 1, 8\)"),
    (_edit(append_value=lambda v: v[:5]), ValueError,
     r"append_value must have shape \(6, 2, 8\) but has shape \(5, 2, 8\)"),
    (_edit(append_key=lambda k: k.astype(BF16)), ValueError, "paged_kv_cache and append_key must have the same dtype"),
    (_edit(append_key=lambda k: np.repeat(k, 2, axis=2)[..., ::2]), ValueError,
     "append_key must have a contiguous last dimension"),
    (_edit(paged_kv_cache=lambda c: np.zeros((5, 2, 4, 2, 4), c.dtype), append_key=lambda k: k[..., :4],
           append_value=lambda v: v[..., :4]), ValueError, "head_dim must be a multiple of 8"),
    (_edit(batch_indices=lambda b: b.astype(np.int8)), ValueError,
     "batch_indices must have dtype int32 or int64 but has dtype int8"),
    (_edit(kv_indices=lambda i: i.astype(np.int64) + 2**32), ValueError, "kv_indices must fit in int32"),
    (_edit(positions=lambda p: p[:5]), ValueError, r"positions must have shape \(6,\) but has shape \(5,\)"),
    (_edit(positions=lambda p: np.repeat(p, 2)[::2]), ValueError, "positions must be contiguous but has stride 2"),
    (_edit(kv_indptr=lambda p: p[:0]), ValueError, "kv_indptr must have batch_size \\+ 1 >= 1 entries but is empty"),
    (_edit(kv_last_page_len=lambda p: p[:1]), ValueError,
     r"kv_last_page_len must have shape \(2,\) but has shape \(1,\)"),
    (_edit(paged_kv_cache=lambda c: np.lib.stride_tricks.as_strided(c, writeable=False)), ValueError,
     "paged_kv_cache must be writable but it is read-only"),
    # the index values
    (_edit(kv_indptr=lambda p: p + 1), ValueError, "kv_indptr must start at 0"),
    (_edit(kv_indptr=lambda p: np.array([0, 2, 4], I32)), ValueError,
     "kv_indptr must end at most at len.kv_indices. = 3 but ends at 4"),
    (_edit(kv_indices=lambda i: np.array([4, 5, 2], I32)), ValueError,
     r"kv_indices must name pages of the cache \(0 <= page < num_pages = 5\) but kv_indices\[1\] = 5"),
    (_edit(kv_last_page_len=lambda p: np.array([0, 2], I32)), ValueError,
     r"kv_last_page_len must be in \[1, page_size = 4\] for a request with pages but kv_last_page_len\[0\] = 0"),
    (_edit(kv_last_page_len=lambda p: np.array([3, 5], I32)), ValueError, r"kv_last_page_len\[1\] = 5"),
    (_edit(batch_indices=lambda b: np.array([0, 0, 0, 2, 1, -1], I32)), ValueError,
     r"batch_indices must be in \[0, batch_size = 2\) \(or -1 for a padding row, which is skipped\) but "
     r"batch_indices\[3\] = 2"),
    (_edit(batch_indices=lambda b: np.array([0, 0, 0, 1, 1, -2], I32)), ValueError, r"batch_indices\[5\] = -2"),
    (_edit(positions=lambda p: np.array([4, 5, 7, 0, 1, -1], I32)), ValueError,
     r"positions must be in \[0, kv_len\) of their request but positions\[2\] = 7 and request 0 \(batch_indices\[2\]\) "
     r"has kv_len 7"),
    (_edit(positions=lambda p: np.array([4, 5, 6, -1, 1, -1], I32)), ValueError, r"positions\[3\] = -1"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "exc", "match"), APPEND_ERRORS, ids=[f"e{i}" for i in range(len(APPEND_ERRORS))])
def test_append_errors(rng, make, exc, match):
    args = make(rng)
    cache = args["paged_kv_cache"]
    before = [c.copy() for c in (cache if isinstance(cache, tuple) else (cache,))]
    with pytest.raises(exc, match=match):
        cuinfer.append_paged_kv_cache(**args)
    for c, b in zip(cache if isinstance(cache, tuple) else (cache,), before, strict=True):
        np.testing.assert_array_equal(c.view(np.uint8), b.view(np.uint8))  # nothing written before the error


# ---- RoPE ----------------------------------------------------------------------------------------------------------


def exact_rope(x, pos, rotary_dim, interleave, freqs):
    """RoPE as complex multiplication of each dimension pair, float64 (independent of the reference's slicing)."""
    r, half = rotary_dim, rotary_dim // 2
    x = x.astype(np.float64)
    z = x[..., 0:r:2] + 1j * x[..., 1:r:2] if interleave else x[..., :half] + 1j * x[..., half:r]
    z = z * np.exp(1j * np.asarray(pos, np.float64)[:, None, None] * freqs[None, None, :])
    out = x.copy()
    if interleave:
        out[..., 0:r:2], out[..., 1:r:2] = z.real, z.imag
    else:
        out[..., :half], out[..., half:r] = z.real, z.imag
    return out


def plain_freqs(rotary_dim, scale, theta):
    return np.array([theta ** (-2.0 * i / rotary_dim) / scale for i in range(rotary_dim // 2)])


def llama31_freqs(rotary_dim, scale, theta, low, high, old):
    """Meta's reference loop (llama-models, apply_scaling), in float64."""
    out = []
    for i in range(rotary_dim // 2):
        freq = theta ** (-2.0 * i / rotary_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(freq)
        elif wavelen > old / low:
            out.append(freq / scale)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / scale + smooth * freq)
    return np.array(out)


def assert_rounded_once(got, exact):
    """got (float16 / bfloat16) is exact rounded to the nearest representable value (within half an ulp)."""
    ulp_bits = 10 if got.dtype == np.float16 else 7
    g = got.astype(np.float64)
    tol = np.maximum(np.abs(exact), 2.0**-14) * 2.0 ** -(ulp_bits + 1) * (1 + 1e-6)
    bad = np.abs(g - exact) > tol
    assert not bad.any(), f"{bad.sum()} values off by more than half an ulp, e.g. {g[bad][:3]} vs {exact[bad][:3]}"


ROPE_CASES = [
    pytest.param(64, None, False, 1.0, 1e4, np.float16, id="d64-neox-fp16"),
    pytest.param(128, None, True, 1.0, 5e5, BF16, id="d128-interleave-bf16"),
    pytest.param(128, 64, False, 8.0, 1e4, np.float16, id="d128-rot64-scaled-fp16"),
    pytest.param(96, 32, True, 2.0, 1e6, BF16, id="d96-rot32-interleave-bf16"),
    pytest.param(80, 20, False, 1.0, 1e4, np.float16, id="d80-rot20-neox-fp16"),
    pytest.param(256, 128, False, 1.0, 1e4, BF16, id="d256-rot128-bf16"),
]


@pytest.mark.parametrize(("head_dim", "rotary_dim", "interleave", "scale", "theta", "dtype"), ROPE_CASES)
def test_apply_rope_pos_ids(rng, head_dim, rotary_dim, interleave, scale, theta, dtype):
    nnz = 37
    q = rng.standard_normal((nnz, 5, head_dim)).astype(dtype)
    k = rng.standard_normal((nnz, 2, head_dim)).astype(dtype)
    pos = np.concatenate([rng.integers(0, 1_000_000, nnz - 2), [0, 999_999]]).astype(np.int64)
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=scale, rope_theta=theta)
    qr, kr = cuinfer.apply_rope_pos_ids(q, k, pos, **opts)
    assert qr.dtype == q.dtype and kr.dtype == k.dtype and qr.shape == q.shape and kr.shape == k.shape
    r = rotary_dim or head_dim
    f = plain_freqs(r, scale, theta)
    assert_rounded_once(qr, exact_rope(q, pos, r, interleave, f))
    assert_rounded_once(kr, exact_rope(k, pos, r, interleave, f))
    np.testing.assert_array_equal(qr[..., r:].view(np.uint16), q[..., r:].view(np.uint16))  # copied unchanged
    # in place: the same values written into q and k
    q2, k2 = q.copy(), k.copy()
    assert cuinfer.apply_rope_pos_ids_inplace(q2, k2, pos.astype(I32), **opts) is None
    np.testing.assert_array_equal(q2.view(np.uint16), qr.view(np.uint16))
    np.testing.assert_array_equal(k2.view(np.uint16), kr.view(np.uint16))


def test_apply_rope_ragged_equals_pos_ids(rng):
    lens = [5, 0, 13, 1, 0, 30]
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(I32)
    offsets = np.array([0, 7, 100, 999_990, 3, 12], I32)
    nnz = int(indptr[-1])
    q = rng.standard_normal((nnz, 4, 64)).astype(np.float16)
    k = rng.standard_normal((nnz, 1, 64)).astype(np.float16)
    pos = np.concatenate([offsets[b] + np.arange(n) for b, n in enumerate(lens)])
    for interleave in (False, True):
        got = cuinfer.apply_rope(q, k, indptr, offsets, interleave=interleave, rotary_dim=32)
        want = cuinfer.apply_rope_pos_ids(q, k, pos.astype(I32), interleave=interleave, rotary_dim=32)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.view(np.uint16), w.view(np.uint16))
        q2, k2 = q.copy(), k.copy()
        cuinfer.apply_rope_inplace(q2, k2, indptr, offsets, interleave=interleave, rotary_dim=32)
        np.testing.assert_array_equal(q2.view(np.uint16), got[0].view(np.uint16))


@pytest.mark.parametrize(
    ("scale", "theta", "low", "high", "old", "rotary_dim"),
    [
        pytest.param(8.0, 5e5, 1.0, 4.0, 8192, 128, id="llama31-defaults"),
        pytest.param(32.0, 5e5, 1.0, 4.0, 8192, 64, id="llama32-scale32-rot64"),
        pytest.param(4.0, 1e4, 2.0, 3.0, 512, 96, id="narrow-band"),
    ],
)
def test_llama31_frequencies(rng, scale, theta, low, high, old, rotary_dim):
    f = llama31_freqs(rotary_dim, scale, theta, low, high, old)
    ref = cuinfer.reference.positional.rope_freqs
    got = ref(rotary_dim, rope_scale=scale, rope_theta=theta, llama31=(low, high, old))
    np.testing.assert_allclose(got, f, rtol=1e-14)
    wavelen = 2 * np.pi * theta ** (2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    assert (wavelen < old / high).any() or (wavelen > old / low).any()  # the bands are exercised
    nnz = 29
    q = rng.standard_normal((nnz, 4, 128)).astype(BF16)
    k = rng.standard_normal((nnz, 2, 128)).astype(BF16)
    pos = rng.integers(0, 1_000_000, nnz).astype(I32)
    opts = dict(rotary_dim=rotary_dim, rope_scale=scale, rope_theta=theta, low_freq_factor=low,
                high_freq_factor=high, old_context_len=old)  # fmt: skip
    qr, kr = cuinfer.apply_llama31_rope_pos_ids(q, k, pos, **opts)
    assert_rounded_once(qr, exact_rope(q, pos, rotary_dim, False, f))
    assert_rounded_once(kr, exact_rope(k, pos, rotary_dim, False, f))
    indptr, offsets = np.array([0, 10, nnz], I32), np.array([5, 70_000], I32)
    qr2, kr2 = cuinfer.apply_llama31_rope(q, k, indptr, offsets, interleave=True, **opts)
    pos2 = np.concatenate([5 + np.arange(10), 70_000 + np.arange(nnz - 10)])
    assert_rounded_once(qr2, exact_rope(q, pos2, rotary_dim, True, f))
    q3, k3 = q.copy(), k.copy()
    cuinfer.apply_llama31_rope_inplace(q3, k3, indptr, offsets, interleave=True, **opts)
    np.testing.assert_array_equal(k3.view(np.uint16), kr2.view(np.uint16))
    q4, k4 = q.copy(), k.copy()
    cuinfer.apply_llama31_rope_pos_ids_inplace(q4, k4, pos, **opts)
    np.testing.assert_array_equal(q4.view(np.uint16), qr.view(np.uint16))


def test_llama31_with_scale_one_is_plain_rope(rng):
    q = rng.standard_normal((9, 2, 64)).astype(np.float16)
    pos = rng.integers(0, 50_000, 9).astype(I32)
    a = cuinfer.apply_llama31_rope_pos_ids(q, q, pos, rope_scale=1.0, rope_theta=1e4)
    b = cuinfer.apply_rope_pos_ids(q, q, pos, rope_scale=1.0, rope_theta=1e4)
    np.testing.assert_array_equal(a[0].view(np.uint16), b[0].view(np.uint16))


def vllm_cos_sin_cache(max_pos, rotary_dim, theta):
    """vLLM's RotaryEmbedding._compute_cos_sin_cache: float32 [max_pos, rotary_dim], cos half then sin half."""
    inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    freqs = np.outer(np.arange(max_pos, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(freqs), np.sin(freqs)], axis=-1).astype(np.float32)


@pytest.mark.parametrize(
    ("head_size", "rotary_dim", "is_neox", "two_d", "dtype"),
    [
        pytest.param(128, 128, True, True, BF16, id="d128-neox-2d-bf16"),
        pytest.param(64, 32, False, True, np.float16, id="d64-rot32-gptj-2d-fp16"),
        pytest.param(96, 64, True, False, np.float16, id="d96-rot64-neox-3d-fp16"),
    ],
)
def test_apply_rope_with_cos_sin_cache(rng, head_size, rotary_dim, is_neox, two_d, dtype):
    nnz, hq, hk, max_pos = 21, 4, 2, 4096
    table = vllm_cos_sin_cache(max_pos, rotary_dim, 1e4)
    pos = rng.integers(0, max_pos, nnz)
    q3 = rng.standard_normal((nnz, hq, head_size)).astype(dtype)
    k3 = rng.standard_normal((nnz, hk, head_size)).astype(dtype)
    q, k = (q3.reshape(nnz, -1), k3.reshape(nnz, -1)) if two_d else (q3, k3)
    qo, ko = cuinfer.apply_rope_with_cos_sin_cache(pos, q, k, head_size, table, is_neox=is_neox)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == q.dtype
    # angles from the float32 table: within half an ulp of the exact rotation by those rounded cos / sin
    half = rotary_dim // 2
    cos, sin = table[pos, :half].astype(np.float64), table[pos, half:].astype(np.float64)
    for x, got in ((q3, qo), (k3, ko)):
        xf = x.astype(np.float64)
        want = xf.copy()
        first = slice(0, half) if is_neox else slice(0, rotary_dim, 2)
        second = slice(half, rotary_dim) if is_neox else slice(1, rotary_dim, 2)
        a, b, c, s = xf[..., first], xf[..., second], cos[:, None], sin[:, None]
        want[..., first], want[..., second] = a * c - b * s, b * c + a * s
        assert_rounded_once(got.reshape(x.shape), want)
    q2, k2 = q.copy(), k.copy()
    assert cuinfer.apply_rope_with_cos_sin_cache_inplace(pos.astype(I32), q2, k2, head_size, table, is_neox) is None
    np.testing.assert_array_equal(q2.view(np.uint16), qo.view(np.uint16))
    np.testing.assert_array_equal(k2.view(np.uint16), ko.view(np.uint16))


def test_strided_q_and_k_from_a_fused_qkv(rng):
    qkv = rng.standard_normal((11, 4 + 2 + 2, 64)).astype(np.float16)
    q, k = qkv[:, :4], qkv[:, 4:6]
    pos = np.arange(11, dtype=I32) * 1000
    qr, kr = cuinfer.apply_rope_pos_ids(q, k, pos)
    qr2, kr2 = cuinfer.apply_rope_pos_ids(q.copy(), k.copy(), pos)
    np.testing.assert_array_equal(qr.view(np.uint16), qr2.view(np.uint16))
    cuinfer.apply_rope_pos_ids_inplace(q, k, pos)  # writes through the views into qkv
    np.testing.assert_array_equal(qkv[:, 4:6].view(np.uint16), kr2.view(np.uint16))


def _rope_args(rng):
    q = rng.standard_normal((6, 4, 64)).astype(np.float16)
    k = rng.standard_normal((6, 2, 64)).astype(np.float16)
    return q, k


ROPE_ERRORS = [
    (lambda q, k: cuinfer.apply_rope_pos_ids(q[:, 0], k, np.arange(6, dtype=I32)),
     "q must have 3 dimensions but has 2"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q.astype(np.float32), k, np.arange(6, dtype=I32)),
     "q must have dtype float16 or bfloat16 but has dtype float32"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k.astype(BF16), np.arange(6, dtype=I32)),
     "q and k must have the same dtype"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k[..., :32], np.arange(6, dtype=I32)),
     "q and k must have the same nnz .dim 0. and head_dim"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k[:5], np.arange(6, dtype=I32)), "q and k must have the same nnz"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k, np.arange(6, dtype=I32), rotary_dim=33),
     r"rotary_dim must be an even integer in \[2, head_dim = 64\] but is 33; pass None for the full head dim"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k, np.arange(6, dtype=I32), rotary_dim=66), "but is 66"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k, np.arange(6, dtype=I32), rotary_dim=0), "but is 0"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k, np.arange(6, dtype=I32), rope_scale=0),
     "rope_scale must be a finite number > 0 but is 0"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k, np.arange(6, dtype=I32), rope_theta=-1.0), "rope_theta must be"),
    (lambda q, k: cuinfer.apply_llama31_rope_pos_ids(q, k, np.arange(6, dtype=I32), low_freq_factor=4.0),
     "high_freq_factor must be greater than low_freq_factor but they are 4.0 and 4.0"),
    (lambda q, k: cuinfer.apply_llama31_rope_pos_ids(q, k, np.arange(6, dtype=I32), old_context_len=0),
     "old_context_len must be a finite number > 0"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k, np.arange(5, dtype=I32)), r"pos_ids must have shape \(6,\)"),
    (lambda q, k: cuinfer.apply_rope_pos_ids(q, k, np.arange(6.0)),
     "pos_ids must have dtype int32 or int64 but has dtype float64"),
    (lambda q, k: cuinfer.apply_rope(q, k, np.zeros(0, I32), np.zeros(0, I32)),
     "indptr must have batch_size \\+ 1 >= 2 entries for q's 6 rows but has 0"),
    (lambda q, k: cuinfer.apply_rope(q, k, np.array([0, 6], I32), np.array([0, 0], I32)),
     r"offsets must have shape \(1,\) but has shape \(2,\)"),
    (lambda q, k: cuinfer.apply_rope(q, k, np.array([0, 5], I32), np.array([0], I32)), "indptr must end at 6"),
    (lambda q, k: cuinfer.apply_rope(q, k, np.array([0, 6], np.float32), np.array([0], I32)),
     "indptr must have dtype int32 or int64 but has dtype float32"),
    (lambda q, k: cuinfer.apply_rope(q, k, np.array([0, 6]), np.array([2**40])), "offsets must fit in int32"),
    (lambda q, k: cuinfer.apply_rope_pos_ids_inplace(np.lib.stride_tricks.as_strided(q, writeable=False), k,
                                                     np.arange(6, dtype=I32)), "q must be writable"),
    (lambda q, k: cuinfer.apply_rope_with_cos_sin_cache(np.arange(6), q.reshape(6, -1), k.reshape(6, -1), 64,
                                                        np.zeros((10, 64), np.float16)),
     "cos_sin_cache must have dtype float32 but has dtype float16"),
    (lambda q, k: cuinfer.apply_rope_with_cos_sin_cache(np.arange(6), q.reshape(6, -1), k.reshape(6, -1), 64,
                                                        np.zeros((10, 66), np.float32)),
     r"cos_sin_cache.shape\[1\] \(the rotary dim\) must be an even integer in \[2, head_dim = 64\] but is 66"),
    (lambda q, k: cuinfer.apply_rope_with_cos_sin_cache(np.arange(6), q.reshape(6, -1), k.reshape(6, -1), 48,
                                                        np.zeros((10, 32), np.float32)),
     r"query must have num_heads \* head_size columns \(head_size = 48\) but has shape \(6, 256\)"),
    (lambda q, k: cuinfer.apply_rope_with_cos_sin_cache(np.array([0, 1, 2, 3, 4, 10]), q.reshape(6, -1),
                                                        k.reshape(6, -1), 64, np.zeros((10, 32), np.float32)),
     r"positions must be in \[0, max_position = 10\) \(the rows of cos_sin_cache\) but positions\[5\] = 10"),
    (lambda q, k: cuinfer.apply_rope_with_cos_sin_cache(np.arange(6), q.reshape(6, -1), k.reshape(6, -1), 64,
                                                        np.zeros((10, 2, 32), np.float32)),
     "cos_sin_cache must have 2 dimensions but has 3"),
    (lambda q, k: cuinfer.apply_rope_with_cos_sin_cache(np.arange(6), q.reshape(6, -1), k.reshape(6, -1), True,
                                                        np.zeros((10, 32), np.float32)),
     "head_size must be an integer >= 2 but is True"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "match"), ROPE_ERRORS, ids=[f"e{i}" for i in range(len(ROPE_ERRORS))])
def test_rope_errors(rng, call, match):
    q, k = _rope_args(rng)
    q0 = q.copy()
    with pytest.raises(ValueError, match=match):
        call(q, k)
    np.testing.assert_array_equal(q.view(np.uint16), q0.view(np.uint16))


# ---- packbits ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 4095, 4096, 4097, 70_001])
@pytest.mark.parametrize("bitorder", ["little", "big"])
def test_packbits_matches_numpy(rng, n, bitorder):
    x = rng.random(n) < 0.5
    got = cuinfer.packbits(x, bitorder=bitorder)
    assert got.dtype == np.uint8 and got.shape == ((n + 7) // 8,)
    np.testing.assert_array_equal(got, np.packbits(x, bitorder=bitorder))


def test_packbits_flattens_row_major(rng):
    x = rng.random((5, 13)) < 0.3
    np.testing.assert_array_equal(cuinfer.packbits(x), np.packbits(x.ravel(), bitorder="little"))


@pytest.mark.parametrize("bitorder", ["little", "big"])
def test_segment_packbits(rng, bitorder):
    seg = [0, 3, 8, 1, 0, 77, 16, 9]
    indptr = np.concatenate([[0], np.cumsum(seg)]).astype(I32)
    x = rng.random(int(indptr[-1]) + 4) < 0.5  # trailing elements outside every segment
    packed, new_indptr = cuinfer.segment_packbits(x, indptr, bitorder=bitorder)
    assert packed.dtype == np.uint8 and new_indptr.dtype == np.int32
    np.testing.assert_array_equal(new_indptr, np.concatenate([[0], np.cumsum([(s + 7) // 8 for s in seg])]))
    for i in range(len(seg)):
        want = np.packbits(x[indptr[i] : indptr[i + 1]], bitorder=bitorder)
        np.testing.assert_array_equal(packed[new_indptr[i] : new_indptr[i + 1]], want)


PACK_ERRORS = [
    (lambda: cuinfer.packbits(np.ones(8, np.uint8)), "x must have dtype bool but has dtype uint8"),
    (lambda: cuinfer.packbits(np.ones(16, bool)[::2]), "x must be contiguous"),
    (lambda: cuinfer.packbits(np.ones(8, bool), bitorder="middle"), "bitorder must be 'little' or 'big'"),
    (lambda: cuinfer.segment_packbits(np.ones((2, 4), bool), np.array([0, 8], I32)), "x must have 1 dimensions"),
    (lambda: cuinfer.segment_packbits(np.ones(8, bool), np.array([0, 9], I32)),
     r"indptr must end at most at len\(x\) = 8 but ends at 9"),
    (lambda: cuinfer.segment_packbits(np.ones(8, bool), np.array([0, 5, 3], I32)), "indptr must be non-decreasing"),
    (lambda: cuinfer.segment_packbits(np.ones(8, bool), np.array([2, 5], I32)), "indptr must start at 0"),
    (lambda: cuinfer.segment_packbits(np.ones(8, bool), np.zeros(0, I32)),
     "indptr must have num_segments \\+ 1 >= 1 entries but is empty"),
    (lambda: cuinfer.segment_packbits(np.ones(8, bool), np.array([0, 8], np.uint8)),
     "indptr must have dtype int32 or int64 but has dtype uint8"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "match"), PACK_ERRORS, ids=[f"e{i}" for i in range(len(PACK_ERRORS))])
def test_pack_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_int64_index_arrays_give_the_same_results(rng):
    """NumPy's default integer arrays (int64) are accepted wherever int32 is (the GPU narrows them on the device)."""
    append_indptr, seq = np.array([0, 2, 2, 5]), np.array([4, 1, 9])
    for got, want in zip(cuinfer.get_batch_indices_positions(append_indptr, seq, 7),
                         cuinfer.get_batch_indices_positions(append_indptr.astype(I32), seq.astype(I32), 7),
                         strict=True):  # fmt: skip
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cuinfer.get_seq_lens(np.array([0, 2, 2]), np.array([3, 0]), 4), [7, 0])
    x = rng.random(29) < 0.5
    packed, new_indptr = cuinfer.segment_packbits(x, np.array([0, 9, 9, 29]), bitorder="big")
    assert new_indptr.dtype == np.int32
    np.testing.assert_array_equal(packed, np.concatenate([np.packbits(x[:9]), np.packbits(x[9:])]))
    q = rng.standard_normal((7, 4, 64)).astype(np.float16)
    a = cuinfer.apply_rope(q, q[:, :2], np.array([0, 3, 7]), np.array([5, 0]), rotary_dim=32, interleave=True)
    b = cuinfer.apply_rope(q, q[:, :2], np.array([0, 3, 7], I32), np.array([5, 0], I32), rotary_dim=32, interleave=True)
    np.testing.assert_array_equal(a[0].view(np.uint16), b[0].view(np.uint16))
    args = _append_inputs(rng)
    args64 = {**args, "paged_kv_cache": args["paged_kv_cache"].copy()}
    for name in ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"):
        args64[name] = args[name].astype(np.int64)
    cuinfer.append_paged_kv_cache(**args)
    cuinfer.append_paged_kv_cache(**args64)
    np.testing.assert_array_equal(args["paged_kv_cache"].view(np.uint16), args64["paged_kv_cache"].view(np.uint16))
