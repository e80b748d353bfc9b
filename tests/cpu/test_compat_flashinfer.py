"""``cuinfer.compat.flashinfer`` without a GPU: FlashInfer 0.7.2's signatures, the translation of its arguments into
cuinfer's (run through the float64 CPU reference on NumPy arrays and compared with the reference called directly
with the translated options), the RoPE and append utilities against float64 formulas written in the tests (those of
test_utilities_cpu.py), and the errors for what the drop-in does not cover.

FlashInfer itself is never imported here: its signatures are recorded below from the 0.7.2 sources. The GPU side
(the same calls through real FlashInfer and the drop-in on torch tensors) is tests/gpu/test_compat_parity.py.
"""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest
from test_utilities_cpu import assert_rounded_once, exact_rope, expected_append, llama31_freqs, plain_freqs

import cuinfer
import cuinfer.compat.flashinfer as fi
from cuinfer import reference as R

# FlashInfer 0.7.2's signatures without annotations (decode.py, prefill.py, cascade.py, page.py, rope.py,
# quantization/packbits.py). BatchDecodeWithPagedKVCacheWrapper.plan forwards its keywords to _plan_impl, which
# holds the options, as in FlashInfer.
FLASHINFER_0_7_2 = {
    "single_decode_with_kv_cache": "(q, k, v, kv_layout='NHD', pos_encoding_mode='NONE', use_tensor_cores=False, q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, return_lse=False)",  # noqa: E501
    "BatchDecodeWithPagedKVCacheWrapper.__init__": "(self, float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, use_tensor_cores=False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, backend='auto', jit_args=None)",  # noqa: E501
    "BatchDecodeWithPagedKVCacheWrapper.plan": "(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *deprecated_positional_args, **kwargs)",  # noqa: E501
    "BatchDecodeWithPagedKVCacheWrapper._plan_impl": "(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *, pos_encoding_mode='NONE', window_left=-1, window_right=0, logits_soft_cap=None, q_data_type='float16', kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True, block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False, q_len_per_req=1, is_causal=None)",  # noqa: E501
    "BatchDecodeWithPagedKVCacheWrapper.run": "(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None)",  # noqa: E501
    "BatchDecodeWithPagedKVCacheWrapper.forward": "(self, q, paged_kv_cache, pos_encoding_mode='NONE', q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None)",  # noqa: E501
    "BatchDecodeWithPagedKVCacheWrapper.forward_return_lse": "(self, q, paged_kv_cache, pos_encoding_mode='NONE', q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None)",  # noqa: E501
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper.__init__": "(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, kv_layout='NHD', use_tensor_cores=False)",  # noqa: E501
    "single_prefill_with_kv_cache": "(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None, packed_custom_mask=None, causal=False, kv_layout='NHD', pos_encoding_mode='NONE', use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None, backend='auto', return_lse=False, kv_cache_sf=None, k_scale=None, v_scale=None)",  # noqa: E501
    "BatchPrefillWithPagedKVCacheWrapper.__init__": "(self, float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend='auto', jit_args=None, jit_kwargs=None, variant_owns_mask=False)",  # noqa: E501
    "BatchPrefillWithPagedKVCacheWrapper.plan": "(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type='float16', kv_data_type=None, o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None, max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False, uniform_q_len=None)",  # noqa: E501
    "BatchPrefillWithPagedKVCacheWrapper.run": "(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None, return_lse=False, lse_base='log2', lse_layout='NH', enable_pdl=None, window_left=None, sinks=None, kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None)",  # noqa: E501
    "BatchPrefillWithPagedKVCacheWrapper.forward": "(self, q, paged_kv_cache, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None)",  # noqa: E501
    "BatchPrefillWithPagedKVCacheWrapper.forward_return_lse": "(self, q, paged_kv_cache, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None)",  # noqa: E501
    "BatchPrefillWithRaggedKVCacheWrapper.__init__": "(self, float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend='auto', jit_args=None, jit_kwargs=None, variant_owns_mask=False)",  # noqa: E501
    "BatchPrefillWithRaggedKVCacheWrapper.plan": "(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, q_data_type='float16', kv_data_type=None, o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, fixed_split_size=None, disable_split_kv=False, seq_lens=None, seq_lens_q=None, max_token_per_sequence=None, max_sequence_kv=None, v_indptr=None, o_indptr=None, uniform_q_len=None)",  # noqa: E501
    "BatchPrefillWithRaggedKVCacheWrapper.run": "(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None, return_lse=False, lse_base='log2', lse_layout='NH', enable_pdl=None, kv_cache_sf=None)",  # noqa: E501
    "BatchPrefillWithRaggedKVCacheWrapper.forward": "(self, q, k, v, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None)",  # noqa: E501
    "BatchPrefillWithRaggedKVCacheWrapper.forward_return_lse": "(self, q, k, v, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None)",  # noqa: E501
    "merge_state": "(v_a, s_a, v_b, s_b)",
    "merge_state_in_place": "(v, s, v_other, s_other, mask=None)",
    "merge_states": "(v, s)",
    "get_batch_indices_positions": "(append_indptr, seq_lens, nnz, batch_indices=None, positions=None)",
    "get_seq_lens": "(kv_indptr, kv_last_page_len, page_size)",
    "append_paged_kv_cache": "(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout='NHD')",  # noqa: E501
    "apply_rope": "(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0)",
    "apply_rope_inplace": "(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0)",  # noqa: E501
    "apply_rope_pos_ids": "(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0)",
    "apply_rope_pos_ids_inplace": "(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0)",  # noqa: E501
    "apply_llama31_rope": "(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, low_freq_factor=1, high_freq_factor=4, old_context_len=8192)",  # noqa: E501
    "apply_llama31_rope_inplace": "(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, low_freq_factor=1, high_freq_factor=4, old_context_len=8192)",  # noqa: E501
    "apply_llama31_rope_pos_ids": "(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, low_freq_factor=1, high_freq_factor=4, old_context_len=8192)",  # noqa: E501
    "apply_llama31_rope_pos_ids_inplace": "(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, low_freq_factor=1, high_freq_factor=4, old_context_len=8192)",  # noqa: E501
    "apply_rope_with_cos_sin_cache": "(positions, query, key, head_size, cos_sin_cache, is_neox=True)",
    "apply_rope_with_cos_sin_cache_inplace": "(positions, query, key, head_size, cos_sin_cache, is_neox=True)",
    "packbits": "(x, bitorder='big')",
    "segment_packbits": "(x, indptr, bitorder='big')",
}


def _plain(obj) -> str:
    """A signature as FlashInfer's source spells it: names, kinds and defaults, no annotations."""
    sig = inspect.signature(obj)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


@pytest.mark.parametrize("name", sorted(FLASHINFER_0_7_2))
def test_signature_matches_flashinfer(name):
    owner, _, attr = name.partition(".")
    obj = getattr(fi, owner)
    if attr:
        obj = getattr(obj, attr)
    assert _plain(obj) == FLASHINFER_0_7_2[name]


def test_return_lse_variants_are_partials():
    assert fi.single_prefill_with_kv_cache_return_lse.keywords == {"return_lse": True}
    for cls in (fi.BatchDecodeWithPagedKVCacheWrapper, fi.BatchPrefillWithPagedKVCacheWrapper,
                fi.BatchPrefillWithRaggedKVCacheWrapper):  # fmt: skip
        assert cls.begin_forward is cls.plan
        assert cls.run_return_lse._partialmethod.keywords == {"return_lse": True}


