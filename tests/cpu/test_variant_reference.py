"""Variants on the CPU reference backend (NumPy inputs), against float64 attention written here, head by head.

The built-ins given as ``variant=`` (sinks, sigmoid, Llama-3.1 RoPE), a user variant with NumPy functions for every
snippet (logits, mask, value and output transforms), run()-time arrays (``variant_arrays``) and their checks, the
planning rules (prefill never splits a chain without softmax or with an output transform; a sink chain's split
prefill plan carries merge units) and, on the reference, that a sink folded into one piece of a split row and merged
equals the whole row. No GPU needed: plan() falls back to a host-only plan.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

from cuinfer import reference
from cuinfer.decode import BatchDecode, single_decode
from cuinfer.prefill import BatchPrefill, single_prefill
from cuinfer.reference import variants as ref_variants
from cuinfer.variants import Param, Variant

BF16 = ml_dtypes.bfloat16
LOG2E = 1.0 / math.log(2.0)
HQ, HKV, D = 8, 2, 64


def _raises(exc, text):
    return pytest.raises(exc, match=re.escape(text))


# ---- the float64 attention of this file: one request, one head at a time ----------------------------------------


def llama31_freqs(d, theta, factor, low, high, old_len):
    """Llama 3.1's scaled inverse frequencies, as Hugging Face transformers writes them (rope_init_fn 'llama3')."""
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    low_wl, high_wl = old_len / low, old_len / high
    wl = 2 * np.pi / inv
    out = np.where(wl > low_wl, inv / factor, inv)
    smooth = (old_len / wl - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wl < high_wl) & ~(wl > low_wl)
    return np.where(medium, smoothed, out)


def rotate(x, pos, inv):
    """Rotate-half RoPE of rows x [n, d] at positions pos [n]."""
    ang = np.outer(pos, inv)
    c, s = np.cos(ang), np.sin(ang)
    h = x.shape[1] // 2
    return np.concatenate([x[:, :h] * c - x[:, h:] * s, x[:, h:] * c + x[:, :h] * s], axis=1)


