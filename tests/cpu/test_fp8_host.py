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
from test_wrapper_lifecycle import HEADS, _cuda, _page_table, gpu  # noqa: F401  (gpu: the stand-in GPU fixture)

from cuinfer import reference
from cuinfer.decode import BatchDecode, single_decode
from cuinfer.decode.policy import decode_config
from cuinfer.prefill import BatchPrefill, single_prefill
from cuinfer.prefill.policy import choose_tiles
from cuinfer.prefill.tiles import smem_bytes, tile_config
from cuinfer.runtime.fp8 import kv_dtype_of

E4M3, E5M2, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16


def _table(rng, lens, ps):
    lens = np.asarray(lens)
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num = int(indptr[-1]) + 2
    indices = rng.permutation(num)[: indptr[-1]].astype(np.int32)
    last = np.where(pages > 0, lens - (pages - 1) * ps, 1).astype(np.int32)
    return indptr, indices, last, num


@pytest.fixture
def case(rng):
    hq, hkv, d, ps = 8, 2, 64, 16
    indptr, indices, last, num = _table(rng, [3, 40, 17], ps)
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
                       "float8_e4m3fn; call plan\\(\\) with kv_dtype='float8_e5m2'"):  # fmt: skip
        _decode(case).run(case["q"], case["cache"].view(np.uint8).view(E5M2))
    w16 = BatchDecode()
    w16.plan(case["indptr"], case["indices"], case["last"], **case["kw"])
    with pytest.raises(ValueError, match="kv_cache is uint8 but plan\\(\\) was made for kv_dtype=bfloat16"):
        w16.run(case["q"], case["cache"].view(np.uint8))
    with pytest.raises(ValueError, match="k_scale and v_scale dequantise fp8 caches but plan\\(\\) was made for "
                       "kv_dtype=bfloat16"):  # fmt: skip
        w16.run(case["q"], case["cache"].astype(BF16), k_scale=0.5, v_scale=2.0)
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
    with pytest.raises(ValueError, match="dequantise fp8 caches"):
        single_decode(q, k.astype(np.float16), v.astype(np.float16), k_scale=2.0, v_scale=2.0)


# ---- prefill, NumPy path --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_prefill_numpy_paths(rng, fmt):
    hq, hkv, d = 8, 2, 64
    qo = np.array([0, 5, 9], np.int32)
    q = rng.standard_normal((9, hq, d)).astype(BF16)
    indptr, indices, last, num = _table(rng, [30, 7], 16)
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
    with pytest.raises(ValueError, match="k has dtype bfloat16 but plan\\(\\) was made for kv_dtype="):
        r.run(q, k.astype(BF16), v)
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
    # 4 rows x 8 B) + info + item table
    pytest.param(128, 64, 128, 2, True, 32768 + 2 * 2 * 8192 + 2 * 16384 + 4096 + (12 + 32) * 4 + 640, id="p4-fp8"),
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