def test_importing_the_drop_in_imports_no_framework():
    code = "import sys, cuinfer.compat.flashinfer; print([m for m in ('torch', 'jax', 'cupy') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_module_surface():
    for name in fi.COVERED:
        assert callable(getattr(fi, name)), name
    assert fi.__version__.startswith("0.7.2+cuinfer.")
    assert fi.decode.BatchDecodeWithPagedKVCacheWrapper is fi.BatchDecodeWithPagedKVCacheWrapper  # FlashInfer paths
    assert fi.prefill.single_prefill_with_kv_cache is fi.single_prefill_with_kv_cache
    assert fi.cascade.merge_states is fi.merge_states
    with pytest.raises(AttributeError, match="docs/compat.md"):
        fi.no_such_function  # noqa: B018
    assert not hasattr(fi, "no_such_function")


@pytest.mark.parametrize("name", sorted(fi.NOT_COVERED))
def test_uncovered_names_raise_naming_themselves(name):
    stub = getattr(fi, name)
    with pytest.raises(NotImplementedError, match=rf"flashinfer\.{name} .*not covered.*docs/compat\.md"):
        stub(object())


# ---- test data -------------------------------------------------------------------------------------------------------

WS = np.empty(16, np.uint8)  # a host workspace buffer: cuinfer reads only its device (none: the CPU reference)
DTYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.fixture
def rng(request):
    seed = int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"random seed for {request.node.name}: {seed}")
    return np.random.default_rng(seed)


