"""The float64 reference attention against independent computations: a naive per-element loop, the natural-log
softmax, MHA with repeated heads, and structural facts (causal alignment, windows, empty rows, soft cap bounds)."""

from __future__ import annotations

import cmath
import math

import ml_dtypes
import numpy as np
import pytest

from cuinfer import reference as R
from cuinfer.reference import core as reference_core


def test_the_package_exposes_the_names_of_the_module_it_replaced():
    """``cuinfer.reference`` was one module; its public names (functions, constants, re-exported helpers) stay."""
    names = {n for n in dir(R) if not n.startswith("_") and not isinstance(getattr(R, n), type(R))}
    assert names == set(R.__all__) | {"LOG2E", "POS_ENCODINGS", "page_table", "as_bool_mask", "as_f64", "as_indptr"}
    assert R.attention.__module__ == "cuinfer.reference.core" and R.rope.__module__ == "cuinfer.reference.positional"


@pytest.fixture
def rng(request):
    seed = int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"random seed for {request.node.name}: {seed}")  # shown by pytest when the test fails
    return np.random.default_rng(seed)


def paper_alibi_slopes(n: int) -> list[float]:
    """The ALiBi paper's reference code (ofirpress/attention_with_linear_biases), written independently."""

    def power_of_2(m):
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_alibi_slopes(2 * closest)[0::2][: n - closest]


def naive_rope_vec(x: np.ndarray, pos: float, scale: float, theta: float) -> np.ndarray:
    """Rotate-half RoPE of one head vector, element by element, in complex form."""
    d = x.shape[0]
    half = d // 2
    out = x.copy()
    for i in range(half):
        z = complex(x[i], x[i + half]) * cmath.exp(1j * pos / scale * theta ** (-2 * i / d))
        out[i], out[i + half] = z.real, z.imag
    return out


def naive_attention(
    q,
    k,
    v,
    *,
    causal=False,
    mask=None,
    sm_scale=None,
    cap=0.0,
    window=-1,
    pos="none",
    rope_scale=1.0,
    rope_theta=1e4,
    k_scale=1.0,
    v_scale=1.0,
):
    """Per (row, head, key) loops in plain Python floats."""
    lq, hq, d = q.shape
    lkv, hkv, dv = v.shape
    g = hq // hkv
    scale = (1 / math.sqrt(d) if sm_scale is None else sm_scale) * k_scale
    slopes = paper_alibi_slopes(hq)
    o = np.zeros((lq, hq, dv))
    lse = np.full((lq, hq), -np.inf)
    for i in range(lq):
        qpos = i + lkv - lq
        for h in range(hq):
            kh = h // g
            qv = naive_rope_vec(q[i, h], qpos, rope_scale, rope_theta) if pos == "rope_llama" else q[i, h]
            logits = {}
            for j in range(lkv):
                if causal and j > qpos:
                    continue
                if window >= 0 and j < qpos - window:
                    continue
                if mask is not None and not mask[i, j]:
                    continue
                kv = naive_rope_vec(k[j, kh], j, rope_scale, rope_theta) if pos == "rope_llama" else k[j, kh]
                s = sum(float(qv[t]) * float(kv[t]) for t in range(d)) * scale
                if pos == "alibi":
                    s += slopes[h] * (j - qpos)
                if cap > 0:
                    s = cap * math.tanh(s / cap)
                logits[j] = s
            if not logits:
                continue
            total = sum(math.exp(s) for s in logits.values())
            for j, s in logits.items():
                o[i, h] += math.exp(s) / total * v[j, kh] * v_scale
            lse[i, h] = math.log(total) / math.log(2)
    return o, lse


