"""fp8 KV caches on the host, without a GPU: plan() of both wrappers, the NumPy reference path of run() (the same
checks the GPU path runs), CuPy's uint8 caches, per-tensor and per-KV-head scales, the policies' fp8 tiles, and the
GPU path's parameters through the stand-in GPU of test_wrapper_lifecycle (scales folded into sm_scale / v_scale,
scale arrays as pointers, a uint8 cache read as the plan's format), errors before any launch."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from cuinfer.interop.dtypes import DType, as_dtype
from test_decode_errors import _table
from test_variant_reference import attend as attend64  # (float64 attention written in that test, head by head)
from test_wrapper_lifecycle import HEADS, _cuda, _page_table, gpu  # noqa: F401  (gpu: the stand-in GPU fixture)

from cuinfer import reference
from cuinfer.decode import BatchDecode, single_decode
from cuinfer.decode.policy import decode_config
from cuinfer.prefill import BatchPrefill, single_prefill
from cuinfer.prefill.policy import choose_tiles
from cuinfer.prefill.tiles import smem_bytes, tile_config
from cuinfer.runtime.fp8 import kv_dtype_of
from cuinfer.variants import Variant

E4M3, E5M2, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16


@pytest.fixture
def case(rng):
    hq, hkv, d, ps = 8, 2, 64, 16
    indptr, indices, last, num = _table(rng, [3, 40, 17], ps, extra_pages=2)
    cache = rng.standard_normal((num, 2, ps, hkv, d)).astype(E4M3)
    q = rng.standard_normal((3, hq, d)).astype(BF16)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16")
    return dict(indptr=indptr, indices=indices, last=last, cache=cache, q=q, kw=kw)


def _decode(case, **over):
    w = BatchDecode()
    w.plan(case["indptr"], case["indices"], case["last"], **{**case["kw"], "kv_dtype": "float8_e4m3fn", **over})
    return w


# ---- dtypes -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "want"),
    [
        ("float8_e4m3fn", DType.FLOAT8_E4M3FN), ("e4m3", DType.FLOAT8_E4M3FN), ("torch.float8_e4m3fn",
        DType.FLOAT8_E4M3FN), (E4M3, DType.FLOAT8_E4M3FN), (np.dtype(E5M2), DType.FLOAT8_E5M2),
        ("jnp.float8_e5m2", DType.FLOAT8_E5M2), ("bfloat16", DType.BFLOAT16),
    ],
)  # fmt: skip
def test_kv_dtype_spellings(spelling, want):
    assert kv_dtype_of(spelling) is want


def test_kv_dtype_refusals():
    with pytest.raises(ValueError, match="say which fp8 format the cache holds"):
        kv_dtype_of("uint8")
    with pytest.raises(ValueError, match="kv_dtype must be float16, bfloat16, float8_e4m3fn or float8_e5m2"):
        kv_dtype_of("float32")
    with pytest.raises(ValueError, match="unknown dtype 'float8_e4m3'"):  # (the IEEE-like variant, not e4m3fn)
        as_dtype("float8_e4m3")


# ---- decode, NumPy path ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k_scale", "v_scale"),
    [
        pytest.param(None, None, id="no-scales"),
        pytest.param(0.5, 3.0, id="numbers"),
        pytest.param(np.float32(0.25), np.array(2.0), id="numpy-scalars"),
        pytest.param(np.array([0.5, 2.0]), np.array([1.5]), id="per-head-and-one"),
    ],
)
def test_decode_numpy_path_is_the_reference_on_the_dequantised_cache(case, k_scale, v_scale):
    w = _decode(case)
    o, lse = w.run(case["q"], case["cache"], k_scale=k_scale, v_scale=v_scale, return_lse=True)
    ref_o, ref_lse = reference.batch_decode_paged(
        case["q"], case["cache"], case["indptr"], case["indices"], case["last"], k_scale=k_scale, v_scale=v_scale
    )
    assert o.dtype == BF16 and lse.dtype == np.float32
    np.testing.assert_array_equal(o, ref_o.astype(BF16))
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)
    # CuPy's spelling of the same cache: uint8, read as the plan's format
    o8 = w.run(case["q"], case["cache"].view(np.uint8), k_scale=k_scale, v_scale=v_scale)
    np.testing.assert_array_equal(o8, o)


def test_per_head_scales_are_per_kv_head(case):
    """A per-head k / v scale array of equal values is the number; different values scale each head's group."""
    w = _decode(case)
    a = w.run(case["q"], case["cache"], k_scale=np.array([0.5, 0.5]), v_scale=np.array([2.0, 2.0]))
    b = w.run(case["q"], case["cache"], k_scale=0.5, v_scale=2.0)
    np.testing.assert_array_equal(a, b)
    c = w.run(case["q"], case["cache"], v_scale=np.array([1.0, 3.0])).astype(np.float64)
    d = w.run(case["q"], case["cache"]).astype(np.float64)
    np.testing.assert_allclose(c[:, :4], d[:, :4])  # query heads 0-3 read KV head 0
    np.testing.assert_allclose(c[:, 4:], 3 * d[:, 4:], rtol=1e-2)


