"""User-defined variants on the GPU: a variant written in this file (not in the package) runs in both decode kernels
and in ragged and paged prefill, and matches a float64 NumPy attention written here with the same formula.

Outputs are poisoned with NaN before each run; tolerances are in units of the output dtype's rounding, as in
test_decode.py / test_prefill.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuinfer.variants import Param, Variant

pytestmark = pytest.mark.gpu

BF16 = ml_dtypes.bfloat16
U = 2.0**-8
LOG2E = 1.0 / np.log(2.0)

# The variant under test: a rational soft cap, logit -> logit / (1 + |logit| / cap), and a key mask that keeps the
# first `sinks` keys and a window of the last `window` + 1 positions (StreamingLLM's pattern) on every tile.
RATIONAL = Variant(
    name="test_rational_cap",
    logits="x / (1.f + fabsf(x) * params.inv_cap)",
    params=(Param("inv_cap", "f32"),),
)
SINKS = Variant(
    name="test_sinks_window",
    mask="kv_idx < params.sinks || kv_idx >= qpos - params.window",
    params=(Param("sinks", "i32"), Param("window", "i32")),
)
CAP, N_SINKS, WINDOW = 4.0, 3, 40
PARAMS = {"test_rational_cap": {"inv_cap": 1.0 / CAP}, "test_sinks_window": {"sinks": N_SINKS, "window": WINDOW}}


def _attend(q, k, v, qo_len: int, causal: bool, sm_scale: float):
    """float64: q [Lq, Hq, D], k / v [Lkv, Hkv, D] of one request -> (o, lse base 2) with both variants applied."""
    lq, hq, d = q.shape
    lkv, hkv, _ = k.shape
    g = hq // hkv
    o = np.zeros((lq, hq, d))
    lse = np.full((lq, hq), -np.inf)
    qpos = np.arange(lq) + lkv - qo_len
    j = np.arange(lkv)
    keep = (j[None, :] < N_SINKS) | (j[None, :] >= qpos[:, None] - WINDOW)
    if causal:
        keep &= j[None, :] <= qpos[:, None]
    for h in range(hq):
        s = q[:, h].astype(np.float64) @ k[:, h // g].astype(np.float64).T * sm_scale
        s = s / (1 + np.abs(s) / CAP)
        s = np.where(keep, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        has = np.isfinite(m[:, 0])
        p = np.where(has[:, None], np.exp(s - np.where(has[:, None], m, 0)), 0.0)
        den = p.sum(axis=1)
        o[has, h] = (p[has] @ v[:, h // g].astype(np.float64)) / den[has, None]
        lse[has, h] = (m[has, 0] + np.log(den[has])) * LOG2E
    return o, lse


def _check(o, lse, ref_o, ref_lse, what: str):
    o = np.asarray(o, np.float64)
    assert np.isfinite(o).all(), f"{what}: NaN/inf left: an element was never written"
    err = np.abs(o - ref_o)
    bound = 4 * U * (np.abs(ref_o) + 1)
    assert (err <= bound).all(), f"{what}: {(err > bound).sum()} elements beyond 4u(|ref|+1), max error {err.max()}"
    lse = np.asarray(lse, np.float64)
    empty = np.isneginf(ref_lse)
    assert np.isneginf(lse[empty]).all() and (o[empty] == 0).all(), f"{what}: empty rows"
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=1e-3, atol=1e-3, err_msg=f"lse of {what}")


@pytest.fixture
def fw():
    from conftest import _load_framework

    return _load_framework("cupy")


def _decode_batch(rng, lens, hq, hkv, d, ps):
    """A paged bf16 decode batch of these KV lengths (pages scattered, two spare): q, cache, indptr, indices, last."""
    lens = np.asarray(lens)
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(indptr[-1]) + 2
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = (lens - (pages - 1) * ps).astype(np.int32)
    cache = rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32).astype(BF16)
    q = (2 * rng.standard_normal((lens.size, hq, d), dtype=np.float32)).astype(BF16)
    return q, cache, indptr, indices, last


@pytest.mark.parametrize("tensor_cores", [True, False], ids=["tc", "cc"])
def test_user_variants_in_decode(rng, fw, tensor_cores):
    from cuinfer.decode import BatchDecode

    hq, hkv, d, ps = 32, 8, 128, 16
    lens = np.array([1, 17, 300, 1000, 4097])
    q, cache, indptr, indices, last = _decode_batch(rng, lens, hq, hkv, d, ps)
    w = BatchDecode(use_tensor_cores=tensor_cores)
    w.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16",
           variant=(RATIONAL, SINKS), variant_params=PARAMS, fixed_split_size=512)  # fmt: skip
    assert w._plan.work.num_partial_rows > 0, "the long requests are split (the in-kernel merge runs)"
    out = fw.asarray(np.full(q.shape, np.nan, BF16))
    lse = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
    w.run(fw.asarray(q), fw.asarray(cache), out=out, lse=lse)
    o, lse = fw.to_numpy(out), fw.to_numpy(lse)
    for b, n in enumerate(lens):
        rows = np.arange(n)
        pg = indices[indptr[b] : indptr[b + 1]]
        k, v = cache[pg[rows // ps], 0, rows % ps], cache[pg[rows // ps], 1, rows % ps]
        ref_o, ref_lse = _attend(q[b : b + 1], k, v, 1, False, 1 / np.sqrt(d))
        _check(o[b : b + 1], lse[b : b + 1], ref_o, ref_lse, f"decode request {b} (kv {n})")


def _prefill_batch(rng, fw, paged: bool, qo, kv, **plan_kw):
    """A bf16 prefill batch (32 / 8 heads, d128; pages of 16 scattered, two spare, when paged) planned with
    ``plan_kw``: (wrapper, q, the run() K/V arguments, per-request k and v, qo_indptr)."""
    from cuinfer.prefill import BatchPrefill

    hq, hkv, d, ps = 32, 8, 128, 16
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    q = (2 * rng.standard_normal((int(qo.sum()), hq, d), dtype=np.float32)).astype(BF16)
    w = BatchPrefill(paged=paged)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, q_dtype="bfloat16", **plan_kw)
    if paged:
        pages = (kv + ps - 1) // ps
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        num_pages = int(indptr[-1]) + 2
        indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
        last = (kv - (pages - 1) * ps).astype(np.int32)
        cache = rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32).astype(BF16)
        w.plan(qo_indptr, indptr, indices, last, page_size=ps, **kw)
        ks, vs = [], []
        for b, n in enumerate(kv):
            rows = np.arange(n)
            pg = indices[indptr[b] : indptr[b + 1]]
            ks.append(cache[pg[rows // ps], 0, rows % ps])
            vs.append(cache[pg[rows // ps], 1, rows % ps])
        return w, q, (fw.asarray(cache),), ks, vs, qo_indptr
    kv_indptr = np.concatenate([[0], np.cumsum(kv)]).astype(np.int32)
    k = rng.standard_normal((int(kv.sum()), hkv, d), dtype=np.float32).astype(BF16)
    v = rng.standard_normal((int(kv.sum()), hkv, d), dtype=np.float32).astype(BF16)
    w.plan(qo_indptr, kv_indptr, **kw)
    ks = [k[kv_indptr[b] : kv_indptr[b + 1]] for b in range(kv.size)]
    vs = [v[kv_indptr[b] : kv_indptr[b + 1]] for b in range(kv.size)]
    return w, q, (fw.asarray(k), fw.asarray(v)), ks, vs, qo_indptr


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_user_variants_in_prefill(rng, fw, paged):
    qo = np.array([1, 37, 300, 5, 129])
    kv = np.array([17, 100, 700, 5, 1000])
    w, q, args, ks, vs, qo_indptr = _prefill_batch(rng, fw, paged, qo, kv, causal=True, variant=(RATIONAL, SINKS),
                                                   variant_params=PARAMS)  # fmt: skip
    out = fw.asarray(np.full(q.shape, np.nan, BF16))
    lse = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
    w.run(fw.asarray(q), *args, out=out, lse=lse)
    o, lse = fw.to_numpy(out), fw.to_numpy(lse)
    for b in range(qo.size):
        sl = slice(qo_indptr[b], qo_indptr[b + 1])
        ref_o, ref_lse = _attend(q[sl], ks[b], vs[b], int(qo[b]), True, 1 / np.sqrt(q.shape[2]))
        _check(o[sl], lse[sl], ref_o, ref_lse, f"prefill request {b} (qo {qo[b]}, kv {kv[b]})")


@pytest.mark.parametrize("tensor_cores", [True, False], ids=["tc", "cc"])
@pytest.mark.parametrize("packed", [False, True], ids=["bool", "packed"])
def test_custom_mask_in_decode(rng, fw, tensor_cores, packed):
    """The custom_mask built-in in both decode kernels (a random mask over each request's keys, split requests
    included), against the float64 reference (the prefill reference with one query row per request)."""
    from cuinfer import reference
    from cuinfer.decode import BatchDecode

    hq, hkv, d, ps = 32, 8, 128, 16
    lens = np.array([1, 17, 300, 4097, 1000, 33])
    q, cache, indptr, indices, last = _decode_batch(rng, lens, hq, hkv, d, ps)
    mask = rng.random(int(lens.sum())) < 0.6
    mask[: lens[0]] = False  # request 0 sees no key: o = 0, lse = -inf
    kw = dict(custom_mask=mask)
    if packed:
        bit_indptr = np.concatenate([[0], np.cumsum(lens)])
        kw = dict(packed_custom_mask=reference.segment_packbits(mask, bit_indptr, bitorder="little")[0])
    w = BatchDecode(use_tensor_cores=tensor_cores)
    w.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16",
           fixed_split_size=512, **kw)  # fmt: skip
    out = fw.asarray(np.full(q.shape, np.nan, BF16))
    lse = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
    w.run(fw.asarray(q), fw.asarray(cache), out=out, lse=lse)
    qo = np.arange(lens.size + 1, dtype=np.int32)
    ref_o, ref_lse = reference.batch_prefill_paged(q, cache, qo, indptr, indices, last, custom_mask=mask)
    _check(fw.to_numpy(out), fw.to_numpy(lse), ref_o, ref_lse, "decode with a custom mask")


# A user key transform with a per-position state and no pos_advance: k[dim] scaled by 2^(pos * rate) with a rate per
# dimension pair (an xPos-like decay). The tensor-core decode kernel applies it to its K fragments in registers
# (variant::FragStates: both keys of a thread's fragment get an exact pos_state), the CUDA-core one in shared memory;
# both round the scaled keys to bf16, as the reference does.
KEY_DECAY = Variant(
    name="test_key_decay_gpu",
    dim_state="state.rate = -float(dim + 1) * 2e-6f;",
    state_fields="float rate;",
    pos_fields="float scale;",
    pos_state="kpos.scale = fmath::ex2(float(pos) * state.rate);",
    key_transform="x * kpos.scale",
)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("tensor_cores", [True, False], ids=["tc", "cc"])
def test_a_key_transform_without_pos_advance_in_decode(rng, fw, tensor_cores, d):
    from cuinfer.decode import BatchDecode

    hq, hkv, ps = 32, 8, 16
    lens = np.array([1, 17, 300, 4097])
    q, cache, indptr, indices, last = _decode_batch(rng, lens, hq, hkv, d, ps)
    w = BatchDecode(use_tensor_cores=tensor_cores)
    w.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16",
           variant=(KEY_DECAY,), fixed_split_size=512)  # fmt: skip
    out = fw.asarray(np.full(q.shape, np.nan, BF16))
    lse = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
    w.run(fw.asarray(q), fw.asarray(cache), out=out, lse=lse)
    o, lse = fw.to_numpy(out), fw.to_numpy(lse)
    pair = np.arange(d) % (d // 2)
    for b, n in enumerate(lens):
        rows = np.arange(n)
        pg = indices[indptr[b] : indptr[b + 1]]
        k, v = cache[pg[rows // ps], 0, rows % ps], cache[pg[rows // ps], 1, rows % ps]
        scale = np.exp2(rows[:, None] * (-(pair[None, :] + 1.0) * np.float32(2e-6)))  # [n, d]
        k = (k.astype(np.float64) * scale[:, None, :]).astype(BF16)
        g = hq // hkv
        s = np.einsum("hd,jhd->hj", q[b].astype(np.float64), np.repeat(k.astype(np.float64), g, axis=1)) / np.sqrt(d)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        ref_o = np.einsum("hj,jhd->hd", p, np.repeat(v.astype(np.float64), g, axis=1)) / p.sum(axis=1)[:, None]
        ref_lse = (m[:, 0] + np.log(p.sum(axis=1))) * LOG2E
        _check(o[b : b + 1], lse[b : b + 1], ref_o[None], ref_lse[None], f"decode request {b} (kv {n}, d {d})")


# A linear key bias written as a slope (per query head, an array given at run()): logit + a[h] * (kv_idx - qpos).
HEAD_SLOPE = Variant(name="test_head_slope", slope="params.a[qo_head]", params=(Param("a", "f32", per="qo_head"),))


def _attend_slope(q, k, v, qo_len: int, a: np.ndarray, cap_first: bool, sm_scale: float):
    """float64, causal: the slope's bias and (cap_first: before it, else after it) the rational cap."""
    lq, hq, d = q.shape
    lkv, hkv, _ = k.shape
    g = hq // hkv
    o = np.zeros((lq, hq, d))
    lse = np.zeros((lq, hq))
    qpos = np.arange(lq) + lkv - qo_len
    dist = np.arange(lkv)[None, :] - qpos[:, None]
    for h in range(hq):
        s = q[:, h].astype(np.float64) @ k[:, h // g].astype(np.float64).T * sm_scale
        if cap_first:
            s = s / (1 + np.abs(s) / CAP) + a[h] * dist
        else:
            s = s + a[h] * dist
            s = s / (1 + np.abs(s) / CAP)
        s = np.where(dist <= 0, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        o[:, h] = (p @ v[:, h // g].astype(np.float64)) / p.sum(axis=1)[:, None]
        lse[:, h] = (m[:, 0] + np.log(p.sum(axis=1))) * LOG2E
    return o, lse


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
@pytest.mark.parametrize("cap_first", [False, True], ids=["slope-lead", "slope-after-logits"])
def test_a_slope_variant_in_prefill(rng, fw, paged, cap_first):
    """A slope first in the chain is folded into Q·K^T's accumulators (kFoldSlope); after a logits piece it runs as
    that piece's logits (x + slope * kv_dist in place). Both against the float64 formula, the rows' keys crossing
    many KV tiles (interior tiles carry the bias) and the long requests split (pieces merged)."""
    qo = np.array([1, 37, 300, 129])
    kv = np.array([17, 100, 700, 1000])
    a = (0.05 * rng.random(32)).astype(np.float32)  # ALiBi-like slopes, one per query head
    chain = ("causal", RATIONAL, HEAD_SLOPE) if cap_first else ("causal", HEAD_SLOPE, RATIONAL)
    w, q, args, ks, vs, qo_indptr = _prefill_batch(
        rng, fw, paged, qo, kv, causal=False, variant=chain, fixed_split_size=256,
        variant_params={"test_rational_cap": {"inv_cap": 1.0 / CAP}},
    )  # fmt: skip
    out = fw.asarray(np.full(q.shape, np.nan, BF16))
    lse = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
    assert w._plan.work.num_partial_rows > 0, "the long requests are split"
    w.run(fw.asarray(q), *args, out=out, lse=lse, variant_arrays={"a": fw.asarray(a)})
    o, lse = fw.to_numpy(out), fw.to_numpy(lse)
    for b in range(qo.size):
        sl = slice(qo_indptr[b], qo_indptr[b + 1])
        ref_o, ref_lse = _attend_slope(q[sl], ks[b], vs[b], int(qo[b]), a.astype(np.float64), cap_first,
                                       1 / np.sqrt(q.shape[2]))  # fmt: skip
        _check(o[sl], lse[sl], ref_o, ref_lse, f"prefill request {b} (qo {qo[b]}, kv {kv[b]})")