NAIVE_CASES = [
    pytest.param(dict(lq=3, lkv=7, hq=4, hkv=2, d=8, dv=8), {}, id="plain-gqa2"),
    pytest.param(dict(lq=5, lkv=5, hq=3, hkv=3, d=6, dv=10), dict(causal=True), id="causal-square-dv10"),
    pytest.param(dict(lq=6, lkv=4, hq=2, hkv=1, d=4, dv=4), dict(causal=True), id="causal-qo-gt-kv"),
    pytest.param(dict(lq=4, lkv=9, hq=6, hkv=2, d=8, dv=8), dict(causal=True, window=2), id="causal-window2-gqa3"),
    pytest.param(dict(lq=1, lkv=11, hq=5, hkv=1, d=6, dv=6), dict(window=3), id="decode-window3-mqa"),
    pytest.param(dict(lq=4, lkv=6, hq=2, hkv=2, d=8, dv=8), dict(cap=2.5, sm_scale=0.9), id="softcap-smscale"),
    pytest.param(dict(lq=3, lkv=8, hq=12, hkv=4, d=4, dv=4), dict(pos="alibi", causal=True), id="alibi12-causal"),
    pytest.param(dict(lq=3, lkv=5, hq=8, hkv=8, d=4, dv=4), dict(pos="alibi", cap=1.5), id="alibi8-softcap"),
    pytest.param(
        dict(lq=3, lkv=6, hq=2, hkv=1, d=8, dv=8), dict(pos="rope_llama", rope_scale=2.0, rope_theta=500.0), id="rope"
    ),
    pytest.param(dict(lq=4, lkv=7, hq=2, hkv=1, d=6, dv=6), dict(mask=True, causal=True), id="custom-and-causal"),
    pytest.param(dict(lq=5, lkv=6, hq=4, hkv=2, d=6, dv=3), dict(mask=True, k_scale=0.7, v_scale=1.9), id="kv-scales"),
]


@pytest.mark.parametrize(("shape", "opts"), NAIVE_CASES)
def test_attention_matches_naive_loop(rng, shape, opts):
    q = rng.standard_normal((shape["lq"], shape["hq"], shape["d"]))
    k = rng.standard_normal((shape["lkv"], shape["hkv"], shape["d"]))
    v = rng.standard_normal((shape["lkv"], shape["hkv"], shape["dv"]))
    opts = dict(opts)
    mask = rng.random((shape["lq"], shape["lkv"])) < 0.6 if opts.pop("mask", False) else None
    if mask is not None:
        mask[1] = False  # one row fully masked by the custom mask alone
    want_o, want_lse = naive_attention(q, k, v, mask=mask, **opts)
    o, lse = R.attention(
        q,
        k,
        v,
        causal=opts.get("causal", False),
        custom_mask=mask,
        sm_scale=opts.get("sm_scale"),
        logits_soft_cap=opts.get("cap", 0.0),
        window_left=opts.get("window", -1),
        pos_encoding=opts.get("pos", "none"),
        rope_scale=opts.get("rope_scale", 1.0),
        rope_theta=opts.get("rope_theta", 1e4),
        k_scale=opts.get("k_scale"),
        v_scale=opts.get("v_scale"),
    )
    assert o.dtype == np.float64 and lse.dtype == np.float64
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    np.testing.assert_allclose(o, want_o, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize(
    ("lq", "lkv", "hq", "hkv"), [pytest.param(17, 33, 6, 3, id="17x33"), pytest.param(1, 113, 4, 4, id="decode-113")]
)
def test_lse_is_base2_of_natural_softmax(rng, lq, lkv, hq, hkv):
    d = 16
    q, k, v = rng.standard_normal((lq, hq, d)), rng.standard_normal((lkv, hkv, d)), rng.standard_normal((lkv, hkv, d))
    o, lse = R.attention(q, k, v)
    kk, vv = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kk) / math.sqrt(d)  # natural-log logits
    lse_ln = np.log(np.exp(s).sum(-1)).T  # no max trick: values are small
    np.testing.assert_allclose(lse * math.log(2), lse_ln, rtol=1e-12, atol=1e-13)
    p = np.exp(s - lse_ln.T[..., None])
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(o, np.einsum("hij,jhd->ihd", p, vv), rtol=1e-10, atol=1e-12)