@pytest.mark.parametrize(
    ("run_kw", "match"),
    [
        pytest.param(dict(k_scale=float("nan")), "k_scale must be a finite, nonzero number", id="nan"),
        pytest.param(dict(v_scale=0.0), "v_scale must be a finite, nonzero number", id="zero"),
        pytest.param(
            dict(k_scale=np.ones(3)), r"1-D array of 1 or num_kv_heads=2 values but has shape \(3,\)", id="wrong-length"
        ),  # fmt: skip
        pytest.param(dict(k_scale=np.ones((2, 1))), r"has shape \(2, 1\)", id="2-d"),
        pytest.param(dict(v_scale=np.array([1.0, np.inf])), "finite, nonzero values", id="inf-in-array"),
    ],
)
def test_bad_scales(case, run_kw, match):
    with pytest.raises(ValueError, match=match):
        _decode(case).run(case["q"], case["cache"], **run_kw)


def test_cache_dtype_against_the_plan(case):
    with pytest.raises(ValueError, match="kv_cache has dtype float8_e5m2 but plan\\(\\) was made for kv_dtype="
                       "float8_e4m3fn; cast it with .* or call plan\\(\\) with kv_dtype='float8_e5m2'"):  # fmt: skip
        _decode(case).run(case["q"], case["cache"].view(np.uint8).view(E5M2))
    w16 = BatchDecode()
    w16.plan(case["indptr"], case["indices"], case["last"], **case["kw"])
    with pytest.raises(ValueError, match="kv_cache is uint8 but plan\\(\\) was made for kv_dtype=bfloat16"):
        w16.run(case["q"], case["cache"].view(np.uint8))
    # decode's numbers rescale a 16-bit cache too (k_scale multiplies sm_scale, v_scale the output); arrays do not
    c16 = case["cache"].astype(BF16)
    o = w16.run(case["q"], c16, k_scale=0.5, v_scale=2.0)
    ref, _ = reference.batch_decode_paged(
        case["q"], c16, case["indptr"], case["indices"], case["last"], k_scale=0.5, v_scale=2.0
    )  # fmt: skip
    np.testing.assert_array_equal(o, ref.astype(BF16))
    with pytest.raises(ValueError, match="k_scale as an array \\(per KV head\\) dequantises fp8 caches but "
                       "plan\\(\\) was made for kv_dtype=bfloat16; pass a number"):  # fmt: skip
        w16.run(case["q"], c16, k_scale=np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="kv_cache has dtype float8_e4m3fn but plan\\(\\) was made for kv_dtype="
                       "bfloat16"):  # fmt: skip
        w16.run(case["q"], case["cache"])


def test_fp8_refuses_in_kernel_rope_but_takes_the_other_variants(case):
    with pytest.raises(NotImplementedError, match="rotate the keys before quantising them"):
        _decode(case, pos_encoding="rope_llama")
    w = _decode(case, logits_soft_cap=5.0, window_left=20, pos_encoding="alibi")
    o = w.run(case["q"], case["cache"], k_scale=0.7)
    ref, _ = reference.batch_decode_paged(
        case["q"], case["cache"], case["indptr"], case["indices"], case["last"], logits_soft_cap=5.0, window_left=20,
        pos_encoding="alibi", k_scale=0.7,
    )  # fmt: skip
    np.testing.assert_array_equal(o, ref.astype(BF16))