def paged(rng, kv_lens, page_size, hkv, d, dtype, layout="NHD", spare=3):
    """A random 5-D cache (junk in unused slots) and its CSR page table over permuted pages."""
    n_pages = [-(-n // page_size) for n in kv_lens]
    indptr = np.cumsum([0, *n_pages]).astype(np.int32)
    total = int(indptr[-1]) + spare
    indices = rng.permutation(total)[: indptr[-1]].astype(np.int32)
    last = np.array([n - page_size * (p - 1) if p else 0 for n, p in zip(kv_lens, n_pages, strict=True)], np.int32)
    shape = (total, 2, page_size, hkv, d) if layout == "NHD" else (total, 2, hkv, page_size, d)
    return rng.standard_normal(shape).astype(dtype), indptr, indices, last


def same(got, want):
    """The drop-in's NumPy result against the reference's float64 one rounded as cuinfer rounds it."""
    got_o, got_l = got
    want_o, want_l = want
    assert got_o.dtype == want_o.dtype if hasattr(want_o, "dtype") else True
    np.testing.assert_array_equal(np.asarray(got_o, np.float64), np.asarray(want_o, np.float64))
    np.testing.assert_array_equal(got_l, np.asarray(want_l, np.float32))


def check_flashinfer_alibi(got, want, offsets):
    """The drop-in's ALiBi result against cuinfer's (the reference with ``pos_encoding="alibi"``): FlashInfer's bias
    ``slope_h·(j − i)``, i the query's index in its request, exceeds cuinfer's ``slope_h·(j − (i + kv_len − qo_len))``
    by ``slope_h·(kv_len − qo_len)`` (``offsets``, one per row): o unchanged (up to a rounding of o's dtype), lse
    (base 2) shifted by that times log2(e)."""
    got_o, got_lse = (np.asarray(x, np.float64) for x in got)
    want_o, want_lse = (np.asarray(x, np.float64) for x in want)
    eps = float(np.finfo(got[0].dtype).eps)
    np.testing.assert_allclose(got_o, want_o, rtol=eps, atol=1e-6)
    heads = want_lse.shape[1]
    shift = np.asarray(offsets, np.float64)[:, None] * R.alibi_slopes(heads)[None, :] / math.log(2.0)
    assert np.abs(shift).max() > 1, "the case must tell the two conventions apart"
    np.testing.assert_allclose(got_lse, want_lse + shift, rtol=1e-6, atol=1e-5)


# ---- batch decode ----------------------------------------------------------------------------------------------------

DECODE_OPTIONS = [
    pytest.param({}, {}, id="plain"),
    pytest.param(
        {"pos_encoding_mode": "ROPE_LLAMA", "rope_theta": 5e5},
        {"pos_encoding": "rope_llama", "rope_theta": 5e5},
        id="rope",
    ),  # fmt: skip
    pytest.param(
        {"window_left": 9, "logits_soft_cap": 20.0}, {"window_left": 9, "logits_soft_cap": 20.0}, id="window-softcap"
    ),  # fmt: skip
    pytest.param(
        {"pos_encoding_mode": "ALIBI", "sm_scale": 0.2}, {"pos_encoding": "alibi", "sm_scale": 0.2}, id="alibi-smscale"
    ),  # fmt: skip
    pytest.param({"logits_soft_cap": -1.0}, {}, id="negative-cap-is-off"),
]


@pytest.mark.parametrize(("fi_opts", "ref_opts"), DECODE_OPTIONS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("tc", [False, True], ids=["cuda-cores", "tensor-cores"])
def test_batch_decode_matches_reference(rng, fi_opts, ref_opts, layout, dt, tc):
    dtype, lens, ps = DTYPES[dt], [37, 1, 16, 80, 5], 16
    cache, indptr, indices, last = paged(rng, lens, ps, 2, 64, dtype, layout)
    q = rng.standard_normal((len(lens), 8, 64)).astype(dtype)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WS, layout, use_tensor_cores=tc)
    w.plan(indptr, indices, last, 8, 2, 64, ps, q_data_type=dt.replace("fp", "float").replace("bf", "bfloat"),
           **fi_opts)  # fmt: skip
    want = R.batch_decode_paged(q, cache, indptr, indices, last, kv_layout=layout, **ref_opts)
    if ref_opts.get("pos_encoding") == "alibi":  # FlashInfer's bias: decode's query index is 0
        check_flashinfer_alibi(w.run(q, cache, return_lse=True), want, np.asarray(lens) - 1)
        return
    want = (want[0].astype(dtype), want[1])
    same(w.run(q, cache, return_lse=True), want)
    same(w.run_return_lse(q, (cache[:, 0], cache[:, 1])), want)  # the (k_cache, v_cache) form
    assert not isinstance(w.run(q, cache), tuple)


def test_batch_decode_page_size_one_shorthand(rng):
    cache, indptr, indices, last = paged(rng, [7, 3], 1, 2, 64, np.float16)
    q = rng.standard_normal((2, 4, 64)).astype(np.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(indptr, indices, last, 4, 2, 64, 1)
    want = w.run(q, cache)
    np.testing.assert_array_equal(w.run(q, cache[:, :, 0]), want)  # 4-D [pages, 2, heads, dim]
    np.testing.assert_array_equal(w.run(q, (cache[:, 0, 0], cache[:, 1, 0])), want)  # tuple of 3-D
    pair = (cache[:, 0], cache[:, 1])
    assert fi.common.expand_paged(pair, "NHD") is pair  # (cuinfer reuses a cache's checked view by identity)


def test_batch_decode_scales_fold_like_flashinfer(rng):
    cache, indptr, indices, last = paged(rng, [20, 9], 8, 2, 64, np.float16)
    q = rng.standard_normal((2, 4, 64)).astype(np.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(indptr, indices, last, 4, 2, 64, 8, sm_scale=0.1)
    o, lse = w.run(q, cache, q_scale=2.0, k_scale=0.75, v_scale=3.0, return_lse=True)
    want = R.batch_decode_paged(q, cache, indptr, indices, last, sm_scale=0.1 * 2.0 * 0.75, v_scale=3.0)
    same((o, lse), (want[0].astype(np.float16), want[1]))


def test_wrappers_refuse_fp8_kv_data_type():
    """cuinfer's kernels take fp8 caches, but the wrappers do not route FlashInfer's fp8 scales to them yet (the ragged
    prefill wrapper would drop k_scale / v_scale): an fp8 kv_data_type raises at plan()."""
    with pytest.raises(NotImplementedError, match="kv_data_type=float8_e4m3fn: an fp8 KV cache through the drop-in"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WS).plan(
            np.array([0, 1], np.int32), np.array([0], np.int32), np.array([3], np.int32), 4, 2, 64, 8,
            kv_data_type="float8_e4m3fn",
        )  # fmt: skip
    with pytest.raises(NotImplementedError, match="fp8 KV cache through the drop-in"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(WS).plan(
            np.array([0, 2], np.int32), np.array([0, 5], np.int32), 4, 2, 64, kv_data_type=ml_dtypes.float8_e5m2
        )


def test_batch_decode_lse_buffer_without_return_lse(rng):
    """FlashInfer writes a given ``lse`` even with return_lse=False, and returns o alone."""
    cache, indptr, indices, last = paged(rng, [20, 9], 8, 2, 64, np.float16)
    q = rng.standard_normal((2, 4, 64)).astype(np.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(indptr, indices, last, 4, 2, 64, 8)
    lse = np.full((2, 4), np.nan, np.float32)
    out = np.full((2, 4, 64), np.nan, np.float16)
    o = w.run(q, cache, out=out, lse=lse)
    assert o is out and np.isfinite(lse).all()
    np.testing.assert_array_equal(lse, w.run(q, cache, return_lse=True)[1])


def test_batch_decode_deprecated_positional_options(rng):
    cache, indptr, indices, last = paged(rng, [20, 9], 8, 2, 64, np.float16)
    q = rng.standard_normal((2, 4, 64)).astype(np.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(indptr, indices, last, 4, 2, 64, 8, pos_encoding_mode="ROPE_LLAMA", window_left=5)
    want = w.run(q, cache)
    with pytest.warns(DeprecationWarning, match="positionally is deprecated"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, "ROPE_LLAMA", 5)
    np.testing.assert_array_equal(w.run(q, cache), want)
    with pytest.raises(TypeError, match="multiple values for argument 'pos_encoding_mode'"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, "NONE", pos_encoding_mode="NONE")
    with pytest.raises(TypeError, match="at most 16"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, *([None] * 17))


def test_batch_decode_data_type_alias_and_forward(rng):
    cache, indptr, indices, last = paged(rng, [30, 12], 8, 2, 64, ml_dtypes.bfloat16)
    q = rng.standard_normal((2, 4, 64)).astype(ml_dtypes.bfloat16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WS)
    w.plan(indptr, indices, last, 4, 2, 64, 8, data_type="bfloat16")  # FlashInfer: q keeps q_data_type="float16"
    with pytest.raises(ValueError, match="q has dtype bfloat16 but plan\\(\\) was made for q_dtype=float16"):
        w.run(q, cache)
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type=None, data_type="bfloat16")
    plain = w.run(q, cache)
    rope = R.batch_decode_paged(q, cache, indptr, indices, last, pos_encoding="rope_llama")[0]
    np.testing.assert_array_equal(w.forward(q, cache, pos_encoding_mode="ROPE_LLAMA"), rope.astype(q.dtype))
    np.testing.assert_array_equal(w.run(q, cache), rope.astype(q.dtype))  # forward's options replace the plan's
    o, lse = w.forward_return_lse(q, cache)
    np.testing.assert_array_equal(o, plain)


def test_batch_decode_cuda_graph_rules(rng):
    cache, indptr, indices, last = paged(rng, [30, 12, 5], 8, 2, 64, np.float16)
    q = rng.standard_normal((3, 4, 64)).astype(np.float16)
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer should be a torch.Tensor in cudagraph mode"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WS, use_cuda_graph=True)
    bufs = (np.zeros(4, np.int32), np.zeros(8, np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="batch_size \\+ 1"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD", True, False, np.zeros(5, np.int32), *bufs[1:])
    w = fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(WS, *bufs)
    assert w.is_cuda_graph_enabled and w._core.max_batch_size == 3
    w.plan(indptr, indices, last, 4, 2, 64, 8)
    np.testing.assert_array_equal(w.run(q, cache), R.batch_decode_paged(q, cache, indptr, indices, last)[0]
                                  .astype(np.float16))  # fmt: skip
    with pytest.raises(ValueError, match="batch size should be fixed in cudagraph mode"):
        w.plan(indptr[:3], indices, last[:2], 4, 2, 64, 8)
    with pytest.raises(ValueError, match="less than or equal to the allocated buffer"):
        w.plan(indptr, np.zeros(9, np.int32), last, 4, 2, 64, 8)


def test_batch_decode_errors(rng):
    cache, indptr, indices, last = paged(rng, [20, 9], 8, 2, 64, np.float16)
    q = rng.standard_normal((2, 4, 64)).astype(np.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WS)
    with pytest.raises(KeyError, match="Invalid pos_encoding_mode 'rope'"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, pos_encoding_mode="rope")
    with pytest.raises(ValueError, match="Invalid kv_layout"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WS, "nhd")
    with pytest.raises(NotImplementedError, match="window_right"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, window_right=4)
    with pytest.raises(NotImplementedError, match="q_len_per_req=2 .*BatchPrefillWithPagedKVCacheWrapper"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, q_len_per_req=2)
    with pytest.raises(ValueError, match="fixed_split_size is only supported by tensor core decode"):
        w.plan(indptr, indices, last, 4, 2, 64, 8, fixed_split_size=4)
    w.plan(indptr, indices, last, 4, 2, 64, 8, q_data_type="bfloat16")
    with pytest.raises(ValueError, match="q has dtype float16 but plan\\(\\) was made for q_dtype=bfloat16"):
        w.run(q, cache)
    w.plan(indptr, indices, last, 4, 2, 64, 8, window_left=7, non_blocking=False, block_tables=np.zeros((2, 3)))
    w.run(q, cache, window_left=7, enable_pdl=True)  # the plan's window, a launch hint: accepted
    with pytest.raises(ValueError, match="run\\(window_left=3\\) differs from the window_left=7"):
        w.run(q, cache, window_left=3)
    for kw, what in ((dict(sinks=np.zeros(4, np.float32)), "sinks"), (dict(kv_cache_sf=cache), "kv_cache_sf"),
                     (dict(skip_softmax_threshold_scale_factor=1.0), "skip_softmax")):  # fmt: skip
        with pytest.raises(NotImplementedError, match=f"{what}.*not covered"):
            w.run(q, cache, **kw)
    with pytest.raises(NotImplementedError, match="args=.*cuinfer.Variant"):
        w.run(q, cache, np.zeros(1))
    with pytest.raises(NotImplementedError, match="backend='trtllm-gen' is not covered"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WS, backend="trtllm-gen")
    with pytest.raises(ValueError, match="backend must be one of"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WS, backend="fa9")
    with pytest.raises(NotImplementedError, match="jit_args.*cuinfer.Variant"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WS, jit_args=["x"])
    with pytest.raises(TypeError, match="float_workspace_buffer must be an array"):
        fi.BatchDecodeWithPagedKVCacheWrapper(None)
    fi.BatchDecodeWithPagedKVCacheWrapper(WS, backend="fa3")  # runs cuinfer's kernel
    with pytest.warns(DeprecationWarning, match="q_len_per_req"), pytest.raises(ValueError, match="q.shape\\[0\\]"):
        w.run(q, cache, q_len_per_req=2)


# ---- batch prefill ---------------------------------------------------------------------------------------------------

PREFILL_OPTIONS = [
    pytest.param({"causal": True}, {"causal": True}, id="causal"),
    pytest.param({}, {}, id="non-causal"),
    pytest.param(
        {"causal": True, "window_left": 6, "logits_soft_cap": 30.0},
        {"causal": True, "window_left": 6, "logits_soft_cap": 30.0},
        id="window-softcap",
    ),  # fmt: skip
    pytest.param(
        {"causal": True, "pos_encoding_mode": "ROPE_LLAMA", "rope_scale": 2.0},
        {"causal": True, "pos_encoding": "rope_llama", "rope_scale": 2.0},
        id="rope",
    ),  # fmt: skip
]
QO_LENS, KV_LENS = [5, 1, 12, 0], [21, 40, 12, 9]


def _qo_indptr(qo_lens):
    return np.cumsum([0, *qo_lens]).astype(np.int32)


@pytest.mark.parametrize(("fi_opts", "ref_opts"), PREFILL_OPTIONS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dt", list(DTYPES))
def test_paged_prefill_matches_reference(rng, fi_opts, ref_opts, layout, dt):
    dtype = DTYPES[dt]
    cache, indptr, indices, last = paged(rng, KV_LENS, 8, 2, 64, dtype, layout)
    qo = _qo_indptr(QO_LENS)
    q = rng.standard_normal((qo[-1], 4, 64)).astype(dtype)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(WS, layout)
    w.plan(qo, indptr, indices, last, 4, 2, 64, 8, q_data_type=np.dtype(dtype), **fi_opts)
    want = R.batch_prefill_paged(q, cache, qo, indptr, indices, last, kv_layout=layout, **ref_opts)
    same(w.run(q, cache, return_lse=True), (want[0].astype(dtype), want[1]))


@pytest.mark.parametrize(("fi_opts", "ref_opts"), PREFILL_OPTIONS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_ragged_prefill_matches_reference(rng, fi_opts, ref_opts, layout):
    qo, kv = _qo_indptr(QO_LENS), _qo_indptr(KV_LENS)
    q = rng.standard_normal((qo[-1], 4, 64)).astype(np.float16)
    k = rng.standard_normal((kv[-1], 2, 64)).astype(np.float16)
    v = rng.standard_normal((kv[-1], 2, 64)).astype(np.float16)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy())
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(WS, layout)
    w.plan(qo, kv, 4, 2, 64, **fi_opts)
    want = R.batch_attention_ragged(q, k, v, qo, kv, **ref_opts)
    same(w.run(q, kk, vv, return_lse=True), (want[0].astype(np.float16), want[1]))
    # q/k/v/o scales act on fp8 / NVFP4 K/V only in FlashInfer's ragged path: with 16-bit K/V they change nothing
    same(w.run(q, kk, vv, q_scale=2.0, k_scale=0.5, v_scale=3.0, o_scale=2.0, return_lse=True),
         (want[0].astype(np.float16), want[1]))  # fmt: skip


def test_prefill_alibi_is_flashinfers_with_the_soft_cap_after_it(rng):
    """ALiBi as FlashInfer computes it, against float64 attention written here: the logit
    ``q·k·sm_scale + slope_h·(j − i)`` (i the query's index within its request, not its position), then the soft
    cap, causal bottom-right; lse base 2. Paged and ragged (qo_len < kv_len, so the conventions differ)."""
    qo_lens, kv_lens, hq, hkv, d, cap = [5, 1, 12], [21, 40, 12], 4, 2, 64, 3.0
    cache, indptr, indices, last = paged(rng, kv_lens, 8, hkv, d, np.float16)
    qo = _qo_indptr(qo_lens)
    q = rng.standard_normal((qo[-1], hq, d)).astype(np.float16)
    slopes = R.alibi_slopes(hq)
    want_o, want_lse = np.zeros((qo[-1], hq, d)), np.zeros((qo[-1], hq))
    ks, vs = [], []
    for b, (lq, lk) in enumerate(zip(qo_lens, kv_lens, strict=True)):
        pages = indices[indptr[b] : indptr[b + 1]]
        k = cache[pages, 0].reshape(-1, hkv, d)[:lk].astype(np.float64)
        v = cache[pages, 1].reshape(-1, hkv, d)[:lk].astype(np.float64)
        ks.append(k), vs.append(v)
        for i in range(lq):
            for h in range(hq):
                s = k[:, h // (hq // hkv)] @ q[qo[b] + i, h].astype(np.float64) / math.sqrt(d)
                s = s + slopes[h] * (np.arange(lk) - i)
                s = cap * np.tanh(s / cap)
                s[np.arange(lk) > i + lk - lq] = -np.inf
                p = np.exp(s - s.max())
                want_o[qo[b] + i, h] = p @ v[:, h // (hq // hkv)] / p.sum()
                want_lse[qo[b] + i, h] = (s.max() + np.log(p.sum())) / math.log(2.0)
    opts = dict(causal=True, pos_encoding_mode="ALIBI", logits_soft_cap=cap)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(WS)
    w.plan(qo, indptr, indices, last, hq, hkv, d, 8, q_data_type=np.float16, **opts)
    runs = [w.run(q, cache, return_lse=True)]
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(WS)
    r.plan(qo, _qo_indptr(kv_lens), hq, hkv, d, **opts)
    k, v = (np.concatenate(x).astype(np.float16) for x in (ks, vs))
    runs.append(r.run(q, k, v, return_lse=True))
    for o, lse in runs:
        np.testing.assert_allclose(np.asarray(o, np.float64), want_o, rtol=2**-10, atol=1e-5)
        np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=1e-5)


def _mask(rng, qo_lens, kv_lens):
    return np.concatenate([rng.random(a * b) < 0.6 for a, b in zip(qo_lens, kv_lens, strict=True)])


def test_custom_mask_replaces_causal_and_packed_form(rng):
    """FlashInfer: a custom mask replaces ``causal``; ``packed_custom_mask`` (segment_packbits, little) wins over
    ``custom_mask``."""
    cache, indptr, indices, last = paged(rng, KV_LENS, 8, 2, 64, np.float16)
    qo = _qo_indptr(QO_LENS)
    q = rng.standard_normal((qo[-1], 4, 64)).astype(np.float16)
    mask = _mask(rng, QO_LENS, KV_LENS)
    want = R.batch_prefill_paged(q, cache, qo, indptr, indices, last, custom_mask=mask)
    want = (want[0].astype(np.float16), want[1])
    w = fi.BatchPrefillWithPagedKVCacheWrapper(WS)
    w.plan(qo, indptr, indices, last, 4, 2, 64, 8, custom_mask=mask, causal=True)
    same(w.run(q, cache, return_lse=True), want)
    bits = np.cumsum([0, *(a * b for a, b in zip(QO_LENS, KV_LENS, strict=True))])
    packed, _ = fi.segment_packbits(mask, bits, bitorder="little")
    w.plan(qo, indptr, indices, last, 4, 2, 64, 8, custom_mask=~mask, packed_custom_mask=packed, causal=True)
    same(w.run(q, cache, return_lse=True), want)
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(WS)
    kv = _qo_indptr(KV_LENS)
    k = rng.standard_normal((kv[-1], 2, 64)).astype(np.float16)
    r.plan(qo, kv, 4, 2, 64, custom_mask=mask, causal=True)
    want = R.batch_attention_ragged(q, k, k, qo, kv, custom_mask=mask)
    same(r.run(q, k, k, return_lse=True), (want[0].astype(np.float16), want[1]))


@pytest.mark.parametrize("lse_base", ["log2", "ln"])
@pytest.mark.parametrize("lse_layout", ["NH", "HN"])
@pytest.mark.parametrize("given", [False, True], ids=["new-lse", "lse-given"])
def test_prefill_lse_base_and_layout(rng, lse_base, lse_layout, given):
    qo, kv = _qo_indptr(QO_LENS), _qo_indptr(KV_LENS)
    q = rng.standard_normal((qo[-1], 4, 64)).astype(np.float16)
    k = rng.standard_normal((kv[-1], 2, 64)).astype(np.float16)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(WS)
    w.plan(qo, kv, 4, 2, 64, causal=True)
    base2 = w.run(q, k, k, return_lse=True)[1]
    want = base2 * np.float32(math.log(2)) if lse_base == "ln" else base2
    want = np.ascontiguousarray(want.T) if lse_layout == "HN" else want
    buf = np.full(want.shape, np.nan, np.float32) if given else None
    o, lse = w.run(q, k, k, lse=buf, return_lse=True, lse_base=lse_base, lse_layout=lse_layout)
    assert lse.shape == want.shape and lse.flags.c_contiguous and (not given or lse is buf)
    np.testing.assert_allclose(lse, want, rtol=1e-6)
    with pytest.raises(ValueError, match="lse_base must be one of"):
        w.run(q, k, k, return_lse=True, lse_base="e")
    with pytest.raises(ValueError, match="lse_layout must be one of"):
        w.run(q, k, k, return_lse=True, lse_layout="HNH")


def test_paged_prefill_scales_forward_and_refusals(rng):
    cache, indptr, indices, last = paged(rng, KV_LENS, 8, 2, 64, np.float16)
    qo = _qo_indptr(QO_LENS)
    q = rng.standard_normal((qo[-1], 4, 64)).astype(np.float16)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(WS)
    w.plan(qo, indptr, indices, last, 4, 2, 64, 8, causal=True, fixed_split_size=2, disable_split_kv=True,
           seq_lens=np.array(KV_LENS), uniform_q_len=3)  # fmt: skip
    o = w.run(q, cache)
    np.testing.assert_array_equal(w.run(q, cache, v_scale=2.0), o * np.float16(2))  # FlashInfer: out *= v_scale
    np.testing.assert_array_equal(w.run(q, cache, q_scale=1.0, k_scale=1.0), o)
    with pytest.raises(NotImplementedError, match="q_scale_k_scale=0.5.*sm_scale=sm_scale \\* q_scale \\* k_scale"):
        w.run(q, cache, k_scale=0.5)
    # forward(): the options replace the plan's, and its k_scale goes into sm_scale
    want = R.batch_prefill_paged(q, cache, qo, indptr, indices, last, sm_scale=0.5 / 8, window_left=4)[0]
    np.testing.assert_array_equal(w.forward(q, cache, k_scale=0.5, window_left=4), want.astype(np.float16))
    o2, lse2 = w.forward_return_lse(q, cache, causal=True, v_scale=2.0)
    np.testing.assert_array_equal(o2, o * np.float16(2))
    for kw, what in ((dict(use_fp16_qk_reduction=True), "use_fp16_qk_reduction"),
                     (dict(prefix_len_ptr=np.zeros(4, np.uint32)), "prefix_len_ptr"),
                     (dict(token_pos_in_items_ptr=np.zeros(4, np.uint16)), "token_pos_in_items_ptr")):  # fmt: skip
        with pytest.raises(NotImplementedError, match=f"{what}=.*not covered"):
            w.plan(qo, indptr, indices, last, 4, 2, 64, 8, **kw)
    for kw, what in ((dict(use_fp16_softmax=True), "use_fp16_softmax"), (dict(sinks=np.zeros(4)), "sinks")):
        with pytest.raises(NotImplementedError, match=f"{what}=.*not covered"):
            w.run(q, cache, **kw)
    with pytest.raises(ValueError, match="variant_owns_mask is only supported on the fa2 backend"):
        fi.BatchPrefillWithPagedKVCacheWrapper(WS, variant_owns_mask=True)
    with pytest.raises(ValueError, match="variant_owns_mask requires a custom JIT module"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(WS, backend="fa2", variant_owns_mask=True)
    with pytest.raises(NotImplementedError, match="backend='cudnn'"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(WS, backend="cudnn")


def test_prefill_cuda_graph_rules(rng):
    qo, kv = _qo_indptr(QO_LENS), _qo_indptr(KV_LENS)
    q = rng.standard_normal((qo[-1], 4, 64)).astype(np.float16)
    k = rng.standard_normal((kv[-1], 2, 64)).astype(np.float16)
    with pytest.raises(ValueError, match="qo_indptr_buf should be a torch.Tensor in cuda graph mode"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(WS, use_cuda_graph=True)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(WS, "NHD", True, np.zeros(5, np.int32), np.zeros(5, np.int32))
    w.plan(qo, kv, 4, 2, 64, causal=True)
    np.testing.assert_array_equal(w.run(q, k, k), R.batch_attention_ragged(q, k, k, qo, kv, causal=True)[0]
                                  .astype(np.float16))  # fmt: skip
    with pytest.raises(ValueError, match="total number of rows in qo_indptr 19 .* cannot exceed .* 18"):
        w.plan(_qo_indptr([6, 1, 12, 0]), kv, 4, 2, 64, causal=True)
    with pytest.raises(ValueError, match="batch size should be fixed"):
        w.plan(qo[:4], kv[:4], 4, 2, 64)
    with pytest.raises(ValueError, match="custom_mask_buf and mask_indptr_buf must be initialized"):
        w.plan(qo, kv, 4, 2, 64, custom_mask=_mask(rng, QO_LENS, KV_LENS))
    cache, indptr, indices, last = paged(rng, KV_LENS, 8, 2, 64, np.float16)
    p = fi.BatchPrefillWithPagedKVCacheWrapper(WS, "NHD", True, *(np.zeros(n, np.int32) for n in (5, 5, 16, 4)))
    p.plan(qo, indptr, indices, last, 4, 2, 64, 8)
    with pytest.raises(ValueError, match="length of paged_kv_indices exceeds the allocated buffer"):
        p.plan(qo, indptr, np.zeros(17, np.int32), last, 4, 2, 64, 8)


# ---- single-request functions ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode_matches_reference(rng, layout):
    q = rng.standard_normal((8, 64)).astype(np.float16)
    k = rng.standard_normal((50, 2, 64)).astype(np.float16)
    v = rng.standard_normal((50, 2, 64)).astype(np.float16)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy())
    o, lse = fi.single_decode_with_kv_cache(q, kk, vv, layout, "ROPE_LLAMA", True, 2.0, 0.5, 3.0, 20, 40.0,
                                            None, None, 1e5, True)  # fmt: skip
    want = R.attention(q[None], k, v, pos_encoding="rope_llama", window_left=20, logits_soft_cap=40.0,
                       sm_scale=1 / 8, rope_theta=1e5)  # fmt: skip
    np.testing.assert_array_equal(o, (want[0][0].astype(np.float16) * np.float16(3.0)))
    np.testing.assert_array_equal(lse, want[1][0].astype(np.float32))
    assert fi.single_decode_with_kv_cache(q, kk, vv, layout).shape == (8, 64)


def test_single_prefill_matches_reference(rng):
    q = rng.standard_normal((9, 4, 64)).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((30, 2, 64)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((30, 2, 64)).astype(ml_dtypes.bfloat16)
    o, lse = fi.single_prefill_with_kv_cache_return_lse(q, k, v, causal=True, window_left=12, k_scale=0.5,
                                                        v_scale=2.0)  # fmt: skip
    want = R.attention(q, k, v, causal=True, window_left=12, sm_scale=0.5 / 8)
    np.testing.assert_array_equal(o, want[0].astype(q.dtype) * ml_dtypes.bfloat16(2))
    np.testing.assert_array_equal(lse, want[1].astype(np.float32))
    mask = rng.random((9, 30)) < 0.5
    want = R.attention(q, k, v, custom_mask=mask)[0].astype(q.dtype)
    np.testing.assert_array_equal(fi.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, causal=True), want)
    packed = fi.packbits(mask.reshape(-1), bitorder="little")
    np.testing.assert_array_equal(fi.single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packed), want)
    with pytest.raises(NotImplementedError, match="scale_q=.*fp8"):
        fi.single_prefill_with_kv_cache(q, k, v, scale_q=np.ones(4, np.float32))
    with pytest.raises(NotImplementedError, match="o_dtype=.*o_data_type"):
        fi.single_prefill_with_kv_cache(q, k, v, o_dtype="float16")
    fi.single_prefill_with_kv_cache(q, k, v, o_dtype="bfloat16", backend="fa3")  # q's dtype: fine
    with pytest.raises(NotImplementedError, match="use_fp16_qk_reduction=True"):
        fi.single_prefill_with_kv_cache(q, k, v, use_fp16_qk_reduction=True)


# ---- merges ----------------------------------------------------------------------------------------------------------


def test_merges_keep_flashinfer_dtypes(rng):
    va, vb = (rng.standard_normal((7, 3, 64)).astype(np.float16) for _ in range(2))
    sa, sb = rng.standard_normal((7, 3)), rng.standard_normal((7, 3)).astype(np.float32)  # sa float64: converted
    v, s = fi.merge_state(va, sa, vb, sb)
    want = R.merge_state(va, sa.astype(np.float32), vb, sb)
    assert v.dtype == np.float16 and s.dtype == np.float32
    np.testing.assert_array_equal(v, want[0].astype(np.float16))
    vs = rng.standard_normal((7, 5, 3, 64)).astype(np.float16)
    ss = rng.standard_normal((7, 5, 3)).astype(np.float32)
    v, s = fi.merge_states(vs, ss)
    assert v.dtype == np.float16 and v.shape == (7, 3, 64) and s.dtype == np.float32
    mask = np.arange(7) % 2 == 0
    v0, s0 = va.copy(), sa.astype(np.float32)
    fi.merge_state_in_place(v0, s0, vb, sb, mask=mask)
    np.testing.assert_array_equal(v0[~mask], va[~mask])
    np.testing.assert_allclose(s0[mask], want[1][mask], rtol=1e-6)


# ---- utilities -------------------------------------------------------------------------------------------------------


def test_utilities_on_numpy(rng):
    x = rng.random(29) < 0.5
    np.testing.assert_array_equal(fi.packbits(x), np.packbits(x))  # FlashInfer's default bitorder is "big"
    np.testing.assert_array_equal(fi.packbits(x, "little"), np.packbits(x, bitorder="little"))
    packed, new_indptr = fi.segment_packbits(x, np.array([0, 9, 9, 29]))
    np.testing.assert_array_equal(new_indptr, [0, 2, 2, 5])
    np.testing.assert_array_equal(packed, np.concatenate([np.packbits(x[:9]), np.packbits(x[9:])]))
    indptr, last = np.array([0, 2, 2, 5], np.int32), np.array([3, 1, 16], np.int32)
    lens = fi.get_seq_lens(indptr, last, 16)
    np.testing.assert_array_equal(lens, [19, 1, 48])  # (an empty request gives its last_page_len, as FlashInfer)
    assert lens.dtype == np.int32
    b_out, p_out = np.zeros(6, np.int32), np.full(6, 7, np.int32)
    b, p = fi.get_batch_indices_positions(np.array([0, 2, 5]), np.array([10, 3]), 6, b_out, p_out)
    assert b is b_out and p is p_out
    np.testing.assert_array_equal(b, [0, 0, 1, 1, 1, -1])
    np.testing.assert_array_equal(p, [8, 9, 0, 1, 2, 7])  # FlashInfer leaves a padding row's position unwritten
    b, p = fi.get_batch_indices_positions(np.array([0, 2, 5]), np.array([10, 3]), 7)
    np.testing.assert_array_equal(b, [0, 0, 1, 1, 1, -1, -1])
    np.testing.assert_array_equal(p, [8, 9, 0, 1, 2, 0, 0])  # ... in the zeros it allocates
    assert p.dtype == np.int32
    q = rng.standard_normal((7, 4, 64)).astype(np.float16)
    k = rng.standard_normal((7, 2, 64)).astype(np.float16)
    qr, kr = fi.apply_rope(q, k, np.array([0, 3, 7]), np.array([5, 0]), rotary_dim=32, interleave=True)
    want = R.apply_rope(q, k, [0, 3, 7], [5, 0], rotary_dim=32, interleave=True)
    assert qr.dtype == np.float16 and kr.dtype == np.float16
    np.testing.assert_array_equal(qr, want[0].astype(np.float16))
    qr, kr = fi.apply_rope_pos_ids(q, k, np.arange(7), rope_theta=5e5)
    np.testing.assert_array_equal(kr, R.apply_rope_pos_ids(q, k, np.arange(7), rope_theta=5e5)[1].astype(np.float16))
    cache, kv_indptr, kv_indices, kv_last = paged(rng, [10, 3], 4, 2, 64, np.float16, spare=0)
    fi.append_paged_kv_cache(k[:5], k[:5], b[:5], p[:5], cache, kv_indices, kv_indptr, kv_last)
    page = kv_indices[kv_indptr[1]]
    np.testing.assert_array_equal(cache[page, 0, :3], k[2:5])  # request 1's positions 0..2


# RoPE and the append against the float64 formulas of test_utilities_cpu.py (written from FlashInfer's definition and
# Meta's apply_scaling, independent of cuinfer's code): pair j of the first rotary_dim dims, (j, j + rotary_dim / 2)
# or (2j, 2j + 1) with interleave, turns by pos * freq_j; the other dims pass unchanged.


def rope64(x, pos, rotary_dim, interleave, rope_scale, rope_theta, llama31=None):
    if llama31 is None:
        freqs = plain_freqs(rotary_dim, rope_scale, rope_theta)
    else:
        freqs = llama31_freqs(rotary_dim, rope_scale, rope_theta, *llama31)
    return exact_rope(x, pos, rotary_dim, interleave, freqs)


def rotate64(x, cos, sin, rotary_dim, interleave):
    """x [nnz, heads, dim] turned by the given cos / sin [nnz, rotary_dim / 2] (a cos/sin cache's rows), each pair
    multiplied as a complex number by cos + i sin."""
    out = np.asarray(x, np.float64).copy()
    h = rotary_dim // 2
    first, second = (
        (slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)) if interleave else (slice(0, h), slice(h, rotary_dim))
    )
    turned = (out[..., first] + 1j * out[..., second]) * (cos + 1j * sin)[:, None, :]
    out[..., first], out[..., second] = turned.real, turned.imag
    return out


LLAMA31_DEFAULTS = (8.0, 5e5, (1.0, 4.0, 8192.0))  # FlashInfer's rope_scale, rope_theta, (low, high, old_context_len)


ROPE_FORMS = {  # name -> (positions argument, llama31)
    "apply_rope": ("ragged", False),
    "apply_rope_pos_ids": ("pos_ids", False),
    "apply_llama31_rope": ("ragged", True),
    "apply_llama31_rope_pos_ids": ("pos_ids", True),
}


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
@pytest.mark.parametrize("interleave", [False, True], ids=["rotate_half", "interleave"])
@pytest.mark.parametrize("name", sorted(ROPE_FORMS))
def test_rope_forms_match_the_formula(rng, name, interleave, inplace):
    """Every FlashInfer RoPE form on NumPy arrays, rotary_dim 32 of head_dim 64, against rope64: the dims past
    rotary_dim unchanged bit for bit; the in-place forms write into q and k and return None."""
    kind, llama31 = ROPE_FORMS[name]
    dtype = np.float16 if interleave else ml_dtypes.bfloat16
    lens, offsets = [5, 0, 9], np.array([3, 70, 9000])  # positions past old_context_len / low_freq_factor too
    nnz = sum(lens)
    q = rng.standard_normal((nnz, 4, 64)).astype(dtype)
    k = rng.standard_normal((nnz, 2, 64)).astype(dtype)
    q0, k0 = q.copy(), k.copy()
    if kind == "ragged":
        indptr = np.cumsum([0, *lens])
        pos = np.concatenate([o + np.arange(n) for o, n in zip(offsets, lens, strict=True)])
        where = (indptr, offsets)
    else:
        pos = rng.integers(0, 20000, nnz)
        where = (pos.astype(np.int32),)
    if llama31:
        scale, theta, factors = LLAMA31_DEFAULTS
        opts = {}  # FlashInfer's defaults
    else:
        scale, theta, factors = 2.0, 5e5, None
        opts = dict(rope_scale=2, rope_theta=5e5)
    fn = getattr(fi, name + ("_inplace" if inplace else ""))
    got = fn(q, k, *where, 32, interleave, **opts)  # rotary_dim and interleave positionally, as FlashInfer allows
    if inplace:
        assert got is None
        got = (q, k)
        assert not np.array_equal(q, q0)
    else:
        np.testing.assert_array_equal(q, q0)  # the inputs are left alone
    for out, x in zip(got, (q0, k0), strict=True):
        assert out.dtype == dtype
        assert_rounded_once(out, rope64(x, pos, 32, interleave, scale, theta, factors))
        np.testing.assert_array_equal(out[..., 32:], x[..., 32:])


def test_llama31_options_in_flashinfers_order(rng):
    """rope_scale, rope_theta, low_freq_factor, high_freq_factor, old_context_len positionally, in FlashInfer's
    order; rotary_dim None is the whole head."""
    q = rng.standard_normal((6, 2, 64)).astype(np.float16)
    k = rng.standard_normal((6, 1, 64)).astype(np.float16)
    pos = np.array([0, 1, 500, 1000, 3000, 7000])
    qr, kr = fi.apply_llama31_rope_pos_ids(q, k, pos, None, False, 4, 1e4, 2, 8, 4096)
    assert_rounded_once(qr, rope64(q, pos, 64, False, 4.0, 1e4, (2.0, 8.0, 4096.0)))
    assert_rounded_once(kr, rope64(k, pos, 64, False, 4.0, 1e4, (2.0, 8.0, 4096.0)))
    with pytest.raises(ValueError, match="high_freq_factor must be greater than low_freq_factor"):
        fi.apply_llama31_rope_pos_ids(q, k, pos, high_freq_factor=1)


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "interleave"])
@pytest.mark.parametrize("ndim", [2, 3])
def test_rope_with_cos_sin_cache_matches_the_formula(rng, is_neox, inplace, ndim):
    """vLLM / SGLang's form: query / key [nnz, heads * head_size] (or 3-D), a float32 table of any angles, rows
    [cos_0 .. cos_{r/2-1}, sin_0 .. sin_{r/2-1}]; rotary_dim 32 (the table's width) of head_size 64."""
    nnz, hs, r = 9, 64, 32
    angles = rng.uniform(-10, 10, (50, r // 2))
    table = np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    pos = rng.integers(0, 50, nnz)
    query = rng.standard_normal((nnz, 4, hs)).astype(np.float16)
    key = rng.standard_normal((nnz, 2, hs)).astype(np.float16)
    q0, k0 = query.copy(), key.copy()
    args = (query.reshape(nnz, -1), key.reshape(nnz, -1)) if ndim == 2 else (query, key)  # (views)
    if inplace:
        assert fi.apply_rope_with_cos_sin_cache_inplace(pos, *args, hs, table, is_neox) is None
        got = (query, key)
        assert not np.array_equal(query, q0)
    else:
        got = fi.apply_rope_with_cos_sin_cache(pos, *args, hs, table, is_neox)
        assert got[0].shape == args[0].shape and got[1].shape == args[1].shape
        got = tuple(g.reshape(x.shape) for g, x in zip(got, (q0, k0), strict=True))
    cos, sin = table[pos, : r // 2].astype(np.float64), table[pos, r // 2 :].astype(np.float64)
    for out, x in zip(got, (q0, k0), strict=True):
        assert_rounded_once(out, rotate64(x, cos, sin, r, not is_neox))
        np.testing.assert_array_equal(out[..., r:], x[..., r:])


def test_rope_with_cos_sin_cache_errors(rng):
    pos = np.arange(4)
    table = np.ones((8, 16), np.float32)
    query, key = np.zeros((4, 2, 2, 32), np.float16), np.zeros((4, 64), np.float16)
    with pytest.raises(NotImplementedError, match=r"query of shape \(4, 2, 2, 32\).*not covered.*docs/compat\.md"):
        fi.apply_rope_with_cos_sin_cache(pos, query, key, 32, table)  # FlashInfer would view it as [4, 4, 32]
    with pytest.raises(NotImplementedError, match=r"key of shape \(4, 1, 64\)"):
        fi.apply_rope_with_cos_sin_cache_inplace(pos, key, key.reshape(4, 1, 64), 32, table)
    with pytest.raises(ValueError, match="cos_sin_cache must have dtype float32"):  # FlashInfer: a ValueError too
        fi.apply_rope_with_cos_sin_cache(pos, key, key, 32, table.astype(np.float64))


def test_rope_inplace_refuses_a_read_only_array(rng):
    q = rng.standard_normal((3, 2, 64)).astype(np.float16)
    q.flags.writeable = False
    with pytest.raises(ValueError, match="q must be writable"):
        fi.apply_rope_pos_ids_inplace(q, q.copy(), np.arange(3))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["5d", "tuple", "page_size_1"])
def test_append_paged_kv_cache_in_flashinfers_order(rng, layout, form):
    """FlashInfer's argument names and order, every cache form; each row lands where the page table says (page
    kv_indices[kv_indptr[b] + pos // page_size], slot pos % page_size: expected_append's loop); nothing else moves,
    padding rows included."""
    page_size = 1 if form == "page_size_1" else 4
    kv_lens, append = [10, 3, 7], [4, 3, 0]
    cache, kv_indptr, kv_indices, kv_last = paged(rng, kv_lens, page_size, 2, 64, np.float16, layout)
    before = cache.copy()
    append_indptr = np.cumsum([0, *append])
    b, p = fi.get_batch_indices_positions(append_indptr, np.array(kv_lens), sum(append) + 2)  # 2 padding rows
    key = rng.standard_normal((len(b), 2, 64)).astype(np.float16)
    value = rng.standard_normal((len(b), 2, 64)).astype(np.float16)
    if form == "5d":
        arg = cache
    elif form == "tuple":
        arg = (cache[:, 0], cache[:, 1])
    else:  # [pages, 2, heads, dim]: FlashInfer's page-size-1 shorthand
        arg = cache[:, :, 0] if layout == "NHD" else cache[..., 0, :]
    got = fi.append_paged_kv_cache(
        append_key=key, append_value=value, batch_indices=b, positions=p, paged_kv_cache=arg, kv_indices=kv_indices,
        kv_indptr=kv_indptr, kv_last_page_len=kv_last, kv_layout=layout,
    )  # fmt: skip
    assert got is None
    want = before.copy()
    expected_append(want[:, 0], want[:, 1], key, value, b, p, kv_indices, kv_indptr, page_size, layout)
    np.testing.assert_array_equal(cache, want)


def test_append_paged_kv_cache_refusals(rng):
    cache, kv_indptr, kv_indices, kv_last = paged(rng, [4], 4, 2, 64, np.float16)
    key = np.zeros((1, 2, 64), ml_dtypes.float8_e4m3fn)
    b, p = np.array([0]), np.array([3])
    # FlashInfer reads the rows as the cache's dtype: fp8 rows go into an fp8 cache as they are (cuinfer's 16-bit
    # rows quantised with scales are not FlashInfer's append)
    c8 = cache.astype(ml_dtypes.float8_e4m3fn)
    key = (rng.standard_normal((1, 2, 64)) * 100).astype(ml_dtypes.float8_e4m3fn)
    fi.append_paged_kv_cache(key, key, b, p, c8, kv_indices, kv_indptr, kv_last)
    np.testing.assert_array_equal(c8[kv_indices[0], 0, 3].view(np.uint8), key[0].view(np.uint8))
    np.testing.assert_array_equal(c8[kv_indices[0], 1, 3].view(np.uint8), key[0].view(np.uint8))
    with pytest.raises(KeyError, match="Invalid kv_layout 'nhd'"):  # FlashInfer's KeyError
        fi.append_paged_kv_cache(key, key, b, p, cache, kv_indices, kv_indptr, kv_last, "nhd")


def test_packbits_reads_any_dtype_as_nonzero(rng):
    x = rng.integers(0, 3, 21).astype(np.int32)
    np.testing.assert_array_equal(fi.packbits(x), np.packbits(x != 0))  # FlashInfer's x.to(torch.bool)


class DeviceArray:
    """Stands for a CUDA tensor (not a host array): what the drop-in passes to cuinfer is recorded, not run."""

    shape = (8, 2, 64)


DEV = DeviceArray()
L31 = dict(low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192.0)
# FlashInfer call (arguments after the arrays) -> cuinfer's function, its positional arrays and its keywords
TRANSLATIONS = {
    "packbits": ((), (DEV,), dict(bitorder="big")),
    "segment_packbits": ((DEV,), (DEV, DEV), dict(bitorder="big")),
    "get_batch_indices_positions": ((DEV, 8), (DEV, DEV, 8), {}),
    "append_paged_kv_cache": ((DEV,) * 7, (DEV,) * 8, dict(kv_layout="NHD")),
    "apply_rope": ((DEV, DEV, DEV), (DEV,) * 4,
                   dict(rotary_dim=None, interleave=False, rope_scale=1.0, rope_theta=1e4)),
    "apply_rope_inplace": ((DEV, DEV, DEV, 32, True, 2, 5e5), (DEV,) * 4,
                           dict(rotary_dim=32, interleave=True, rope_scale=2.0, rope_theta=5e5)),
    "apply_rope_pos_ids": ((DEV, DEV), (DEV,) * 3,
                           dict(rotary_dim=None, interleave=False, rope_scale=1.0, rope_theta=1e4)),
    "apply_rope_pos_ids_inplace": ((DEV, DEV, 16), (DEV,) * 3,
                                   dict(rotary_dim=16, interleave=False, rope_scale=1.0, rope_theta=1e4)),
    "apply_llama31_rope": ((DEV, DEV, DEV), (DEV,) * 4,
                           dict(rotary_dim=None, interleave=False, rope_scale=8.0, rope_theta=5e5, **L31)),
    "apply_llama31_rope_inplace": ((DEV, DEV, DEV, None, False, 16, 1e6, 2, 8, 4096), (DEV,) * 4,
                                   dict(rotary_dim=None, interleave=False, rope_scale=16.0, rope_theta=1e6,
                                        low_freq_factor=2.0, high_freq_factor=8.0, old_context_len=4096.0)),
    "apply_llama31_rope_pos_ids": ((DEV, DEV), (DEV,) * 3,
                                   dict(rotary_dim=None, interleave=False, rope_scale=8.0, rope_theta=5e5, **L31)),
    "apply_llama31_rope_pos_ids_inplace": ((DEV, DEV, 64, True), (DEV,) * 3,
                                           dict(rotary_dim=64, interleave=True, rope_scale=8.0, rope_theta=5e5,
                                                **L31)),
    "apply_rope_with_cos_sin_cache": ((DEV, DEV, 64, DEV), (DEV, DEV, DEV, 64, DEV), dict(is_neox=True)),
    "apply_rope_with_cos_sin_cache_inplace": ((DEV, DEV, 64, DEV, False), (DEV, DEV, DEV, 64, DEV),
                                              dict(is_neox=False)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TRANSLATIONS))
def test_utilities_call_cuinfers_functions(monkeypatch, name):
    """Each FlashInfer utility calls cuinfer's function of the same name (the GPU kernels for device arrays) with
    FlashInfer's positional options as cuinfer's keywords and FlashInfer's defaults (packbits: bitorder "big")."""
    seen = []
    result = (np.zeros(8, np.int32), np.zeros(8, np.int32))
    monkeypatch.setattr(cuinfer, name, lambda *args, **kwargs: seen.append((args, kwargs)) or result)
    rest, want_args, want_kwargs = TRANSLATIONS[name]
    getattr(fi, name)(DEV, *rest)
    assert len(seen) == 1
    args, kwargs = seen[0]
    assert all(a is b for a, b in zip(args, want_args, strict=True)) and len(args) == len(want_args)
    assert kwargs == want_kwargs
    assert all(type(v) is type(want_kwargs[n]) for n, v in kwargs.items())  # floats as floats, as FlashInfer passes


def test_invalid_option_error_is_key_and_value_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        err = pytest.raises(KeyError, fi.BatchPrefillWithRaggedKVCacheWrapper, WS, "XYZ").value
    assert isinstance(err, ValueError) and str(err).startswith("Invalid kv_layout 'XYZ'")
