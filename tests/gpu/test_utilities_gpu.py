"""The serving utilities on the GPU, over torch, JAX and CuPy: appends, index arrays and bit packing bit-exact against
the NumPy route (the CPU reference), RoPE within one rounding of the float64 reference (fp16: < 1e-3 relative,
bf16: one bf16 ulp). New outputs are allocated over a NaN-poisoned pool, so an element never written fails."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cuinfer
import cuinfer.reference.utilities

pytestmark = pytest.mark.gpu

I32 = np.int32
BF16 = ml_dtypes.bfloat16
DTYPES = {"fp16": np.float16, "bf16": BF16}


def _poison_pool(framework, nbytes: int = 64 << 20) -> None:
    """Fill the framework allocator's free blocks with NaN (0xff bytes for integers), so an output element the
    kernel never writes shows."""
    x = framework.asarray(np.full(nbytes // 4, np.nan, np.float32))
    del x
    if framework == "jax":  # JAX outputs are allocated by CuPy (interop.empty), so poison CuPy's pool too
        import cupy

        y = cupy.full(nbytes // 4, np.nan, cupy.float32)
        del y


def _module(x) -> str:
    return type(x).__module__.split(".")[0].replace("jaxlib", "jax")


def _same_framework(framework, x) -> None:
    assert _module(x) == _module(framework.asarray(np.zeros(1, np.float32))), f"output is a {type(x)}"


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint8)


# ---- index arrays --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch,pad", [pytest.param(1, 0, id="b1"), pytest.param(37, 3, id="b37-pad3"),
                                       pytest.param(300, 0, id="b300")])  # fmt: skip
def test_batch_indices_positions_and_seq_lens(framework, rng, batch, pad):
    page_size = 16
    append_lens = rng.integers(0, 50, batch)
    append_lens[rng.random(batch) < 0.2] = 0
    kv_lens = append_lens + rng.integers(0, 5000, batch)
    pages = -(-kv_lens // page_size)
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(I32)
    last = np.where(pages > 0, kv_lens - page_size * (pages - 1), 0).astype(I32)
    append_indptr = np.concatenate([[0], np.cumsum(append_lens)]).astype(I32)
    nnz = int(append_indptr[-1]) + pad
    want_lens = cuinfer.get_seq_lens(kv_indptr, last, page_size)
    want_b, want_p = cuinfer.get_batch_indices_positions(append_indptr, want_lens, nnz)
    _poison_pool(framework)
    lens = cuinfer.get_seq_lens(framework.asarray(kv_indptr), framework.asarray(last), page_size)
    _same_framework(framework, lens)
    np.testing.assert_array_equal(framework.to_numpy(lens), want_lens)
    b, p = cuinfer.get_batch_indices_positions(framework.asarray(append_indptr), lens, nnz)
    np.testing.assert_array_equal(framework.to_numpy(b), want_b)
    np.testing.assert_array_equal(framework.to_numpy(p), want_p)
    assert framework.to_numpy(b).dtype == np.int32


def test_index_arrays_of_an_empty_batch(framework):
    lens = cuinfer.get_seq_lens(framework.asarray(np.array([0], I32)), framework.asarray(np.zeros(0, I32)), 4)
    assert framework.to_numpy(lens).shape == (0,)
    b, p = cuinfer.get_batch_indices_positions(framework.asarray(np.array([0], I32)), lens, 5)
    np.testing.assert_array_equal(framework.to_numpy(b), [-1] * 5)
    np.testing.assert_array_equal(framework.to_numpy(p), [-1] * 5)


# ---- append_paged_kv_cache -----------------------------------------------------------------------------------------


def _append_case(rng, batch, page_size, layout, as_tuple, dtype, hkv, d, max_new=40):
    hq = 2 * hkv
    new = rng.integers(0, max_new, batch)
    seq = new + rng.integers(0, 200, batch)
    pages = -(-seq // page_size)
    num_pages = int(pages.sum()) + 7
    indices = rng.permutation(num_pages)[: int(pages.sum())].astype(I32)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(I32)
    last = np.where(pages > 0, seq - page_size * (pages - 1), 0).astype(I32)
    shape = (num_pages, page_size, hkv, d) if layout == "NHD" else (num_pages, hkv, page_size, d)
    if as_tuple:
        cache = (rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
    else:
        cache = rng.standard_normal((num_pages, 2, *shape[1:])).astype(dtype)
    nnz = int(new.sum()) + 3  # 3 padding rows
    qkv = rng.standard_normal((nnz, hq + 2 * hkv, d)).astype(dtype)
    append_indptr = np.concatenate([[0], np.cumsum(new)]).astype(I32)
    bidx, pos = cuinfer.get_batch_indices_positions(append_indptr, cuinfer.get_seq_lens(indptr, last, page_size), nnz)
    return qkv, hq, bidx, pos, cache, indices, indptr, last


APPEND_CASES = [
    pytest.param(7, 1, "NHD", False, "fp16", 2, 64, id="page1-nhd-fp16-d64"),
    pytest.param(13, 5, "HND", False, "bf16", 4, 128, id="page5-hnd-bf16-d128"),
    pytest.param(29, 16, "NHD", True, "bf16", 8, 128, id="page16-nhd-tuple-bf16"),
    pytest.param(5, 16, "HND", True, "fp16", 1, 256, id="page16-hnd-tuple-fp16-d256"),
    pytest.param(113, 16, "NHD", False, "fp16", 8, 128, id="page16-nhd-113req"),
]


@pytest.mark.parametrize(("batch", "page_size", "layout", "as_tuple", "dt", "hkv", "d"), APPEND_CASES)
def test_append_paged_kv_cache(framework, rng, batch, page_size, layout, as_tuple, dt, hkv, d):
    qkv, hq, bidx, pos, cache, indices, indptr, last = _append_case(
        rng, batch, page_size, layout, as_tuple, DTYPES[dt], hkv, d
    )
    k, v = qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    want = tuple(c.copy() for c in cache) if as_tuple else cache.copy()
    cuinfer.append_paged_kv_cache(k, v, bidx, pos, want, indices, indptr, last, kv_layout=layout)
    f = framework.asarray
    gqkv = f(qkv)
    gk, gv = gqkv[:, hq : hq + hkv], gqkv[:, hq + hkv :]  # strided slices of the fused tensor (JAX: copies)
    gcache = tuple(f(c) for c in cache) if as_tuple else f(cache)
    out = cuinfer.append_paged_kv_cache(gk, gv, f(bidx), f(pos), gcache, f(indices), f(indptr), f(last),
                                        kv_layout=layout)  # fmt: skip
    if framework == "jax":
        assert out is not None, "a JAX cache is immutable: the updated cache comes back"
        result = out
        before = tuple(framework.to_numpy(c) for c in (gcache if as_tuple else (gcache,)))
        for b, c in zip(before, cache if as_tuple else (cache,), strict=True):
            np.testing.assert_array_equal(_bits(b), _bits(c))  # the caller's JAX cache is untouched
    else:
        assert out is None
        result = gcache
    got = tuple(framework.to_numpy(c) for c in (result if as_tuple else (result,)))
    for g, w in zip(got, want if as_tuple else (want,), strict=True):
        np.testing.assert_array_equal(_bits(g), _bits(w))  # bit-exact, and nothing else in the cache moved


FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
APPEND_FP8_CASES = [
    pytest.param(9, 1, "NHD", False, "fp16", "e4m3", 2, 64, 0.5, 2.0, id="page1-nhd-fp16-e4m3"),
    pytest.param(11, 16, "HND", False, "bf16", "e4m3", 4, 128, 0.0173, 3.0, id="page16-hnd-bf16-e4m3"),
    pytest.param(7, 16, "NHD", True, "bf16", "e5m2", 8, 128, 1e-3, 0.37, id="page16-nhd-tuple-bf16-e5m2"),
    pytest.param(5, 1, "HND", True, "fp16", "e5m2", 1, 256, 0.25, 1.0, id="page1-hnd-tuple-fp16-e5m2"),
]


@pytest.mark.parametrize(
    ("batch", "page_size", "layout", "as_tuple", "dt", "fmt", "hkv", "d", "k_scale", "v_scale"), APPEND_FP8_CASES
)
def test_append_into_fp8_cache(framework, rng, batch, page_size, layout, as_tuple, dt, fmt, hkv, d, k_scale, v_scale):
    """16-bit rows quantised into an fp8 cache (CuPy: uint8 codes with kv_dtype) bit-exact against the NumPy route:
    scales != 1, values beyond the max finite (saturated), ties and subnormals among the random values."""
    qkv, hq, bidx, pos, cache, indices, indptr, last = _append_case(
        rng, batch, page_size, layout, as_tuple, DTYPES[dt], hkv, d
    )
    f8 = FP8[fmt]
    big = float(ml_dtypes.finfo(f8).max)
    scaled = qkv.astype(np.float32) * np.float32(big / 2 * min(k_scale, v_scale))  # |x| > 2: beyond max finite
    qkv = np.where(rng.random(qkv.shape) < 0.5, scaled, qkv.astype(np.float32) * 1e-3).astype(DTYPES[dt])
    qkv[0, hq : hq + 2, :4] = np.array([np.inf, -np.inf, 65504 if dt == "fp16" else 3e38, 0.0], np.float32).astype(
        DTYPES[dt]
    )  # infinities and a huge value saturate
    cache = tuple(c.astype(f8) for c in cache) if as_tuple else cache.astype(f8)
    k, v = qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    want = tuple(c.copy() for c in cache) if as_tuple else cache.copy()
    cuinfer.append_paged_kv_cache(k, v, bidx, pos, want, indices, indptr, last, kv_layout=layout, k_scale=k_scale,
                                  v_scale=v_scale)  # fmt: skip
    f = framework.asarray
    gqkv = f(qkv)
    gk, gv = gqkv[:, hq : hq + hkv], gqkv[:, hq + hkv :]
    gcache = tuple(f(c) for c in cache) if as_tuple else f(cache)
    kv_dtype = f8 if framework == "cupy" else None  # CuPy holds the cache as uint8 codes
    out = cuinfer.append_paged_kv_cache(gk, gv, f(bidx), f(pos), gcache, f(indices), f(indptr), f(last),
                                        kv_layout=layout, k_scale=k_scale, v_scale=v_scale,
                                        kv_dtype=kv_dtype)  # fmt: skip
    result = out if framework == "jax" else gcache
    got = tuple(framework.to_numpy(c) for c in (result if as_tuple else (result,)))
    for g, w in zip(got, want if as_tuple else (want,), strict=True):
        np.testing.assert_array_equal(_bits(g), _bits(w))
    codes = _bits(want[0] if as_tuple else want)
    assert np.isin(codes & 0x7F, [0x7E if fmt == "e4m3" else 0x7B]).any(), "the case saturates some values"


@pytest.mark.parametrize("rows", ["bf16", "e4m3"])
def test_append_large(framework, rng, rows):
    """4097 tokens of 8 heads x 128 into 16-token pages: many blocks, the grid-stride loop, every slot bit-exact.
    e4m3: fp8 rows into an fp8 cache, copied as they are (FlashInfer's fp8 append)."""
    if rows == "e4m3" and framework == "cupy":
        pytest.skip("CuPy holds fp8 rows as uint8, which are not read as fp8 rows: CuPy appends 16-bit rows")
    qkv, hq, bidx, pos, cache, indices, indptr, last = _append_case(rng, 64, 16, "NHD", False, BF16, 8, 128, 130)
    if rows == "e4m3":
        qkv, cache = (qkv.astype(np.float32) * 50).astype(FP8["e4m3"]), cache.astype(FP8["e4m3"])
    k, v = np.ascontiguousarray(qkv[:, hq : hq + 8]), np.ascontiguousarray(qkv[:, hq + 8 :])
    want = cache.copy()
    cuinfer.append_paged_kv_cache(k, v, bidx, pos, want, indices, indptr, last)
    f = framework.asarray
    gcache = f(cache)
    out = cuinfer.append_paged_kv_cache(f(k), f(v), f(bidx), f(pos), gcache, f(indices), f(indptr), f(last))
    np.testing.assert_array_equal(_bits(framework.to_numpy(out if framework == "jax" else gcache)), _bits(want))


def test_append_skips_out_of_range_rows_and_check_indices_names_them(framework, rng):
    if framework == "jax":
        pytest.skip("in-place semantics: covered on torch and CuPy")
    qkv, hq, bidx, pos, cache, indices, indptr, last = _append_case(rng, 9, 5, "NHD", False, np.float16, 2, 64)
    k, v = qkv[:, hq : hq + 2], qkv[:, hq + 2 :]
    bad_b, bad_p = bidx.copy(), pos.copy()
    bad_b[0], bad_p[1] = 9, 100_000  # past the batch, past the request's kv_len
    keep_b = bidx.copy()
    keep_b[:2] = -1
    want = cache.copy()
    cuinfer.append_paged_kv_cache(k, v, keep_b, pos, want, indices, indptr, last)
    f = framework.asarray
    gcache = f(cache)
    args = (f(k), f(v), f(bad_b), f(bad_p), gcache, f(indices), f(indptr), f(last))
    with pytest.raises(ValueError, match=r"batch_indices must be in \[0, batch_size = 9\)"):
        cuinfer.append_paged_kv_cache(*args, check_indices=True)
    np.testing.assert_array_equal(_bits(framework.to_numpy(gcache)), _bits(cache))  # raised before any launch
    cuinfer.append_paged_kv_cache(*args)  # the kernel skips both rows
    np.testing.assert_array_equal(_bits(framework.to_numpy(gcache)), _bits(want))


def test_append_rejects_misaligned_rows(framework, rng):
    if framework == "jax":
        pytest.skip("JAX slices are copies: always aligned")
    f = framework.asarray
    k = f(rng.standard_normal((4, 1, 72)).astype(np.float16))[:, :, 1:65]  # rows start 2 bytes off
    cache = f(np.zeros((2, 2, 4, 1, 64), np.float16))
    idx = f(np.zeros(4, I32))
    with pytest.raises(ValueError, match="append_key must have rows that start on 16-byte boundaries"):
        cuinfer.append_paged_kv_cache(k, k, idx, idx, cache, f(np.array([0], I32)), f(np.array([0, 1], I32)),
                                      f(np.array([4], I32)))  # fmt: skip


# ---- RoPE ----------------------------------------------------------------------------------------------------------


def _rope_partner(x: np.ndarray, rotary_dim: int, interleave: bool) -> np.ndarray:
    """The element each element of ``x`` [..., head_dim] turns with (0 in the pass-through dims >= rotary_dim)."""
    r = rotary_dim
    out = np.zeros(x.shape, np.float64)
    rot = x[..., :r].astype(np.float64)
    if interleave:
        out[..., 0:r:2], out[..., 1:r:2] = rot[..., 1::2], rot[..., 0::2]
    else:
        out[..., : r // 2], out[..., r // 2 : r] = rot[..., r // 2 :], rot[..., : r // 2]
    return out


def _check_rope(got: np.ndarray, exact: np.ndarray, x: np.ndarray, rotary_dim: int, interleave: bool) -> None:
    """Within 2^-10 of |exact| (fp16; bf16: 2^-7, one ulp) plus what the float32 arithmetic may lose where the
    rotation cancels: 2^-20 (|x| + |partner|), 16 float32 ulps of the inputs' magnitude (the products, the sum and
    the sine / cosine each round once; exact below 2^24 positions), plus fp16's subnormal spacing. Never NaN.

    A plain float32 angle would fail: at positions ~1e6 and frequency ~0.5 the angle (~5e5 rad) rounds to 2^-5, an
    error of ~1e-2 |partner|, beyond the 1e-3 |exact| + ~2e-6 allowed. The message names the worst element."""
    g = got.astype(np.float64)
    nan = np.argwhere(np.isnan(g))
    assert not nan.size, f"an output element was never written (NaN), first at index {tuple(nan[0])}"
    rel = 2.0**-10 if got.dtype == np.float16 else 2.0**-7
    xin, partner = x.astype(np.float64), _rope_partner(x, rotary_dim, interleave)
    tol = rel * np.abs(exact) + 2.0**-20 * (np.abs(xin) + np.abs(partner)) + 2.0**-24
    err = np.abs(g - exact)
    worst = np.unravel_index(np.argmax(err / tol), err.shape)
    assert err[worst] <= tol[worst], (
        f"element {tuple(int(i) for i in worst)}: got {g[worst]!r}, exact {exact[worst]!r} (error {err[worst]:.3e} > "
        f"tolerance {tol[worst]:.3e}); input {xin[worst]!r}, partner {partner[worst]!r}; "
        f"{int((err > tol).sum())} of {err.size} elements outside"
    )


ROPE_CASES = [
    pytest.param("pos32", 128, None, False, "fp16", id="pos32-d128-neox-fp16"),
    pytest.param("pos64", 128, 64, True, "bf16", id="pos64-d128-rot64-interleave-bf16"),
    pytest.param("ragged", 64, None, True, "fp16", id="ragged-d64-interleave-fp16"),
    pytest.param("ragged", 256, 128, False, "bf16", id="ragged-d256-rot128-bf16"),
    pytest.param("llama31", 128, None, False, "bf16", id="llama31-d128-bf16"),
    pytest.param("llama31-ragged", 128, 96, True, "fp16", id="llama31-ragged-rot96-interleave"),
    pytest.param("pos32", 80, 20, False, "fp16", id="pos32-d80-rot20-narrow"),
    pytest.param("pos32", 96, 24, False, "bf16", id="pos32-d96-rot24-narrow"),
]


def _rope_reference(kind, q, k, pos, opts):
    """The float64 reference (cuinfer.reference), with Llama 3.1's defaults for the llama31 kinds."""
    opts = dict(opts)
    if kind.startswith("llama31"):
        opts.update(rope_scale=8.0, rope_theta=5e5, llama31=(1.0, 4.0, 8192))
    return cuinfer.reference.apply_rope_pos_ids(q, k, pos, **opts)


def _rope_call(kind, q, k, pos, indptr, offsets, opts, inplace):
    llama = kind.startswith("llama31")
    ragged = kind.endswith("ragged")
    name = ("apply_llama31_rope" if llama else "apply_rope") + ("" if ragged else "_pos_ids")
    fn = getattr(cuinfer, name + ("_inplace" if inplace else ""))
    return fn(q, k, indptr, offsets, **opts) if ragged else fn(q, k, pos, **opts)


@pytest.mark.parametrize(("kind", "head_dim", "rotary_dim", "interleave", "dt"), ROPE_CASES)
@pytest.mark.parametrize("nnz", [pytest.param(1, id="nnz1"), pytest.param(1023, id="nnz1023")])
def test_rope(framework, rng, kind, head_dim, rotary_dim, interleave, dt, nnz):
    dtype = DTYPES[dt]
    hq, hk = 8, 2
    qkv = rng.standard_normal((nnz, hq + 2 * hk, head_dim)).astype(dtype)
    lens = rng.multinomial(nnz, np.ones(5) / 5)
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(I32)
    offsets = rng.integers(0, 1_000_000 - nnz, 5).astype(I32)
    pos = np.concatenate([offsets[b] + np.arange(n) for b, n in enumerate(lens)])
    pos = pos.astype(np.int64 if kind == "pos64" else I32)
    opts = dict(rotary_dim=rotary_dim, interleave=interleave)
    if not kind.startswith("llama31"):
        opts.update(rope_scale=2.0, rope_theta=5e5)
    q, k = qkv[:, :hq], qkv[:, hq : hq + hk]
    want = _rope_reference(kind, q, k, pos, opts)
    f = framework.asarray
    gqkv = f(qkv)
    gq, gk = gqkv[:, :hq], gqkv[:, hq : hq + hk]  # strided rows (JAX: copies)
    _poison_pool(framework)
    qr, kr = _rope_call(kind, gq, gk, f(pos), f(indptr), f(offsets), opts, False)
    _same_framework(framework, qr)
    r = rotary_dim or head_dim
    for got, w, x in ((qr, want[0], q), (kr, want[1], k)):
        g = framework.to_numpy(got)
        assert g.dtype == dtype and g.shape == x.shape
        _check_rope(g, w, x, r, interleave)
        np.testing.assert_array_equal(_bits(g[..., r:]), _bits(x[..., r:]))  # pass-through dims copied
    if framework != "jax":  # in place through the slices: q and k change, v does not
        _rope_call(kind, gq, gk, f(pos), f(indptr), f(offsets), opts, True)
        back = framework.to_numpy(gqkv)
        np.testing.assert_array_equal(_bits(back[:, :hq]), _bits(framework.to_numpy(qr)))
        np.testing.assert_array_equal(_bits(back[:, hq : hq + hk]), _bits(framework.to_numpy(kr)))
        np.testing.assert_array_equal(_bits(back[:, hq + hk :]), _bits(qkv[:, hq + hk :]))


def _cos_sin_cache(max_pos, rotary_dim, theta=1e4):
    inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    freqs = np.outer(np.arange(max_pos, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(freqs), np.sin(freqs)], axis=-1).astype(np.float32)


@pytest.mark.parametrize(
    ("head_size", "rotary_dim", "is_neox", "dt"),
    [
        pytest.param(128, 128, True, "bf16", id="d128-neox-bf16"),
        pytest.param(64, 32, False, "fp16", id="d64-rot32-gptj-fp16"),
        pytest.param(80, 40, True, "fp16", id="d80-rot40-neox-fp16"),
    ],
)
def test_rope_with_cos_sin_cache(framework, rng, head_size, rotary_dim, is_neox, dt):
    dtype = DTYPES[dt]
    nnz, hq, hk, max_pos = 517, 8, 1, 8192
    table = _cos_sin_cache(max_pos, rotary_dim)
    pos = rng.integers(0, max_pos, nnz)
    q = rng.standard_normal((nnz, hq * head_size)).astype(dtype)
    k = rng.standard_normal((nnz, hk * head_size)).astype(dtype)
    ref = cuinfer.reference.utilities.rope_cos_sin
    want = [ref(x.reshape(nnz, -1, head_size), pos, table, interleave=not is_neox).reshape(x.shape) for x in (q, k)]
    f = framework.asarray
    _poison_pool(framework)
    qo, ko = cuinfer.apply_rope_with_cos_sin_cache(f(pos), f(q), f(k), head_size, f(table), is_neox)
    for got, w, x in ((qo, want[0], q), (ko, want[1], k)):
        g = framework.to_numpy(got)
        assert g.shape == w.shape
        heads = x.reshape(nnz, -1, head_size)
        _check_rope(g.reshape(heads.shape), w.reshape(heads.shape), heads, rotary_dim, not is_neox)
    if framework != "jax":
        gq, gk = f(q), f(k)
        cuinfer.apply_rope_with_cos_sin_cache_inplace(f(pos.astype(I32)), gq, gk, head_size, f(table), is_neox)
        np.testing.assert_array_equal(_bits(framework.to_numpy(gq)), _bits(framework.to_numpy(qo)))
        np.testing.assert_array_equal(_bits(framework.to_numpy(gk)), _bits(framework.to_numpy(ko)))


def test_rope_cos_sin_cache_position_outside_the_table_gives_nan(framework, rng):
    table = _cos_sin_cache(16, 64)
    q = rng.standard_normal((3, 2 * 64)).astype(np.float16)
    f = framework.asarray
    qo, _ = cuinfer.apply_rope_with_cos_sin_cache(f(np.array([0, 16, 5])), f(q), f(q), 64, f(table))
    g = framework.to_numpy(qo).reshape(3, 2, 64)
    assert np.isnan(g[1]).all() and not np.isnan(g[[0, 2]]).any()


def test_rope_inplace_on_jax_is_refused(rng):
    jax = pytest.importorskip("jax")
    q = jax.device_put(rng.standard_normal((4, 2, 64)).astype(np.float16))
    with pytest.raises(ValueError, match="q must be writable.*JAX arrays are immutable"):
        cuinfer.apply_rope_pos_ids_inplace(q, q, jax.device_put(np.arange(4, dtype=I32)))


# ---- packbits ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 4095, 4096, 4097, 65_536 + 3, (1 << 22) + 11])
@pytest.mark.parametrize("bitorder", ["little", "big"])
def test_packbits(framework, rng, n, bitorder):
    x = rng.random(n) < 0.4
    _poison_pool(framework)
    got = cuinfer.packbits(framework.asarray(x), bitorder=bitorder)
    _same_framework(framework, got)
    np.testing.assert_array_equal(framework.to_numpy(got), np.packbits(x, bitorder=bitorder))


def test_packbits_unaligned_input(framework, rng):
    """A view starting one byte into an allocation takes the per-byte path."""
    x = rng.random(70_001) < 0.5
    gx = framework.asarray(x)[1:]
    got = cuinfer.packbits(gx)
    np.testing.assert_array_equal(framework.to_numpy(got), np.packbits(x[1:], bitorder="little"))


@pytest.mark.parametrize("index_dtype", [I32, np.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("bitorder", ["little", "big"])
def test_segment_packbits(framework, rng, bitorder, index_dtype):
    seg = rng.integers(0, 300, 97)
    seg[rng.random(97) < 0.1] = 0
    seg[[3, 40]] = (5000, 4096 + 8 * 512)  # work items of 512 bytes: whole, a partial last one, several a segment
    indptr = np.concatenate([[0], np.cumsum(seg)]).astype(index_dtype)
    x = rng.random(int(indptr[-1]) + 5) < 0.5
    want, want_indptr = cuinfer.segment_packbits(x, indptr, bitorder=bitorder)
    _poison_pool(framework)
    got, got_indptr = cuinfer.segment_packbits(framework.asarray(x), framework.asarray(indptr), bitorder=bitorder)
    _same_framework(framework, got)
    np.testing.assert_array_equal(framework.to_numpy(got_indptr), want_indptr)
    _assert_same_packed(framework.to_numpy(got), want, want_indptr, indptr)


def _assert_same_packed(got: np.ndarray, want: np.ndarray, new_indptr: np.ndarray, indptr: np.ndarray) -> None:
    """Equal packed bytes, or a message naming the differing bytes: their segments, offsets and values."""
    assert got.shape == want.shape, f"packed shape {got.shape}, expected {want.shape}"
    bad = np.flatnonzero(got != want)
    if not bad.size:
        return
    seg = np.searchsorted(new_indptr, bad, side="right") - 1
    where = ", ".join(
        f"byte {j} (segment {s}, its byte {j - new_indptr[s]}, elements from {indptr[s] + 8 * (j - new_indptr[s])}):"
        f" got 0x{got[j]:02x}, expected 0x{want[j]:02x}"
        for j, s in zip(bad[:8].tolist(), seg[:8].tolist(), strict=True)
    )
    raise AssertionError(f"{bad.size} of {got.size} packed bytes differ, {bad[0]} .. {bad[-1]}; {where}")