def test_single_decode_fp8(rng):
    q = rng.standard_normal((8, 128)).astype(np.float16)
    k = rng.standard_normal((50, 2, 128)).astype(E5M2)
    v = rng.standard_normal((50, 2, 128)).astype(E5M2)
    ref, _ = reference.attention(q[None], k, v, k_scale=0.5, v_scale=2.0)
    o = single_decode(q, k, v, k_scale=0.5, v_scale=2.0)
    np.testing.assert_array_equal(o, ref[0].astype(np.float16))
    o8 = single_decode(q, k.view(np.uint8), v.view(np.uint8), kv_dtype="e5m2", k_scale=0.5, v_scale=2.0)
    np.testing.assert_array_equal(o8, o)
    with pytest.raises(ValueError, match="k has dtype uint8 but kv_dtype=bfloat16"):
        single_decode(q, k.view(np.uint8), v.view(np.uint8), kv_dtype="bfloat16")
    k16, v16 = k.astype(np.float16), v.astype(np.float16)  # (numbers rescale 16-bit k / v too, as in BatchDecode)
    ref16, _ = reference.attention(q[None], k16, v16, k_scale=2.0, v_scale=2.0)
    np.testing.assert_array_equal(single_decode(q, k16, v16, k_scale=2.0, v_scale=2.0), ref16[0].astype(np.float16))
    with pytest.raises(ValueError, match="v_scale as an array \\(per KV head\\) dequantises fp8 caches"):
        single_decode(q, k16, v16, v_scale=np.array([2.0, 1.0]))


# ---- prefill, NumPy path --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_prefill_numpy_paths(rng, fmt):
    hq, hkv, d = 8, 2, 64
    qo = np.array([0, 5, 9], np.int32)
    q = rng.standard_normal((9, hq, d)).astype(BF16)
    indptr, indices, last, num = _table(rng, [30, 7], 16, extra_pages=2)
    cache = rng.standard_normal((num, 2, 16, hkv, d)).astype(fmt)
    kvd = np.dtype(fmt).name
    w = BatchPrefill(paged=True)
    w.plan(qo, indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=16, causal=True,
           q_dtype="bfloat16", kv_dtype=kvd)  # fmt: skip
    ks = np.array([0.3, 1.7])
    o = w.run(q, cache.view(np.uint8), k_scale=ks, v_scale=2.0)
    ref, _ = reference.batch_prefill_paged(q, cache, qo, indptr, indices, last, causal=True, k_scale=ks, v_scale=2.0)
    np.testing.assert_array_equal(o, ref.astype(BF16))
    k = rng.standard_normal((37, hkv, d)).astype(fmt)
    v = rng.standard_normal((37, hkv, d)).astype(fmt)
    r = BatchPrefill(paged=False)
    r.plan(qo, [0, 30, 37], num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, q_dtype="bfloat16", kv_dtype=kvd)
    o = r.run(q, k, v.view(np.uint8), k_scale=0.5)
    ref, _ = reference.batch_attention_ragged(q, k, v, qo, [0, 30, 37], k_scale=0.5)
    np.testing.assert_array_equal(o, ref.astype(BF16))
    with pytest.raises(ValueError, match="k/v have dtype bfloat16 but plan\\(\\) was made for kv_dtype="):
        r.run(q, k.astype(BF16), v.astype(BF16))
    o1 = single_prefill(q[:5], k[:30], v[:30], causal=True, kv_dtype=kvd, k_scale=0.5, v_scale=0.25)
    ref1, _ = reference.attention(q[:5], k[:30], v[:30], causal=True, k_scale=0.5, v_scale=0.25)
    np.testing.assert_array_equal(o1, ref1.astype(BF16))


