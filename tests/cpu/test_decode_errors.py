"""BatchDecode / single_decode on the CPU: every validation error (messages pinned) and the NumPy reference path.

Everything here runs without a GPU: plan() falls back to a host-only plan and NumPy arrays run the float64 reference.
The GPU runs the same checks before any launch (tests/gpu/test_decode.py covers the ones that need device arrays).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from cuinfer import reference
from cuinfer.decode import BatchDecode, single_decode

BF16 = ml_dtypes.bfloat16


def _table(rng, lens, page_size, extra_pages=3):
    lens = np.asarray(lens)
    pages = (lens + page_size - 1) // page_size
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(indptr[-1]) + extra_pages
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = np.where(pages > 0, lens - (pages - 1) * page_size, 1).astype(np.int32)
    return indptr, indices, last, num_pages


@pytest.fixture
def case(rng):
    hq, hkv, d, ps = 8, 2, 64, 5
    indptr, indices, last, num_pages = _table(rng, [1, 17, 43], ps)
    cache = rng.standard_normal((num_pages, 2, ps, hkv, d)).astype(BF16)
    q = rng.standard_normal((3, hq, d)).astype(BF16)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16")
    return dict(indptr=indptr, indices=indices, last=last, cache=cache, q=q, kw=kw)


def _planned(case, **over):
    w = BatchDecode(**over.pop("ctor", {}))
    w.plan(case["indptr"], case["indices"], case["last"], **{**case["kw"], **over})
    return w


# ---- the reference path ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opts",
    [
        pytest.param({}, id="plain"),
        pytest.param({"logits_soft_cap": 7.5, "window_left": 9}, id="softcap-window"),
        pytest.param({"pos_encoding": "alibi"}, id="alibi"),
        pytest.param({"pos_encoding": "rope_llama", "rope_theta": 500.0}, id="rope"),
    ],
)
def test_numpy_run_matches_the_reference_in_output_dtypes(case, opts):
    w = _planned(case, **opts)
    o, lse = w.run(case["q"], case["cache"], return_lse=True)
    ref_o, ref_lse = reference.batch_decode_paged(
        case["q"], case["cache"], case["indptr"], case["indices"], case["last"], **opts
    )
    assert o.dtype == BF16 and lse.dtype == np.float32
    np.testing.assert_array_equal(o, ref_o.astype(BF16))
    np.testing.assert_array_equal(lse, ref_lse.astype(np.float32))


def test_numpy_run_fills_out_and_lse(case):
    w = _planned(case, o_dtype="float16")
    out = np.full(case["q"].shape, np.nan, np.float16)
    lse = np.full(case["q"].shape[:2], np.nan, np.float32)
    o, l2 = w.run(case["q"], case["cache"], out=out, lse=lse)
    assert o is out and l2 is lse
    assert np.isfinite(out).all() and np.isfinite(lse).all()


def test_single_decode_numpy_matches_the_reference(rng):
    q = rng.standard_normal((8, 128)).astype(np.float16)
    k = rng.standard_normal((2, 33, 128)).astype(np.float16)  # HND
    v = rng.standard_normal((2, 33, 128)).astype(np.float16)
    o, lse = single_decode(q, k, v, kv_layout="HND", return_lse=True, logits_soft_cap=3.0)
    ref_o, ref_lse = reference.attention(q[None], k.transpose(1, 0, 2), v.transpose(1, 0, 2), logits_soft_cap=3.0)
    np.testing.assert_array_equal(o, ref_o[0].astype(np.float16))
    np.testing.assert_array_equal(lse, ref_lse[0].astype(np.float32))


# ---- plan() errors ----------------------------------------------------------------------------------------------


def _raises(exc, pattern):
    return pytest.raises(exc, match=re.escape(pattern))


def test_gqa_ratio(case):
    with _raises(ValueError, "num_qo_heads (30) must be a multiple of num_kv_heads (8) for grouped-query attention"):
        _planned(case, num_qo_heads=30, num_kv_heads=8)


def test_unsupported_head_dim(case):
    with _raises(ValueError, "head_dim must be one of 64, 128, 256 for decode but is 96; pad the heads"):
        _planned(case, head_dim=96)


def test_variant_must_be_a_variant_or_a_registered_name(case):
    with _raises(ValueError, "no variant is registered as 'mine'; registered: alibi, causal"):
        _planned(case, variant="mine")
    with _raises(TypeError, "variant must be a cuinfer.Variant, a registered variant's name"):
        _planned(case, variant=3)


def test_variant_params_are_checked_at_plan(case):
    from cuinfer.variants import Param, Variant

    v = Variant(name="test_decode_scale", logits="x * params.s", params=(Param("s", "f32"),))
    with _raises(ValueError, "variant 'test_decode_scale' takes parameters ['s']; pass variant_params="):
        _planned(case, variant=v)
    with _raises(TypeError, "variant_params['test_decode_scale']['s'] must be a number (f32)"):
        _planned(case, variant=v, variant_params={"test_decode_scale": {"s": "big"}})
    with _raises(ValueError, "variant_params names ['other']"):
        _planned(case, variant=v, variant_params={"test_decode_scale": {"s": 2.0}, "other": {}})


def test_fp8_is_a_kv_format_only(case):
    """fp8 K/V plan (tests/cpu/test_fp8_host.py runs them); fp8 q or o is refused, naming kv_dtype."""
    assert _planned(case, kv_dtype="float8_e4m3fn")._plan.kv_dtype.value == "float8_e4m3fn"
    with _raises(ValueError, "q_dtype=float8_e4m3fn: the decode kernels take q and o in float16 or bfloat16; fp8 is "
                 "for the KV cache (kv_dtype='float8_e4m3fn' with q_dtype='bfloat16' or 'float16')"):  # fmt: skip
        _planned(case, q_dtype="float8_e4m3fn")
    with _raises(ValueError, "o_dtype=float8_e5m2: the decode kernels take q and o in float16 or bfloat16"):
        _planned(case, o_dtype="float8_e5m2")


def test_q_dtype_must_be_16_bit(case):
    with _raises(ValueError, "q_dtype must be float16 or bfloat16 but is float32"):
        _planned(case, q_dtype=np.float32)


def test_bad_pos_encoding(case):
    with _raises(ValueError, "pos_encoding must be one of none, rope_llama, alibi but is 'rope'"):
        _planned(case, pos_encoding="rope")


def test_bad_window_and_soft_cap(case):
    with _raises(ValueError, "window_left must be an integer >= -1 (-1 disables the window) but is -2"):
        _planned(case, window_left=-2)
    with _raises(ValueError, "logits_soft_cap must be >= 0 (0 disables it) but is -1.0"):
        _planned(case, logits_soft_cap=-1.0)


def test_last_page_len_out_of_range(case):
    last = case["last"].copy()
    last[1] = 6
    w = BatchDecode()
    with _raises(ValueError, "kv_last_page_len[1] must be in [1, page_size=5] for a request with pages but is 6"):
        w.plan(case["indptr"], case["indices"], last, **case["kw"])


def test_mixed_dtypes_cannot_use_tensor_cores(case):
    with _raises(ValueError, "use_tensor_cores=True needs q_dtype == kv_dtype"):
        _planned(case, kv_dtype="float16", ctor={"use_tensor_cores": True})
    _planned(case, kv_dtype="float16")  # automatic choice takes the CUDA-core kernel


def test_workspace_too_small_names_the_bytes(case):
    w = BatchDecode(workspace_bytes=1024)
    need = w.workspace_size(case["indptr"], case["indices"], case["last"], **case["kw"], fixed_split_size=5)
    assert need > 1024
    with _raises(ValueError, f"the plan needs {need} bytes of workspace for"):
        w.plan(case["indptr"], case["indices"], case["last"], **case["kw"], fixed_split_size=5)
    with _raises(ValueError, f"build BatchDecode(workspace_bytes={need}) or larger"):
        w.plan(case["indptr"], case["indices"], case["last"], **case["kw"], fixed_split_size=5)
    BatchDecode(workspace_bytes=need).plan(case["indptr"], case["indices"], case["last"], **case["kw"],
                                           fixed_split_size=5)  # fmt: skip


def test_cuda_graph_needs_max_batch_size():
    with _raises(ValueError, "use_cuda_graph=True needs max_batch_size >= 1"):
        BatchDecode(use_cuda_graph=True)


def test_cuda_graph_batch_over_capacity(case):
    with _raises(ValueError, "the plan has 3 requests but the wrapper was built with max_batch_size=2"):
        _planned(case, ctor={"use_cuda_graph": True, "max_batch_size": 2})


def test_bad_kv_layout():
    with _raises(ValueError, "kv_layout must be 'NHD' or 'HND' but is 'NDH'"):
        BatchDecode(kv_layout="NDH")


# ---- run() errors -----------------------------------------------------------------------------------------------


def test_run_before_plan(case):
    with _raises(ValueError, "run() needs a plan: call plan(kv_indptr, kv_indices, kv_last_page_len, ...) first"):
        BatchDecode().run(case["q"], case["cache"])


def test_q_dtype_differs_from_plan(case):
    w = _planned(case)
    with _raises(ValueError, "q has dtype float16 but plan() was made for q_dtype=bfloat16; cast q with"):
        w.run(case["q"].astype(np.float16), case["cache"])


def test_q_head_count_differs_from_plan(case):
    w = _planned(case)
    q = np.zeros((3, 16, 64), BF16)
    with _raises(
        ValueError,
        "q must have shape (3, 8, 64) but has shape (3, 16, 64); plan() was made for batch_size=3, num_qo_heads=8, "
        "head_dim=64",
    ):
        w.run(q, case["cache"])


def test_page_index_out_of_range_of_the_cache(case):
    w = _planned(case)
    small = case["cache"][: int(case["indices"].max())]
    with _raises(
        ValueError,
        f"kv_indices holds page index {int(case['indices'].max())} but kv_cache has {small.shape[0]} pages",
    ):
        w.run(case["q"], small)


def test_cache_layout_differs_from_plan(case):
    """An NHD cache given to an HND wrapper reads as page_size 2, 5 heads: caught before any math."""
    w = BatchDecode(kv_layout="HND")
    w.plan(case["indptr"], case["indices"], case["last"], **case["kw"])
    with _raises(
        ValueError, "kv_cache has (page_size, num_kv_heads, head_dim) = (2, 5, 64) (HND) but plan() was made for"
    ):
        w.run(case["q"], case["cache"])


def test_kv_dtype_differs_from_plan(case):
    w = _planned(case)
    with _raises(ValueError, "kv_cache has dtype float16 but plan() was made for kv_dtype=bfloat16"):
        w.run(case["q"], case["cache"].astype(np.float16))


def test_out_dtype_differs_from_plan(case):
    w = _planned(case)
    out = np.zeros(case["q"].shape, np.float16)
    with _raises(ValueError, "out has dtype float16 but plan() was made for o_dtype=bfloat16"):
        w.run(case["q"], case["cache"], out=out)


def test_tuple_cache_must_match(case):
    w = _planned(case)
    k, v = case["cache"][:, 0], case["cache"][:, 1]
    o = w.run(case["q"], (k, v))
    np.testing.assert_array_equal(o, w.run(case["q"], case["cache"]))
    with _raises(ValueError, "v_cache must have shape"):
        w.run(case["q"], (k, v[:, :, :1]))


def test_single_decode_shape_errors(rng):
    q = rng.standard_normal((6, 64)).astype(np.float16)
    k = rng.standard_normal((9, 4, 64)).astype(np.float16)
    with _raises(ValueError, "num_qo_heads (6) must be a multiple of num_kv_heads (4)"):
        single_decode(q, k, k)
    with _raises(ValueError, "q and k must share head_dim"):
        single_decode(q[:, :32], k[:, :3], k[:, :3])


def test_user_variants_do_not_run_on_the_cpu_reference(case):
    from cuinfer.variants import Variant

    v = Variant(name="test_decode_double", logits="2.f * x")
    w = _planned(case, variant=v)
    with _raises(NotImplementedError, "variant 'test_decode_double': the CPU reference backend (NumPy inputs)"):
        w.run(case["q"], case["cache"])
    # the built-ins the options select run there, through the reference's own implementation
    out = _planned(case, variant=(), logits_soft_cap=2.0).run(case["q"], case["cache"])
    assert out.shape == case["q"].shape


def test_custom_mask_in_decode_on_the_cpu_backend(case, rng):
    """A decode query is one row: the mask holds each request's kv_len bools; NumPy inputs match the reference."""
    lens = np.array([1, 17, 43])
    mask = rng.random(int(lens.sum())) < 0.5
    w = _planned(case, custom_mask=mask)
    o, lse = w.run(case["q"], case["cache"], return_lse=True)
    qo = np.arange(4, dtype=np.int32)
    ref_o, ref_lse = reference.batch_prefill_paged(
        case["q"], case["cache"], qo, case["indptr"], case["indices"], case["last"], custom_mask=mask
    )
    np.testing.assert_array_equal(o, ref_o.astype(BF16))
    np.testing.assert_array_equal(lse, ref_lse.astype(np.float32))
    with _raises(ValueError, "custom_mask must hold sum(qo_len * kv_len) = 61 entries"):
        _planned(case, custom_mask=mask[:-1])
    with _raises(ValueError, "custom_mask and packed_custom_mask were both given"):
        _planned(case, custom_mask=mask, packed_custom_mask=np.zeros(3, np.uint8))
