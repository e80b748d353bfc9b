"""Every bad input to BatchPrefill / single_prefill raises before any launch, naming the rule, the value received and
the fix. Runs without a GPU: plan() needs none, and NumPy arrays take the CPU reference path of run(), which applies
the same checks as the GPU path."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuinfer.prefill import BatchPrefill, single_prefill

BF16 = ml_dtypes.bfloat16


def _ragged(rng, qo=(5, 9), kv=(7, 13), hq=4, hkv=2, d=64, dvo=None):
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32)
    q = rng.standard_normal((int(qo_indptr[-1]), hq, d)).astype(BF16)
    k = rng.standard_normal((int(kv_indptr[-1]), hkv, d)).astype(BF16)
    v = rng.standard_normal((int(kv_indptr[-1]), hkv, dvo or d)).astype(BF16)
    return qo_indptr, kv_indptr, q, k, v


def _planned(rng, **kw):
    qo_indptr, kv_indptr, q, k, v = _ragged(rng)
    w = BatchPrefill(paged=False)
    w.plan(qo_indptr, kv_indptr, num_qo_heads=4, num_kv_heads=2, head_dim=64, q_dtype="bfloat16", **kw)
    return w, q, k, v


PLAN = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, q_dtype="bfloat16")


# ---- plan() ------------------------------------------------------------------------------------------------------


def test_non_monotone_qo_indptr():
    with pytest.raises(
        ValueError, match=r"qo_indptr must be non-decreasing but qo_indptr\[1\] = 9 > qo_indptr\[2\] = 4"
    ):
        BatchPrefill(paged=False).plan([0, 9, 4], [0, 3, 6], **PLAN)


def test_non_monotone_kv_indptr():
    with pytest.raises(ValueError, match=r"kv_indptr must be non-decreasing"):
        BatchPrefill(paged=False).plan([0, 2, 4], [0, 5, 3], **PLAN)


def test_indptr_not_starting_at_zero():
    with pytest.raises(ValueError, match="qo_indptr must start at 0 but starts at 3"):
        BatchPrefill(paged=False).plan([3, 5], [0, 4], **PLAN)


def test_batch_sizes_disagree():
    with pytest.raises(ValueError, match=r"kv_indptr must have 3 entries but has 4; one entry per request"):
        BatchPrefill(paged=False).plan([0, 2, 4], [0, 3, 6, 9], **PLAN)


def test_paged_batch_sizes_disagree_with_last_page_len():
    with pytest.raises(ValueError, match=r"kv_last_page_len must have 2 entries but has 3"):
        BatchPrefill(paged=True).plan([0, 2, 4], [0, 1, 2], [0, 1], [1, 1, 1], page_size=4, **PLAN)


def test_paged_needs_page_table():
    with pytest.raises(ValueError, match="needs kv_indices and kv_last_page_len"):
        BatchPrefill(paged=True).plan([0, 2], [0, 1], page_size=4, **PLAN)


def test_last_page_len_out_of_range():
    with pytest.raises(ValueError, match=r"kv_last_page_len\[1\] must be in \[1, page_size=4\] .* but is 5"):
        BatchPrefill(paged=True).plan([0, 2, 4], [0, 1, 2], [0, 1], [4, 5], page_size=4, **PLAN)


def test_too_few_page_indices():
    with pytest.raises(ValueError, match="kv_indices must have at least 3 entries but has 2"):
        BatchPrefill(paged=True).plan([0, 2, 4], [0, 1, 3], [0, 1], [4, 2], page_size=4, **PLAN)


@pytest.mark.parametrize(("d", "dvo"), [(96, None), (128, 64), (512, None), (192, 192)])
def test_unsupported_head_dim(d, dvo):
    with pytest.raises(ValueError, match=rf"head_dim={d}, head_dim_vo={dvo or d} is not supported .* pad the heads"):
        BatchPrefill(paged=False).plan(
            [0, 2], [0, 3], num_qo_heads=4, num_kv_heads=2, head_dim=d, head_dim_vo=dvo, q_dtype="bfloat16"
        )


def test_gqa_heads_not_divisible():
    with pytest.raises(ValueError, match=r"num_qo_heads \(6\) must be a multiple of num_kv_heads \(4\)"):
        BatchPrefill(paged=False).plan([0, 2], [0, 3], num_qo_heads=6, num_kv_heads=4, head_dim=64, q_dtype="float16")


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        pytest.param(dict(window_left=-2), ValueError, "window_left must be an integer >= -1", id="window"),
        pytest.param(dict(logits_soft_cap=-1.0), ValueError, "logits_soft_cap must be >= 0", id="soft-cap"),
        pytest.param(dict(sm_scale=0.0), ValueError, "sm_scale must be a finite number > 0", id="sm-scale"),
        pytest.param(dict(pos_encoding="rotary"), ValueError, "pos_encoding must be one of", id="pos-encoding"),
        pytest.param(dict(q_dtype="float8_e4m3fn"), ValueError, "fp8 is for the KV cache", id="fp8-q"),
        pytest.param(dict(kv_dtype="uint8"), ValueError, "say which fp8 format", id="uint8-kv"),
        pytest.param(
            dict(kv_dtype="float8_e5m2", pos_encoding="rope_llama"),
            NotImplementedError,
            "not supported with an fp8 cache",
            id="fp8-rope",
        ),  # fmt: skip
        pytest.param(dict(kv_dtype="float16"), ValueError, "one 16-bit type", id="mixed-dtypes"),
        pytest.param(dict(o_dtype="float32"), ValueError, "o_dtype must be float16 or bfloat16", id="o-dtype"),
        pytest.param(dict(variant=object()), TypeError, "variant must be a cuinfer.Variant", id="variant"),
        pytest.param(dict(variant="nope"), ValueError, "no variant is registered as 'nope'", id="variant-name"),
        pytest.param(dict(tile_sizes=(48,)), ValueError, "query tile must be one of", id="tile-q"),
        pytest.param(dict(tile_sizes=(16, 32)), ValueError, "multiple of 64", id="tile-kv"),
        pytest.param(dict(tile_sizes=(1, 2, 3, 4, 5)), ValueError, "tile_sizes must be", id="tile-tuple"),
        pytest.param(dict(tile_sizes=(16, 64, 2, 2)), ValueError, "must be 1, or 2 for query tiles", id="groups"),
        pytest.param(dict(fixed_split_size=0), ValueError, "fixed_split_size must be a positive integer", id="split"),
    ],
)
def test_bad_options(kw, exc, match):
    with pytest.raises(exc, match=match):
        BatchPrefill(paged=False).plan([0, 2], [0, 3], **{**PLAN, **kw})


def test_custom_mask_of_the_wrong_size():
    with pytest.raises(ValueError, match=r"custom_mask must hold sum\(qo_len \* kv_len\) = 6 entries .* but has 5"):
        BatchPrefill(paged=False).plan([0, 2], [0, 3], custom_mask=np.ones(5, bool), **PLAN)


def test_packed_custom_mask_of_the_wrong_size():
    with pytest.raises(ValueError, match="packed_custom_mask must be 1-D uint8 with 2 bytes"):
        BatchPrefill(paged=False).plan([0, 2, 3], [0, 3, 5], packed_custom_mask=np.ones(3, np.uint8), **PLAN)


def test_both_mask_forms():
    with pytest.raises(ValueError, match="custom_mask and packed_custom_mask were both given"):
        BatchPrefill(paged=False).plan(
            [0, 2], [0, 3], custom_mask=np.ones(6, bool), packed_custom_mask=np.ones(1, np.uint8), **PLAN
        )


def test_constructor_options():
    with pytest.raises(ValueError, match="backend must be one of auto, fa2, sm90"):
        BatchPrefill(backend="fa3")
    with pytest.raises(ValueError, match="kv_layout must be 'NHD' or 'HND'"):
        BatchPrefill(kv_layout="NDH")
    with pytest.raises(ValueError, match="use_cuda_graph=True needs max_batch_size"):
        BatchPrefill(use_cuda_graph=True)


# ---- run() -------------------------------------------------------------------------------------------------------


def test_run_before_plan(rng):
    _, _, q, k, v = _ragged(rng)
    with pytest.raises(ValueError, match=r"run\(\) needs a plan"):
        BatchPrefill(paged=False).run(q, k, v)


def test_q_rows_differ_from_qo_indptr(rng):
    w, q, k, v = _planned(rng)
    with pytest.raises(ValueError, match=r"q has 13 rows but qo_indptr\[-1\] = 14"):
        w.run(q[:13], k, v)


def test_q_head_count_differs_from_plan(rng):
    w, q, k, v = _planned(rng)
    with pytest.raises(
        ValueError, match=r"q must have shape \(14, 4, 64\) but has shape \(14, 2, 64\); .*num_qo_heads=4"
    ):
        w.run(q[:, :2], k, v)


def test_q_head_dim_differs_from_plan(rng):
    w, q, k, v = _planned(rng)
    q2 = np.concatenate([q, q], axis=2)
    with pytest.raises(ValueError, match=r"plan\(\) was made for num_qo_heads=4, head_dim=64"):
        w.run(q2, k, v)


def test_q_dtype_differs_from_plan(rng):
    w, q, k, v = _planned(rng)
    with pytest.raises(ValueError, match=r"q has dtype float16 but plan\(\) was made for q_dtype=bfloat16"):
        w.run(q.astype(np.float16), k, v)


def test_k_rows_differ_from_kv_indptr(rng):
    w, q, k, v = _planned(rng)
    with pytest.raises(ValueError, match=r"k has 19 tokens but kv_indptr\[-1\] = 20"):
        w.run(q, k[:19], v)


def test_v_rows_differ_from_kv_indptr(rng):
    w, q, k, v = _planned(rng)
    with pytest.raises(ValueError, match=r"v has 21 tokens but kv_indptr\[-1\] = 20"):
        w.run(q, k, np.concatenate([v, v[:1]]))


def test_kv_heads_differ_from_plan(rng):
    w, q, k, v = _planned(rng)
    with pytest.raises(
        ValueError, match=r"k must have shape \(20, 2, 64\) .* but has shape \(20, 1, 64\); .*num_kv_heads=2"
    ):
        w.run(q, k[:, :1], v)


def test_ragged_run_takes_three_arrays(rng):
    w, q, k, v = _planned(rng)
    with pytest.raises(TypeError, match=r"runs as run\(q, k, v\) but got 2 arrays"):
        w.run(q, k)


def test_scales_dequantise_fp8_caches_only(rng):
    w, q, k, v = _planned(rng)
    with pytest.raises(ValueError, match=r"k_scale dequantises fp8 caches but plan\(\) was made for kv_dtype=bfloat16"):
        w.run(q, k, v, k_scale=0.5)


def test_single_prefill_checks(rng):
    q = rng.standard_normal((5, 4, 64)).astype(BF16)
    k = rng.standard_normal((7, 2, 64)).astype(BF16)
    with pytest.raises(ValueError, match="q and k must share head_dim"):
        single_prefill(q, k[:, :, :32], k[:, :, :32])
    with pytest.raises(ValueError, match=r"custom_mask must have shape \(qo_len, kv_len\) = \(5, 7\)"):
        single_prefill(q, k, k, custom_mask=np.ones((5, 6), bool))
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        single_prefill(q[0], k, k)