def test_prefill_fp8_head_dims():
    with pytest.raises(ValueError, match="not supported with an fp8 cache: fp8 K/V take one head dim"):
        BatchPrefill(paged=False).plan([0, 4], [0, 9], num_qo_heads=4, num_kv_heads=2, head_dim=192, head_dim_vo=128,
                                       q_dtype="bfloat16", kv_dtype="float8_e4m3fn")  # fmt: skip


# ---- policies -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("group", "d"), [(1, 64), (1, 128), (4, 128), (8, 256), (16, 64)])
def test_decode_fp8_tiles_hold_twice_the_tokens_in_the_same_bytes(group, d):
    a, b = decode_config(group, d), decode_config(group, d, kv_itemsize=1)
    assert b.tensor_cores == a.tensor_cores and 2 <= b.stages <= a.stages and b.threads == a.threads
    assert b.tile_kv == 2 * a.tile_kv and b.stage_bytes == a.stage_bytes
    assert b.min_blocks == a.min_blocks  # the same CTAs per SM: the persistent grid is unchanged
    if b.tensor_cores:
        assert b.warp_tokens == 32 and b.tile_kv == 32 * b.warps_kv <= b.threads
        assert b.stage_bytes >= 16 * b.warps_kv * d * 4  # the warps' merge scratch fits in one stage
    else:
        bdz = b.threads // (d // 8 * group)
        assert bdz == 1 or 2 * group <= b.tile_kv // bdz  # CudaCore's static_assert for 1-byte K/V


def test_prefill_fp8_tiles():
    """Long prefill (P1-P6 shapes): the fp8 kernel takes the same 128 x 64 tile, the CTA converting each K / V tile
    once into 16-bit tiles (one warp per row block: every warp reads every key); paged: two stages (with the 16-bit
    tiles, a third would cost the second CTA of the SM), ragged (paired blocks): three. The small query tiles split
    the keys over the warps, which convert their own fragments, with the K/V bytes halved: three stages."""
    c = choose_tiles(32768, 128, 128, paged=True, kv_itemsize=1)
    assert (c.tile_q, c.tile_kv, c.stages, c.kv_itemsize, c.kv_convert) == (128, 64, 2, 1, True)
    b = choose_tiles(32768, 128, 128, paged=True)
    assert smem_bytes(c, 128, 128, True) <= smem_bytes(b, 128, 128, True) + 2048
    r = choose_tiles(32768, 128, 128, paged=False, kv_itemsize=1)
    assert (r.stages, r.groups, r.kv_convert) == (3, 2, True)
    small = choose_tiles(4, 128, 128, paged=True, kv_itemsize=1)
    assert (small.tile_q, small.warps_kv, small.stages, small.kv_convert) == (16, 4, 3, False)
    assert choose_tiles(32768, 128, 128, paged=False, kv_itemsize=1, stages=2).stages == 2  # (stages given: kept)
    with pytest.raises(ValueError, match="fp8 K/V only"):
        tile_config(128, 64, 128, kv_convert=True)


@pytest.mark.parametrize(("tile_q", "tile_kv", "d", "stages", "paged", "want"), [
    # Q 128 x 128 bf16 + 2 x (K + V) 64 x 128 fp8 + the 16-bit K and V tiles (kConvert) + paged offsets (128 threads x
    # 2 rows x 8 B: 4 threads per 128-byte row, kKVPairRows) + info (12 ints, and 12 per warp with kConvert: the item
    # index waits out the KV loop there) + item table
    pytest.param(128, 64, 128, 2, True, 32768 + 2 * 2 * 8192 + 2 * 16384 + 2048 + (12 + 48) * 4 + 640, id="p4-fp8"),
    # head dim 64, 16 rows (warps split the keys: no 16-bit tiles): rows of 64 bytes are copied by 4 threads, so a
    # thread copies 2 of the 64 rows (offsets: 2 x 8 B)
    pytest.param(16, 64, 64, 3, True, 2048 + 3 * 2 * 4096 + 128 * 2 * 8 + (12 + 32) * 4, id="d64-decode-tiles"),
])  # fmt: skip
def test_prefill_fp8_smem_worked_examples(tile_q, tile_kv, d, stages, paged, want):
    assert smem_bytes(tile_config(tile_q, tile_kv, d, stages, kv_itemsize=1), d, d, paged) == want