def test_causal_bottom_right_with_more_queries_than_keys(rng):
    lq, lkv, hq, d = 9, 4, 3, 8
    q, k, v = rng.standard_normal((lq, hq, d)), rng.standard_normal((lkv, 1, d)), rng.standard_normal((lkv, 1, d))
    o, lse = R.attention(q, k, v, causal=True)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    n_empty = lq - lkv  # rows i < lq - lkv see no key (j <= i + lkv - lq < 0)
    assert np.all(o[:n_empty] == 0.0)
    assert np.all(lse[:n_empty] == -np.inf)
    assert np.all(np.isfinite(lse[n_empty:]))
    # The first non-empty row sees exactly key 0: softmax over one key returns v[0] and lse = s·log2(e).
    np.testing.assert_allclose(o[n_empty], np.broadcast_to(v[0, 0], (hq, d)), rtol=1e-14, atol=1e-13)
    s0 = q[n_empty] @ k[0, 0] / math.sqrt(d)
    np.testing.assert_allclose(lse[n_empty], s0 / math.log(2), rtol=1e-12, atol=1e-13)
    # Row i equals non-causal attention over the keys 0..i + lkv - lq.
    for i in range(n_empty, lq):
        visible = i + lkv - lq + 1
        o_i, lse_i = R.attention(q[i : i + 1], k[:visible], v[:visible])
        np.testing.assert_allclose(o[i], o_i[0], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(lse[i], lse_i[0], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(
    "window", [pytest.param(0, id="w0"), pytest.param(5, id="w5"), pytest.param(40, id="w40-gt-kv")]
)
def test_decode_window_sees_w_plus_one_keys(rng, window):
    lkv, hq, d = 23, 2, 8
    q, k = rng.standard_normal((1, hq, d)), rng.standard_normal((lkv, 1, d))
    v = np.eye(lkv)[:, None, :]  # v_j = e_j, so o holds the attention weights of the keys
    o, _ = R.attention(q, k, v, window_left=window)
    seen = np.flatnonzero(o[0, 0] > 0)
    expect = np.arange(max(0, lkv - 1 - window), lkv)
    np.testing.assert_array_equal(seen, expect)
    assert seen.size == min(window + 1, lkv)
    np.testing.assert_allclose(o[0].sum(-1), 1.0, rtol=1e-13, atol=1e-13)


def test_soft_cap_bounds_and_exact_form(rng):
    # One key per request: then lse·ln2 is the single final logit, so the cap can be observed directly.
    n, hq, d, cap = 13, 4, 16, 3.0
    q = rng.standard_normal((n, hq, d)) * 30.0  # raw logits far beyond the cap
    k, v = rng.standard_normal((n, 2, d)), rng.standard_normal((n, 2, d))
    indptr = np.arange(n + 1)
    _, lse = R.batch_attention_ragged(q, k, v, indptr, indptr, logits_soft_cap=cap)
    s = lse * math.log(2)
    assert np.all(np.abs(s) < cap)
    raw = np.einsum("nhd,nhd->nh", q, np.repeat(k, 2, axis=1)) / math.sqrt(d)
    assert np.abs(raw).max() > 3 * cap  # the test would be vacuous otherwise
    np.testing.assert_allclose(s, cap * np.tanh(raw / cap), rtol=1e-12, atol=1e-13)


def test_alibi_bias_single_key(rng):
    lkv, hq, d = 19, 12, 8
    q, k, v = rng.standard_normal((1, hq, d)), rng.standard_normal((lkv, 4, d)), rng.standard_normal((lkv, 4, d))
    for j in (0, 7, lkv - 1):
        keep = np.zeros((1, lkv), bool)
        keep[0, j] = True
        _, lse = R.attention(q, k, v, pos_encoding="alibi", custom_mask=keep)
        qk = np.einsum("hd,hd->h", q[0], np.repeat(k[j], 3, axis=0)) / math.sqrt(d)
        want = qk + np.array(paper_alibi_slopes(hq)) * (j - (lkv - 1))
        np.testing.assert_allclose(lse[0] * math.log(2), want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(
    ("hq", "hkv"),
    [
        pytest.param(28, 4, id="28-4"),
        pytest.param(21, 3, id="21-3"),
        pytest.param(5, 1, id="mqa5"),
        pytest.param(7, 7, id="mha7"),
    ],
)
def test_gqa_mapping_matches_repeated_heads(rng, hq, hkv):
    lq, lkv, d = 5, 29, 8
    q, k, v = rng.standard_normal((lq, hq, d)), rng.standard_normal((lkv, hkv, d)), rng.standard_normal((lkv, hkv, d))
    o, lse = R.attention(q, k, v, causal=True, pos_encoding="alibi")
    g = hq // hkv
    o_mha, lse_mha = R.attention(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), causal=True, pos_encoding="alibi")
    np.testing.assert_allclose(o, o_mha, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, lse_mha, rtol=1e-12, atol=1e-13)
    # and head h really uses kv head h // g: a single-head recomputation
    h = hq - 1
    o_h, _ = R.attention(q[:, h : h + 1], k[:, h // g : h // g + 1], v[:, h // g : h // g + 1], causal=True)
    o_full, _ = R.attention(q, k, v, causal=True)
    np.testing.assert_allclose(o_full[:, h], o_h[:, 0], rtol=1e-12, atol=1e-14)


def test_merging_two_kv_halves_equals_whole(rng):
    lq, lkv, hq, hkv, d = 7, 41, 6, 2, 16
    q, k, v = rng.standard_normal((lq, hq, d)), rng.standard_normal((lkv, hkv, d)), rng.standard_normal((lkv, hkv, d))
    mask = rng.random((lq, lkv)) < 0.7
    mask[2, :] = False  # an all-masked row stays empty after the merge
    mask[4, :20] = False  # row 4 is empty in the first half only
    o, lse = R.attention(q, k, v, custom_mask=mask, logits_soft_cap=4.0)
    a = 20
    oa, la = R.attention(q, k[:a], v[:a], custom_mask=mask[:, :a], logits_soft_cap=4.0)
    ob, lb = R.attention(q, k[a:], v[a:], custom_mask=mask[:, a:], logits_soft_cap=4.0)
    assert np.all(la[4] == -np.inf)
    om, lm = R.merge_state(oa, la, ob, lb)
    np.testing.assert_allclose(om, o, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lm, lse, rtol=1e-12, atol=1e-13)
    assert np.all(om[2] == 0.0) and np.all(lm[2] == -np.inf)


def test_chunked_rows_equal_one_block(rng, monkeypatch):
    lq, lkv, hq, d = 37, 53, 4, 8
    q, k, v = rng.standard_normal((lq, hq, d)), rng.standard_normal((lkv, 2, d)), rng.standard_normal((lkv, 2, d))
    opts = dict(causal=True, window_left=9, pos_encoding="rope_llama", logits_soft_cap=5.0)
    o, lse = R.attention(q, k, v, **opts)
    monkeypatch.setattr(reference_core, "_SCORE_BLOCK_ELEMS", hq * lkv * 3)  # 3 query rows per block
    o3, lse3 = R.attention(q, k, v, **opts)
    np.testing.assert_array_equal(o3, o)
    np.testing.assert_array_equal(lse3, lse)


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(ml_dtypes.bfloat16, id="bf16"),
        pytest.param(np.float16, id="fp16"),
        pytest.param(ml_dtypes.float8_e4m3fn, id="e4m3"),
        pytest.param(ml_dtypes.float8_e5m2, id="e5m2"),
    ],
)
def test_low_precision_inputs_cast_exactly(rng, dtype):
    q = rng.standard_normal((3, 4, 8)).astype(dtype)
    k, v = rng.standard_normal((11, 2, 8)).astype(dtype), rng.standard_normal((11, 2, 8)).astype(dtype)
    o, lse = R.attention(q, k, v, causal=True, k_scale=0.5, v_scale=2.0)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    o64, lse64 = R.attention(q64, k64, v64, causal=True, sm_scale=0.5 / math.sqrt(8))
    np.testing.assert_allclose(o, 2.0 * o64, rtol=1e-14, atol=1e-13)
    np.testing.assert_allclose(lse, lse64, rtol=1e-14, atol=1e-13)


def test_batch_ragged_equals_per_request(rng):
    qo_lens = [3, 0, 1, 6, 2]
    kv_lens = [5, 4, 0, 6, 9]
    hq, hkv, d, dv = 6, 2, 8, 5
    qo_indptr, kv_indptr = np.cumsum([0, *qo_lens]), np.cumsum([0, *kv_lens])
    q = rng.standard_normal((qo_indptr[-1], hq, d))
    k, v = rng.standard_normal((kv_indptr[-1], hkv, d)), rng.standard_normal((kv_indptr[-1], hkv, dv))
    masks = [rng.random((a, b)) < 0.5 for a, b in zip(qo_lens, kv_lens, strict=True)]
    flat = np.concatenate([m.ravel() for m in masks])
    opts = dict(causal=True, window_left=3, pos_encoding="alibi")
    o, lse = R.batch_attention_ragged(q, k, v, qo_indptr, kv_indptr, custom_mask=flat, **opts)
    for b in range(len(qo_lens)):
        qs, ks = slice(qo_indptr[b], qo_indptr[b + 1]), slice(kv_indptr[b], kv_indptr[b + 1])
        o_b, lse_b = R.attention(q[qs], k[ks], v[ks], custom_mask=masks[b], **opts)
        np.testing.assert_array_equal(o[qs], o_b)
        np.testing.assert_array_equal(lse[qs], lse_b)
    assert np.all(lse[qo_indptr[2] : qo_indptr[3]] == -np.inf)  # request 2 has no keys
    assert not np.isnan(o).any()


def test_k_scale_folds_into_sm_scale_and_v_scale_scales_output(rng):
    q, k, v = rng.standard_normal((4, 3, 8)), rng.standard_normal((9, 3, 8)), rng.standard_normal((9, 3, 8))
    o, lse = R.attention(q, k, v, sm_scale=0.3, k_scale=1.7, v_scale=0.25, logits_soft_cap=2.0)
    o_ref, lse_ref = R.attention(q, k, v, sm_scale=0.3 * 1.7, logits_soft_cap=2.0)
    np.testing.assert_allclose(o, 0.25 * o_ref, rtol=1e-14, atol=1e-13)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-14, atol=1e-13)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param(dict(pos_encoding="rope"), r"pos_encoding.*'none', 'rope_llama', 'alibi'", id="bad-pos"),
        pytest.param(dict(window_left=-2), "window_left", id="bad-window"),
        pytest.param(dict(logits_soft_cap=-1.0), "logits_soft_cap", id="bad-cap"),
        pytest.param(dict(custom_mask=np.ones((3, 4), bool)), r"custom_mask.*\(4, 5\)", id="bad-mask"),
    ],
)
def test_bad_options_raise(rng, kwargs, match):
    q, k, v = rng.standard_normal((4, 4, 8)), rng.standard_normal((5, 2, 8)), rng.standard_normal((5, 2, 8))
    with pytest.raises(ValueError, match=match):
        R.attention(q, k, v, **kwargs)


def test_head_ratio_must_divide(rng):
    q, k = rng.standard_normal((2, 6, 8)), rng.standard_normal((3, 4, 8))
    with pytest.raises(ValueError, match=r"num_qo_heads \(6\) must be a multiple of num_kv_heads \(4\)"):
        R.attention(q, k, k)