def attend(q, k, v, *, causal=False, window=-1, sinks=None, sigmoid_bias=None, rope=None, logit=None, keep=None,
           vmap=None, omap=None, batch=0):  # fmt: skip
    """float64 (o [Lq, Hq, Dv], lse [Lq, Hq]) of one request, a plain loop over heads. ``sinks``: [Hq] natural
    logits; ``sigmoid_bias``: no softmax, weights sigmoid(s + bias); ``rope``: inverse frequencies (q at qpos, k at
    j); ``logit(s, h, qpos, j)``, ``keep(h, qpos, j)``, ``vmap(v, kv_head)``, ``omap(o, h, lse)``: the user variant."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lq, hq, d = q.shape
    lkv, hkv, dv = v.shape
    g = hq // hkv
    qpos = np.arange(lq) + lkv - lq
    j = np.arange(lkv)
    o = np.zeros((lq, hq, dv))
    lse = np.full((lq, hq), -np.inf)
    for h in range(hq):
        kh, vh = k[:, h // g], v[:, h // g]
        qh = q[:, h]
        if rope is not None:
            qh, kh = rotate(qh, qpos, rope), rotate(kh, j, rope)
        if vmap is not None:
            vh = vmap(vh, h // g)
        s = qh @ kh.T / math.sqrt(d)
        if logit is not None:
            s = logit(s, h, qpos[:, None], j[None, :])
        ok = np.ones(s.shape, bool)
        if causal:
            ok &= j[None, :] <= qpos[:, None]
        if window >= 0:
            ok &= j[None, :] >= qpos[:, None] - window
        if keep is not None:
            ok &= keep(h, qpos[:, None], j[None, :])
        for i in range(lq):
            si = s[i][ok[i]]
            if sigmoid_bias is not None:
                w = 1 / (1 + np.exp(-(si + sigmoid_bias)))
                o[i, h] = w @ vh[ok[i]]
                lse[i, h] = math.log2(w.sum()) if w.sum() > 0 else -np.inf
                continue
            terms = list(si) + ([sinks[h]] if sinks is not None else [])
            if not terms:
                continue
            m = max(terms)
            den = sum(math.exp(t - m) for t in terms)
            o[i, h] = np.exp(si - m) @ vh[ok[i]] / den
            lse[i, h] = (m + math.log(den)) * LOG2E
        if omap is not None:
            o[:, h] = omap(o[:, h], h, lse[:, h])
    return o, lse


def _check(o, lse, ref_o, ref_lse):
    """The reference path returns o rounded to the output dtype and lse as float32."""
    np.testing.assert_allclose(np.asarray(o, np.float64), ref_o.astype(BF16).astype(np.float64), rtol=0, atol=1e-2)
    np.testing.assert_allclose(np.asarray(lse, np.float64), ref_lse, rtol=1e-5, atol=1e-5)


# ---- inputs -----------------------------------------------------------------------------------------------------


def _paged(rng, lens, ps=16):
    lens = np.asarray(lens)
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    n = int(indptr[-1]) + 2
    indices = rng.permutation(n)[: indptr[-1]].astype(np.int32)
    last = (lens - (pages - 1) * ps).astype(np.int32)
    cache = rng.standard_normal((n, 2, ps, HKV, D)).astype(BF16)

    def kv(b):
        rows = np.arange(lens[b])
        pg = indices[indptr[b] : indptr[b + 1]]
        return cache[pg[rows // ps], 0, rows % ps], cache[pg[rows // ps], 1, rows % ps]

    return (indptr, indices, last), cache, kv


KV_LENS = np.array([1, 17, 80, 3])
QO_LENS = np.array([1, 9, 30, 5])  # request 3: 5 queries on 3 keys (causal: its first 2 rows see no key)
SINKS = np.array([0.5, -1.0, 2.0, 0.0, 3.0, -2.5, 1.5, -0.25], np.float32)


def _prefill(rng, paged, **plan_kw):
    """A planned BatchPrefill, its run() arguments and a per-request (k, v) accessor."""
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LENS)]).astype(np.int32)
    q = rng.standard_normal((int(qo_indptr[-1]), HQ, D)).astype(BF16)
    w = BatchPrefill(paged=paged)
    kw = dict(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, q_dtype="bfloat16", **plan_kw)
    if paged:
        table, cache, kv = _paged(rng, KV_LENS)
        w.plan(qo_indptr, *table, page_size=16, **kw)
        args = (cache,)
    else:
        kv_indptr = np.concatenate([[0], np.cumsum(KV_LENS)]).astype(np.int32)
        k = rng.standard_normal((int(kv_indptr[-1]), HKV, D)).astype(BF16)
        v = rng.standard_normal((int(kv_indptr[-1]), HKV, D)).astype(BF16)
        w.plan(qo_indptr, kv_indptr, **kw)
        args = (k, v)

        def kv(b):
            return k[kv_indptr[b] : kv_indptr[b + 1]], v[kv_indptr[b] : kv_indptr[b + 1]]

    return w, q, args, kv, qo_indptr


def _prefill_ref(q, kv, qo_indptr, **kw):
    o = np.zeros(q.shape)
    lse = np.full(q.shape[:2], -np.inf)
    for b in range(len(qo_indptr) - 1):
        s = slice(qo_indptr[b], qo_indptr[b + 1])
        o[s], lse[s] = attend(q[s], *kv(b), batch=b, **kw)
    return o, lse


# ---- built-ins given as variant= -------------------------------------------------------------------------------


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_prefill_sinks_on_numpy_inputs(rng, paged):
    w, q, args, kv, qo_indptr = _prefill(rng, paged, causal=True, variant="sinks")
    o, lse = w.run(q, *args, variant_arrays={"sinks": SINKS}, return_lse=True)
    ref_o, ref_lse = _prefill_ref(q, kv, qo_indptr, causal=True, sinks=SINKS.astype(np.float64))
    _check(o, lse, ref_o, ref_lse)
    # rows without keys: o = 0 and lse = the sink in base 2
    empty = slice(qo_indptr[3], qo_indptr[3] + 2)
    assert (np.asarray(o[empty], np.float64) == 0).all()
    np.testing.assert_allclose(lse[empty], np.broadcast_to(SINKS * LOG2E, (2, HQ)), rtol=1e-6)


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_prefill_sigmoid_on_numpy_inputs(rng, paged):
    w, q, args, kv, qo_indptr = _prefill(rng, paged, causal=True, variant="sigmoid",
                                         variant_params={"sigmoid": {"bias": -1.5}})  # fmt: skip
    o, lse = w.run(q, *args, return_lse=True)
    ref_o, ref_lse = _prefill_ref(q, kv, qo_indptr, causal=True, sigmoid_bias=-1.5)
    _check(o, lse, ref_o, ref_lse)


LLAMA31 = {
    "rope_theta": 5e5,
    "rope_scale": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position": 64,
}  # fmt: skip  (a short context, so every branch of the scaling is taken)


def test_llama31_frequencies_of_the_reference():
    for d in (64, 128, 256):
        for old in (64, 8192):
            vals = dict(LLAMA31, original_max_position=old)
            want = llama31_freqs(d, 5e5, 8.0, 1.0, 4.0, old)
            np.testing.assert_allclose(ref_variants.llama31_inv_freq(d, **vals), want, rtol=1e-13)
    f = llama31_freqs(128, 5e5, 8.0, 1.0, 4.0, 64)
    wl = 2 * np.pi / (5e5 ** (-np.arange(0, 128, 2) / 128))
    assert (wl < 16).any() and (wl > 64).any() and ((wl >= 16) & (wl <= 64)).any(), "all three regimes taken"
    assert np.isclose(f[0], 1.0) and np.isclose(f[-1], 5e5 ** (-126 / 128) / 8)


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_prefill_rope_llama31_on_numpy_inputs(rng, paged):
    w, q, args, kv, qo_indptr = _prefill(rng, paged, causal=True, variant="rope_llama31",
                                         variant_params={"rope_llama31": LLAMA31})  # fmt: skip
    o, lse = w.run(q, *args, return_lse=True)
    ref_o, ref_lse = _prefill_ref(q, kv, qo_indptr, causal=True, rope=llama31_freqs(D, 5e5, 8.0, 1.0, 4.0, 64))
    _check(o, lse, ref_o, ref_lse)


def test_rope_llama31_values_are_checked_at_plan(rng):
    bad = {"rope_llama31": {**LLAMA31, "low_freq_factor": 4.0}}
    with _raises(ValueError, "rope_llama31: need 0 < low_freq_factor < high_freq_factor but got 4.0, 4.0"):
        _prefill(rng, False, variant="rope_llama31", variant_params=bad)
    with _raises(ValueError, "at most one variant of a chain may transform q / k"):
        _prefill(rng, False, pos_encoding="rope_llama", variant="rope_llama31",
                 variant_params={"rope_llama31": LLAMA31})  # fmt: skip


def _decode(rng, **plan_kw):
    table, cache, kv = _paged(rng, KV_LENS)
    q = rng.standard_normal((len(KV_LENS), HQ, D)).astype(BF16)
    w = BatchDecode()
    w.plan(*table, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=16, q_dtype="bfloat16", **plan_kw)
    return w, q, cache, kv


def _decode_ref(q, kv, **kw):
    o, lse = np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    for b in range(q.shape[0]):
        o[b : b + 1], lse[b : b + 1] = attend(q[b : b + 1], *kv(b), batch=b, **kw)
    return o, lse


@pytest.mark.parametrize(
    "plan_kw, run_kw, ref_kw",
    [
        pytest.param(dict(variant="sinks", window_left=7), dict(variant_arrays={"sinks": SINKS}),
                     dict(sinks=SINKS.astype(np.float64), window=7), id="sinks-window"),
        pytest.param(dict(variant="sigmoid", variant_params={"sigmoid": {"bias": 0.25}}), {},
                     dict(sigmoid_bias=0.25), id="sigmoid"),
        pytest.param(dict(variant="rope_llama31", variant_params={"rope_llama31": LLAMA31}), {},
                     dict(rope=llama31_freqs(D, 5e5, 8.0, 1.0, 4.0, 64)), id="llama31"),
    ],
)  # fmt: skip
def test_decode_builtins_on_numpy_inputs(rng, plan_kw, run_kw, ref_kw):
    w, q, cache, kv = _decode(rng, **plan_kw)
    o, lse = w.run(q, cache, return_lse=True, **run_kw)
    _check(o, lse, *_decode_ref(q, kv, **ref_kw))


def test_single_calls_take_variant_arrays_on_numpy_inputs(rng):
    q = rng.standard_normal((HQ, D)).astype(BF16)
    k, v = (rng.standard_normal((50, HKV, D)).astype(BF16) for _ in range(2))
    o, lse = single_decode(q, k, v, variant="sinks", variant_arrays={"sinks": SINKS}, return_lse=True)
    ref_o, ref_lse = attend(q[None], k, v, sinks=SINKS.astype(np.float64))
    _check(o[None], lse[None], ref_o, ref_lse)
    qp = rng.standard_normal((20, HQ, D)).astype(BF16)
    o, lse = single_prefill(qp, k, v, causal=True, variant="sinks", variant_arrays={"sinks": SINKS}, return_lse=True)
    _check(o, lse, *attend(qp, k, v, causal=True, sinks=SINKS.astype(np.float64)))


# ---- a user variant with NumPy functions ------------------------------------------------------------------------

# Logits: a head-dependent tilt; mask: drop keys j with (j + qo_head) % 5 == 0 on every tile; values: scaled per KV
# head (an array given at run()); output: o + lse / 64 (the row's base-2 lse).
USER = Variant(
    name="test_host_user",
    logits="x * (1.f + 0.125f * qo_head)",
    mask="(kv_idx + qo_head) % 5 != 0",
    value_transform="x * params.vscale[kv_head]",
    output_transform="x + lse * params.lse_weight",
    params=(Param("vscale", "f32", per="kv_head"), Param("lse_weight", "f32")),
    numpy={
        "logits": lambda x, qo_head: x * (1 + 0.125 * qo_head),
        "mask": lambda kv_idx, qo_head: (kv_idx + qo_head) % 5 != 0,
        "value_transform": lambda x, kv_head, params: x * params.vscale[kv_head],
        "output_transform": lambda x, lse, params: x + lse * params.lse_weight,
    },
)
VSCALE = np.array([0.5, 2.0], np.float32)
USER_KW = dict(
    logit=lambda s, h, qpos, j: s * (1 + 0.125 * h),
    keep=lambda h, qpos, j: (j + h) % 5 != 0,
    vmap=lambda v, kvh: v * float(VSCALE[kvh]),
    omap=lambda o, h, lse: o + lse[:, None] / 64,  # (a row without keys: 0 + -inf)
)


def test_a_user_variant_runs_through_its_numpy_functions_in_decode(rng):
    w, q, cache, kv = _decode(rng, variant=USER, variant_params={"test_host_user": {"lse_weight": 1 / 64}})
    o, lse = w.run(q, cache, return_lse=True, variant_arrays={"vscale": VSCALE})
    _check(o, lse, *_decode_ref(q, kv, **USER_KW))


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_a_user_variant_runs_through_its_numpy_functions_in_prefill(rng, paged):
    w, q, args, kv, qo_indptr = _prefill(rng, paged, causal=True, variant=USER,
                                         variant_params={"test_host_user": {"lse_weight": 1 / 64}})  # fmt: skip
    o, lse = w.run(q, *args, variant_arrays={"test_host_user.vscale": VSCALE}, return_lse=True)
    ref_o, ref_lse = _prefill_ref(q, kv, qo_indptr, causal=True, **USER_KW)
    empty = np.isneginf(ref_lse)
    assert empty.any() and np.isneginf(np.asarray(o, np.float64)[empty]).all(), "o = 0 + lse / 64 = -inf there"
    _check(o, lse, ref_o, ref_lse)


DIST = Variant(
    name="test_host_dist",
    logits="x - 0.25f * fabsf(kv_dist)",
    numpy={"logits": lambda x, kv_dist: x - 0.25 * np.abs(kv_dist)},
)


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_kv_dist_is_the_keys_distance_to_the_query(rng, paged):
    """``kv_dist`` (what ALiBi reads) is ``kv_idx - qpos``, bottom-right aligned, on the reference as in the kernels."""
    w, q, args, kv, qo_indptr = _prefill(rng, paged, causal=True, variant=DIST)
    o, lse = w.run(q, *args, return_lse=True)
    ref_o, ref_lse = _prefill_ref(q, kv, qo_indptr, causal=True, logit=lambda s, h, qpos, j: s - 0.25 * abs(j - qpos))
    _check(o, lse, ref_o, ref_lse)


SLOPE = Variant(
    name="test_host_slope",
    slope="params.a * (1.f + qo_head)",
    params=(Param("a"),),
    numpy={"slope": lambda qo_head, params: params.a * (1 + qo_head)},
)


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_a_slope_runs_on_numpy_inputs_as_its_linear_bias(rng, paged):
    """A ``slope`` NumPy function gives the logits ``x + slope * kv_dist`` (the reference written here)."""
    w, q, args, kv, qo_indptr = _prefill(rng, paged, causal=True, variant=SLOPE,
                                         variant_params={"test_host_slope": {"a": 0.0625}})  # fmt: skip
    o, lse = w.run(q, *args, return_lse=True)
    ref_o, ref_lse = _prefill_ref(q, kv, qo_indptr, causal=True,
                                  logit=lambda s, h, qpos, j: s + 0.0625 * (1 + h) * (j - qpos))  # fmt: skip
    _check(o, lse, ref_o, ref_lse)


def test_a_user_variant_without_numpy_functions_raises_on_numpy_inputs(rng):
    bare = Variant(name="test_host_bare", logits="2.f * x", output_transform="x", numpy={"logits": lambda x: 2 * x})
    w, q, cache, _ = _decode(rng, variant=bare)
    with _raises(NotImplementedError, "variant 'test_host_bare': the CPU reference backend (NumPy inputs) runs a "
                 "user-defined variant through its NumPy functions, and it has none for ['output_transform'] (it has "
                 "['logits']); give Variant(..., numpy={'output_transform': fn})"):  # fmt: skip
        w.run(q, cache)


# ---- run()-time arrays: the checks -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arrays, error, message",
    [
        pytest.param(None, ValueError, "read arrays given at run(): pass variant_arrays={'sinks': float32 [8] (one "
                     "per query head)}", id="missing"),
        pytest.param({}, ValueError, "variant_arrays lacks ['sinks.sinks']", id="empty"),
        pytest.param({"sink": SINKS}, ValueError, "variant_arrays names 'sink', which is no array parameter",
                     id="name"),
        pytest.param({"sinks": SINKS[:4]}, ValueError, "variant_arrays['sinks'] must have shape (8,) but has shape "
                     "(4,); one element per query head: the plan has num_qo_heads=8", id="shape"),
        pytest.param({"sinks": SINKS[None]}, ValueError, "variant_arrays['sinks'] must have 1 dimensions but has 2",
                     id="ndim"),
        pytest.param({"sinks": SINKS.astype(np.float64)}, ValueError, "variant_arrays['sinks'] must have dtype "
                     "float32 but has dtype float64; cast it with variant_arrays['sinks'].astype(np.float32)",
                     id="dtype"),
        pytest.param({"sinks": np.repeat(SINKS, 2)[::2]}, ValueError, "variant_arrays['sinks'] must be contiguous "
                     "(stride 1) but has stride 2", id="strided"),
        pytest.param({"sinks": SINKS, "sinks.sinks": SINKS}, ValueError, "variant_arrays gives sinks.sinks twice",
                     id="twice"),
        pytest.param([SINKS], TypeError, "variant_arrays must be a dict", id="not-a-dict"),
    ],
)  # fmt: skip
def test_variant_arrays_are_checked_before_anything_runs(rng, arrays, error, message):
    w, q, cache, _ = _decode(rng, variant="sinks")
    with _raises(error, message):
        w.run(q, cache, variant_arrays=arrays)


def test_variant_arrays_without_array_parameters_raise(rng):
    w, q, cache, _ = _decode(rng)
    with _raises(ValueError, "variant_arrays names ['sinks'] but the variants of this plan (plain) take no array"):
        w.run(q, cache, variant_arrays={"sinks": SINKS})


def test_sigmoid_needs_its_bias(rng):
    with _raises(ValueError, "variant 'sigmoid' takes parameters ['bias']; pass variant_params={'sigmoid': {...}}"):
        _decode(rng, variant="sigmoid")


# ---- planning rules -----------------------------------------------------------------------------------------------


def _long_prefill(**kw):
    w = BatchPrefill(paged=False)
    w.plan([0, 4], [0, 20000], num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, q_dtype="bfloat16", **kw)
    return w._plan.work


def test_prefill_never_splits_without_softmax_or_with_an_output_transform():
    assert _long_prefill().num_partial_rows > 0, "a 20000-key request with 4 queries is split by default"
    out = Variant(name="test_host_out", output_transform="x")
    for kw in (dict(variant="sigmoid", variant_params={"sigmoid": {"bias": 0.0}}), dict(variant=out)):
        assert _long_prefill(**kw).num_partial_rows == 0
        with _raises(ValueError, "are never split in prefill (without softmax, or with an output transform"):
            _long_prefill(fixed_split_size=1024, **kw)


def test_decode_splits_chains_without_softmax():
    w = BatchDecode()
    w.plan([0, 1250], np.arange(1250, dtype=np.int32), [16], num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
           page_size=16, q_dtype="bfloat16", variant="sigmoid", variant_params={"sigmoid": {"bias": 0.0}},
           fixed_split_size=4096)  # fmt: skip
    assert w._plan.work.num_partial_rows > 0, "decode merges split pieces in its kernel, by adding"


def test_split_prefill_plans_with_a_sink_carry_merge_units():
    work = _long_prefill(variant="sinks", fixed_split_size=2048)
    assert work.merge_in_kernel and work.n_merge > 0
    item_merge, partial = work.item_merge, work.item_partial
    split = partial >= 0
    first = split & (partial == item_merge)
    # exactly one first piece per (tile, head) unit: the sink is folded once per row
    assert first.sum() == len(np.unique(item_merge[split])) and (item_merge[~split] == -1).all()
    assert not _long_prefill(fixed_split_size=2048).merge_in_kernel


# ---- exactness under splitting, on the reference ----------------------------------------------------------------


def test_a_sink_folded_into_one_piece_merges_exactly(rng):
    """The kernels' rule: the sink joins one piece of a split row (prefill: the first; decode: the merge), and the
    softmax merge of the pieces then equals the whole row with its sink; without softmax the pieces add."""
    q = rng.standard_normal((3, HQ, D))
    k, v = (rng.standard_normal((200, HKV, D)) for _ in range(2))
    sinks = ref_variants.sinks(SINKS)
    whole_o, whole_lse = ref_variants.attend(q, k, v, [sinks])
    cuts = [0, 70, 130, 200]
    parts = [ref_variants.attend(q, k[a:b], v[a:b], [sinks] if i == 0 else [], sm_scale=1 / 8)
             for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True))]  # fmt: skip
    o, lse = parts[0]
    for po, pl in parts[1:]:
        o, lse = reference.merge_state(o, lse, po, pl)
    np.testing.assert_allclose(o, whole_o, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lse, whole_lse, rtol=1e-10)
    sig = ref_variants.sigmoid(0.5)
    whole_o, whole_lse = ref_variants.attend(q, k, v, [sig])
    parts = [ref_variants.attend(q, k[a:b], v[a:b], [sig]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    np.testing.assert_allclose(sum(p[0] for p in parts), whole_o, rtol=1e-10)
    np.testing.assert_allclose(np.log2(sum(2.0 ** p[1] for p in parts)), whole_lse, rtol=1e-10)


def test_the_streaming_llm_example_of_the_docs_runs_on_numpy_inputs(rng):
    """docs/variants.md's StreamingLLM variant (with its NumPy mask) beside the built-in RoPE option."""
    import cuinfer

    streaming = cuinfer.Variant(
        name="streaming",
        mask="kv_idx < params.sinks || kv_idx >= qpos - params.window",
        params=(cuinfer.Param("sinks", "i32"), cuinfer.Param("window", "i32")),
        numpy={"mask": lambda kv_idx, qpos, params: (kv_idx < params.sinks) | (kv_idx >= qpos - params.window)},
    )
    w, q, cache, kv = _decode(rng, pos_encoding="rope_llama", rope_theta=5e5, variant=streaming,
                              variant_params={"streaming": {"sinks": 4, "window": 20}})  # fmt: skip
    o, lse = w.run(q, cache, return_lse=True)
    inv = 5e5 ** (-np.arange(D // 2) * 2.0 / D)
    keep = lambda h, qpos, j: (j < 4) | (j >= qpos - 20)  # noqa: E731
    _check(o, lse, *_decode_ref(q, kv, rope=inv, keep=keep))


# ---- scaled logits (logits_scale): the NumPy logits function takes x / c and returns r; the logit is c * r ----------

SCALED = Variant(
    name="test_host_scaled",
    logits="fmath::tanh_approx(x)",
    logits_scale="c",
    params=(Param("c", "f32"),),
    numpy={"logits": lambda x: np.tanh(x)},
)


@pytest.mark.parametrize(
    "variant, values",
    [(SCALED, {"test_host_scaled": {"c": 2.0}}), ("soft_cap_accurate", {"soft_cap_accurate": {"cap": 2.0}})],
    ids=["user", "soft_cap_accurate"],
)
@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_scaled_logits_run_as_c_times_the_function_of_x_over_c(rng, paged, variant, values):
    w, q, args, kv, qo_indptr = _prefill(rng, paged, causal=True, variant=variant, variant_params=values)
    o, lse = w.run(q, *args, return_lse=True)
    _check(o, lse, *_prefill_ref(q, kv, qo_indptr, causal=True, logit=lambda s, h, qpos, j: 2.0 * np.tanh(s / 2.0)))


def test_scaled_logits_in_decode(rng):
    w, q, cache, kv = _decode(rng, variant=SCALED, variant_params={"test_host_scaled": {"c": 1.5}})
    o, lse = w.run(q, cache, return_lse=True)
    _check(o, lse, *_decode_ref(q, kv, logit=lambda s, h, qpos, j: 1.5 * np.tanh(s / 1.5)))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_scaled_logits_refuse_a_bad_scale_at_plan_on_the_numpy_path(rng, bad):
    """c of logits_scale is checked at plan(), before any run: the NumPy path raises as the GPU path does."""
    with pytest.raises(ValueError, match="its logits_scale parameter 'c' must be a finite number > 0"):
        _prefill(rng, False, causal=True, variant=SCALED, variant_params={"test_host_scaled": {"c": bad}})
    with pytest.raises(ValueError, match="its logits_scale parameter 'c' must be a finite number > 0"):
        _decode(rng, variant=SCALED, variant_params={"test_host_scaled": {"c": bad}})