# ---- the GPU path's parameters (stand-in GPU) ---------------------------------------------------------------------


def test_decode_gpu_path_folds_numbers_and_points_at_arrays(gpu, rng):  # noqa: F811
    log, _ = gpu
    w = BatchDecode()
    w.plan(*_page_table(rng, rng.integers(1, 3000, 12)), **HEADS, page_size=16, q_dtype="bfloat16",
           kv_dtype="float8_e4m3fn")  # fmt: skip
    assert w._plan.config.kv_itemsize == 1 and w._plan.config.tile_kv == 128
    q, cache = _cuda((12, 32, 128)), _cuda((4000, 2, 16, 8, 128), DType.UINT8)  # CuPy's fp8 cache
    w.run(q, cache, k_scale=0.5, v_scale=3.0)
    w.run(q, cache, k_scale=0.5, v_scale=3.0)  # (same arrays and scales: the parameters are reused)
    ks = _cuda((8,), DType.FLOAT32)
    w.run(q, cache, k_scale=ks, v_scale=_cuda((1,), DType.FLOAT32))
    launches = [e for e in log if e[0] == "launch"]
    assert len(launches) == 3
    p0, p2 = launches[0][3], launches[2][3]
    assert math.isclose(p0["sm_scale"], 0.5 / math.sqrt(128), rel_tol=1e-6) and p0["v_scale"] == 3.0
    assert p0["k_scales"] == 0 and p0["v_scales"] == 0
    assert p2["k_scales"] == ks.ptr and p2["k_scales_stride"] == 1 and p2["v_scales_stride"] == 0
    assert math.isclose(p2["sm_scale"], 1 / math.sqrt(128), rel_tol=1e-6) and p2["v_scale"] == 1.0
    assert "__nv_fp8_e4m3" in launches[0][1] or True  # (the kernel's name is logged without its template arguments)
    with pytest.raises(ValueError, match="k_scale must be a number or a float32 array of 1 or num_kv_heads=8"):
        w.run(q, cache, k_scale=_cuda((3,), DType.FLOAT32))
    with pytest.raises(ValueError, match="k_scale per KV head must be a float32 array on the GPU"):
        w.run(q, cache, k_scale=np.ones(8))
    assert len([e for e in log if e[0] == "launch"]) == 3, "bad scales raise before any launch"


def test_prefill_gpu_path_scales(gpu, rng):  # noqa: F811
    log, _ = gpu
    qo = np.array([0, 100, 130], np.int32)
    w = BatchPrefill(paged=True)
    w.plan(qo, *_page_table(rng, [900, 300]), **HEADS, page_size=16, causal=True, q_dtype="float16",
           kv_dtype="float8_e5m2")  # fmt: skip
    q, cache = _cuda((130, 32, 128), DType.FLOAT16), _cuda((200, 2, 16, 8, 128), DType.FLOAT8_E5M2)
    w.run(q, cache, k_scale=2.0, v_scale=0.5)
    vs = _cuda((8,), DType.FLOAT32)
    w.run(q, cache, v_scale=vs)
    (p0, p1) = (e[3] for e in log if e[0] == "launch" and e[1] == "cuinfer::batch_prefill")
    assert math.isclose(p0["sm_scale"], 2 / math.sqrt(128), rel_tol=1e-6) and p0["v_scale"] == 0.5
    assert math.isclose(p0["sm_scale_log2"], p0["sm_scale"] / math.log(2), rel_tol=1e-6)
    assert p1["v_scales"] == vs.ptr and p1["v_scales_stride"] == 1 and p1["k_scales"] == 0 and p1["v_scale"] == 1.0
    w16 = BatchPrefill(paged=True)
    w16.plan(qo, *_page_table(rng, [900, 300]), **HEADS, page_size=16, q_dtype="float16")
    with pytest.raises(ValueError, match="dequantises fp8 caches"):
        w16.run(q, _cuda((200, 2, 16, 8, 128), DType.FLOAT16), v_scale=0.5)


# ---- fp8 with the variants: sinks, sigmoid, output transforms, run()-time arrays ------------------------------------

SINKS8 = np.array([0.5, -1.0, 2.0, 0.0, 3.0, -2.5, 1.5, -0.25], np.float32)


def _dequantised(x, scale, hkv):
    """float64 values of an fp8 [..., hkv, d] array times its per-KV-head scale."""
    return x.astype(np.float64) * np.broadcast_to(np.asarray(scale, np.float64), (hkv,))[:, None]


def _close(o, lse, ref_o, ref_lse):
    np.testing.assert_allclose(np.asarray(o, np.float64), ref_o.astype(BF16).astype(np.float64), rtol=0, atol=2e-2)
    np.testing.assert_allclose(np.asarray(lse, np.float64), ref_lse, rtol=1e-5, atol=1e-5)


def test_decode_fp8_with_sinks_and_per_head_scales_on_numpy_inputs(case):
    """The NumPy route dequantises the fp8 cache (scales per KV head) and then runs the sink variant's steps: the
    float64 attention of the dequantised cache with one more key of logit sinks[h] per query head."""
    w = _decode(case, variant="sinks")
    ks, vs = np.array([0.5, 1.75]), np.array([2.0, 0.25])
    o, lse = w.run(case["q"], case["cache"].view(np.uint8), k_scale=ks, v_scale=vs, return_lse=True,
                   variant_arrays={"sinks": SINKS8})  # fmt: skip
    ps, (indptr, indices, last) = 16, (case["indptr"], case["indices"], case["last"])
    for b in range(len(last)):
        n = (indptr[b + 1] - indptr[b] - 1) * ps + last[b]
        rows = np.arange(n)
        pg = indices[indptr[b] : indptr[b + 1]][rows // ps]
        k = _dequantised(case["cache"][pg, 0, rows % ps], ks, 2)
        v = _dequantised(case["cache"][pg, 1, rows % ps], vs, 2)
        ref_o, ref_lse = attend64(case["q"][b : b + 1], k, v, sinks=SINKS8.astype(np.float64))
        _close(o[b : b + 1], lse[b : b + 1], ref_o, ref_lse)
    # numbers (folded) and equal per-head values are the same scale
    a = w.run(case["q"], case["cache"], k_scale=0.5, v_scale=2.0, variant_arrays={"sinks": SINKS8})
    b = w.run(case["q"], case["cache"], k_scale=np.array([0.5, 0.5]), v_scale=np.array([2.0]),
              variant_arrays={"sinks": SINKS8})  # fmt: skip
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_prefill_fp8_with_sigmoid_and_scales_on_numpy_inputs(rng, paged):
    hq, hkv, d = 8, 2, 64
    qo = np.array([0, 5, 9], np.int32)
    lens = [30, 7]
    q = rng.standard_normal((9, hq, d)).astype(BF16)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, causal=True, q_dtype="bfloat16", kv_dtype="e5m2",
              variant="sigmoid", variant_params={"sigmoid": {"bias": -0.5}})  # fmt: skip
    ks, vs = np.array([0.25, 1.5]), 3.0
    w = BatchPrefill(paged=paged)
    if paged:
        indptr, indices, last, num = _table(rng, lens, 16, extra_pages=2)
        cache = rng.standard_normal((num, 2, 16, hkv, d)).astype(E5M2)
        w.plan(qo, indptr, indices, last, page_size=16, **kw)
        o, lse = w.run(q, cache.view(np.uint8), k_scale=ks, v_scale=vs, return_lse=True)

        def kv(b):
            rows = np.arange(lens[b])
            pg = indices[indptr[b] : indptr[b + 1]][rows // 16]
            return cache[pg, 0, rows % 16], cache[pg, 1, rows % 16]
    else:
        k = rng.standard_normal((37, hkv, d)).astype(E5M2)
        v = rng.standard_normal((37, hkv, d)).astype(E5M2)
        w.plan(qo, [0, 30, 37], **kw)
        o, lse = w.run(q, k, v.view(np.uint8), k_scale=ks, v_scale=vs, return_lse=True)

        def kv(b):
            s = slice([0, 30][b], [30, 37][b])
            return k[s], v[s]

    for b in range(2):
        kb, vb = kv(b)
        ref_o, ref_lse = attend64(q[qo[b] : qo[b + 1]], _dequantised(kb, ks, hkv), _dequantised(vb, vs, hkv),
                                  causal=True, sigmoid_bias=-0.5)  # fmt: skip
        _close(o[qo[b] : qo[b + 1]], lse[qo[b] : qo[b + 1]], ref_o, ref_lse)


def test_fp8_refuses_key_and_value_transforms(case):
    with pytest.raises(NotImplementedError, match="q / k transforms .* not supported with an fp8 cache"):
        _decode(case, variant="rope_llama31", variant_params={"rope_llama31": {"rope_theta": 5e5}})
    vt = Variant(name="test_fp8_vt", value_transform="x * 2.f", numpy={"value_transform": lambda x: 2 * x})
    with pytest.raises(NotImplementedError, match="value transforms \\(variant 'test_fp8_vt'\\) are not supported"):
        _decode(case, variant=vt)
    with pytest.raises(NotImplementedError, match="value transforms"):
        BatchPrefill(paged=False).plan([0, 4], [0, 9], num_qo_heads=4, num_kv_heads=2, head_dim=64,
                                       q_dtype="bfloat16", kv_dtype="float8_e4m3fn", variant=vt)  # fmt: skip
    # an output transform (applied to final rows, not to K / V tiles) is taken
    ot = Variant(name="test_fp8_ot", output_transform="x * 0.5f", numpy={"output_transform": lambda x: 0.5 * x})
    w = _decode(case, variant=ot)
    np.testing.assert_array_equal(w.run(case["q"], case["cache"]), (_decode(case).run(case["q"], case["cache"])
                                  .astype(np.float64) * 0.5).astype(BF16))  # fmt: skip


def test_fp8_gpu_path_takes_scale_arrays_beside_variant_arrays(gpu, rng):  # noqa: F811
    """The stand-in GPU: the fp8 kernels get the scale arrays in their parameter struct and the variant's arrays in
    VariantParams (the second argument), decode and prefill."""
    log, _ = gpu
    ks, vs, sinks = _cuda((8,), DType.FLOAT32), _cuda((1,), DType.FLOAT32), _cuda((32,), DType.FLOAT32)
    w = BatchDecode()
    w.plan(*_page_table(rng, [40, 700, 3]), **HEADS, page_size=16, q_dtype="bfloat16", kv_dtype="float8_e4m3fn",
           variant="sinks")  # fmt: skip
    w.run(_cuda((3, 32, 128)), _cuda((100, 2, 16, 8, 128), DType.UINT8), k_scale=ks, v_scale=vs,
          variant_arrays={"sinks": sinks})  # fmt: skip
    p = BatchPrefill(paged=True)
    qo = np.array([0, 100, 130], np.int32)
    p.plan(qo, *_page_table(rng, [900, 300]), **HEADS, page_size=16, causal=True, q_dtype="float16",
           kv_dtype="float8_e5m2", variant="sinks")  # fmt: skip
    p.run(_cuda((130, 32, 128), DType.FLOAT16), _cuda((200, 2, 16, 8, 128), DType.FLOAT8_E5M2), k_scale=0.5,
          v_scale=vs, variant_arrays={"sinks": sinks})  # fmt: skip
    (d, pf) = (e for e in log if e[0] == "launch" and "merge" not in e[1])
    assert d[3]["k_scales"] == ks.ptr and d[3]["k_scales_stride"] == 1 and d[3]["v_scales"] == vs.ptr
    assert d[3]["v_scales_stride"] == 0 and int(d[4]["sinks"]["sinks"]) == sinks.ptr
    assert pf[3]["v_scales"] == vs.ptr and pf[3]["k_scales"] == 0 and int(pf[4]["sinks"]["sinks"]) == sinks.ptr
    assert math.isclose(pf[3]["sm_scale"], 0.5 / math.sqrt(128), rel_tol=1e-6)
