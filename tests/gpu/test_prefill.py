"""Batch and single prefill on the GPU against the float64 reference (CuPy inputs; torch, JAX and CuPy for
single_prefill).

The issue's "done when" list -- batch {1, 12, 17}, query lengths {1, 17, 37, 127, 577}, KV lengths {54, 97, 512,
2048, 4097} (qo <= kv, plus causal qo > kv), page size {1, 5, 16}, GQA {4:4, 32:8, 28:4}, head dims {64, 128, 256,
(192, 128)}, causal on / off, fp16 / bf16, every query tile {16, 32, 64, 128} forced at least once -- is sampled by
named cases so that every value appears and the suite stays around two minutes (each distinct kernel costs ~1-2 s of
NVRTC on first use; the float64 reference of the largest case ~2 s). Split-KV (partials + merge), NHD / HND, the
(k, v) tuple cache, q sliced from a fused QKV tensor, 3 pipeline stages, every KV tile, window / soft cap / ALiBi /
custom masks and empty requests have a case each. Cases planned for one SM (``num_sms=1``: 2 CTAs of ~100 items
each) drive the kernel's cross-item pipeline: table refills every 16 items, the next item's Q and first tile issued
from the last iteration (paged: its page numbers copied ahead), items with no keys in between, split items.

Outputs are poisoned: ``out=`` / ``lse=`` and the split-KV workspace are NaN before each run, so an element the kernel
never writes fails. Tolerance, in units u of the output dtype's rounding (2^-8 bf16, 2^-11 fp16):
|o - ref| <= 4u (|ref| + rms of the row's ref), which covers the output rounding and the 16-bit rounding of the
probabilities fed to mma (relative 2^-9 each, so the error scales with the row's magnitude, not with 1). lse (never
16-bit) is checked to 1e-3, which also catches a missing or doubled KV tile that an average could hide.

A kernel fault (illegal address) poisons the CUDA context of the whole process, so a child process first runs a
canary (one small case per kernel family); if it crashes, this module fails with its output and the other GPU test
modules still run. One failing case does not stop the others.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest

from cuinfer import reference

pytestmark = pytest.mark.gpu

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

DTYPES = {"bf16": (ml_dtypes.bfloat16, 2.0**-8), "fp16": (np.float16, 2.0**-11)}

# Request mixes (query lengths, KV lengths); every qo <= kv unless named otherwise.
B1_LONG = ((577,), (4097,))
B1_SQUARE = ((2048,), (2048,))
B12 = ((1, 17, 37, 127, 1, 17, 37, 127, 577, 17, 1, 37), (54, 97, 512, 2048, 4097, 54, 97, 512, 2048, 97, 54, 512))
B17 = (
    (1, 17, 37, 127, 577, 1, 17, 37, 127, 1, 17, 37, 1, 17, 37, 127, 1),
    (54, 97, 512, 2048, 4097, 97, 54, 97, 512, 2048, 4097, 54, 512, 97, 2048, 512, 54),
)
B12_SHORT = ((1, 17, 37, 1, 17, 37, 1, 17, 37, 17, 1, 37), (54, 97, 512, 54, 97, 54, 97, 512, 97, 97, 54, 512))
QO_GT_KV = ((37, 127, 17, 5), (17, 54, 1, 97))  # causal: the first qo - kv rows of a request see no key
EMPTY = ((0, 5, 3, 0, 17), (7, 0, 9, 0, 54))  # a request with no query, one with no keys, an empty one
# Causal, some qo > kv (whole query tiles with no key: empty items between full ones), 28 tiles of 128 rows at 32:8.
QO_MIX = ((37, 127, 17, 5, 300, 64, 1, 200), (17, 54, 1, 97, 300, 640, 2000, 150))


@dataclass(frozen=True)
class Case:
    lens: tuple  # (qo lengths, kv lengths)
    heads: tuple = (32, 8)
    dims: tuple = (128, 128)
    page: int | None = None  # None: ragged k / v
    causal: bool = True
    dtype: str = "bf16"
    tiles: tuple | None = None  # tile_sizes=(query tile[, kv tile[, stages[, groups]]])
    layout: str = "NHD"
    split: int | None = None  # fixed_split_size
    cache: str = "5d"  # paged: "5d" or "tuple"
    q_slice: bool = False
    mask: bool = False  # random custom mask
    opts: dict = field(default_factory=dict)
    loose: float = 1.0
    sms: int | None = None  # num_sms: plan for this many SMs (many items per CTA)
    ramp: float = 0.0  # ragged: key j of a request scaled by 1 + ramp * j / kv_len (logits rise along the keys)
    # RoPE in the kernel rotates q and each K tile in shared memory, rounded to the 16-bit type: the reference rotates
    # in float64, rounds to the input dtype, then attends without RoPE (as the decode tests do)
    rope_rounded: bool = False
    backend: str = "auto"  # BatchPrefill(backend=...)


CASES = [
    # --- the length / batch / head matrix -----------------------------------------------------------------------
    pytest.param(Case(B1_LONG), id="b1-q577-kv4097-32x8-d128-bf16-causal-ragged"),
    pytest.param(Case(B1_SQUARE, (28, 4), page=16), id="b1-q2048-kv2048-28x4-d128-bf16-causal-p16"),
    pytest.param(Case(B12, page=16), id="b12mix-32x8-d128-bf16-causal-p16"),
    pytest.param(Case(B17, (28, 4), page=5, causal=False, dtype="fp16", layout="HND"), id="b17mix-28x4-fp16-p5-hnd"),
    pytest.param(Case(B12_SHORT, (4, 4), (64, 64), page=1, tiles=(16,)), id="b12-4x4-d64-bf16-causal-p1-q16"),
    pytest.param(Case(B12, (32, 8), (256, 256), tiles=(32,)), id="b12mix-32x8-d256-bf16-causal-ragged-q32"),
    pytest.param(Case(B17, (28, 4), (192, 128)), id="b17mix-28x4-d192x128-bf16-causal-ragged"),
    pytest.param(Case(B12_SHORT, (4, 4), (192, 128), causal=False, dtype="fp16", tiles=(64,)), id="d192x128-q64-fp16"),
    pytest.param(Case(B12, (4, 4), (64, 64), page=5, causal=False, tiles=(128,)), id="b12mix-4x4-d64-p5-q128"),
    pytest.param(Case(B12_SHORT, (28, 4), (256, 256), page=16, dtype="fp16", tiles=(128,)), id="d256-q128-8warps-p16"),
    # --- causal with more queries than keys ------------------------------------------------------------------------
    pytest.param(Case(QO_GT_KV, tiles=(64,)), id="qo>kv-causal-32x8-d128-ragged-q64"),
    pytest.param(Case(QO_GT_KV, (4, 4), (64, 64), page=5, dtype="fp16", tiles=(32,)), id="qo>kv-causal-4x4-p5-q32"),
    pytest.param(Case(QO_GT_KV, (28, 4), page=1, tiles=(128,)), id="qo>kv-causal-28x4-p1-q128"),
    # --- every KV tile and the pipeline depth -----------------------------------------------------------------------
    pytest.param(Case(B12_SHORT, tiles=(16, 128)), id="q16-kv128"),
    pytest.param(Case(B12_SHORT, page=16, tiles=(32, 128)), id="q32-kv128-p16"),
    pytest.param(Case(B12_SHORT, (28, 4), tiles=(64, 128)), id="q64-kv128"),
    pytest.param(Case(B12, (4, 4), page=16, tiles=(128, 32, 3)), id="q128-kv32-3stages-p16"),
    pytest.param(Case(B12_SHORT, tiles=(32, 32)), id="q32-kv32"),
    # --- split-KV: partial states + merge ---------------------------------------------------------------------------
    pytest.param(Case(B12, split=256), id="b12mix-ragged-split256"),
    pytest.param(Case(B17, (28, 4), (256, 256), page=16, dtype="fp16", split=512), id="b17mix-d256-p16-split512"),
    pytest.param(Case(B1_LONG, (4, 4), page=5, causal=False, split=1000, tiles=(16,)), id="b1-noncausal-split-q16"),
    # --- layouts and strides ----------------------------------------------------------------------------------------
    pytest.param(Case(B12_SHORT, page=16, cache="tuple", q_slice=True), id="tuple-cache-fused-qkv-slice"),
    pytest.param(Case(B12_SHORT, page=5, layout="HND", cache="tuple"), id="tuple-cache-hnd-p5"),
    pytest.param(Case(B12_SHORT, layout="HND", q_slice=True, dtype="fp16"), id="ragged-hnd-qslice-fp16"),
    pytest.param(Case(EMPTY, page=16), id="empty-requests-p16"),
    pytest.param(Case(EMPTY, causal=False), id="empty-requests-ragged"),
    # --- options -----------------------------------------------------------------------------------------------------
    pytest.param(Case(B12, opts={"window_left": 100, "logits_soft_cap": 30.0}, loose=2), id="window100-softcap30"),
    pytest.param(Case(B12_SHORT, (28, 4), page=5, opts={"pos_encoding": "alibi"}), id="alibi-28heads-p5"),
    pytest.param(
        Case(B12_SHORT, (4, 4), (64, 64), causal=False, dtype="fp16", opts={"sm_scale": 0.3, "window_left": 0}),
        id="window0-smscale",
    ),
    pytest.param(Case(B12_SHORT, mask=True, tiles=(32,)), id="custom-mask-q32"),
    pytest.param(Case(B12, opts={"pos_encoding": "rope_llama"}, rope_rounded=True), id="rope-b12mix-ragged"),
    pytest.param(
        Case(
            QO_MIX,
            (28, 4),
            page=5,
            dtype="fp16",
            sms=1,
            rope_rounded=True,
            opts={"pos_encoding": "rope_llama", "rope_theta": 5e5, "rope_scale": 2.0},
        ),
        id="rope-theta5e5-scale2-p5-fp16-one-sm",
    ),  # fmt: skip
    pytest.param(
        Case(
            B12_SHORT,
            (4, 4),
            (64, 64),
            page=16,
            causal=False,
            tiles=(16,),
            rope_rounded=True,
            opts={"pos_encoding": "rope_llama", "logits_soft_cap": 20.0},
        ),
        id="rope-softcap-d64-p16-q16",
    ),  # fmt: skip
    pytest.param(Case(B1_LONG, split=1000, opts={"pos_encoding": "rope_llama"}, rope_rounded=True), id="rope-split"),
    pytest.param(Case(B12_SHORT, (4, 4), page=16, mask=True, causal=False, dtype="fp16"), id="custom-mask-p16"),
    # --- many items per CTA: the cross-item pipeline ------------------------------------------------------------------
    pytest.param(Case(B12, sms=1), id="one-sm-b12mix-ragged"),
    pytest.param(Case(QO_MIX, page=16, sms=1), id="one-sm-qo>kv-mix-p16"),
    pytest.param(Case(QO_MIX, split=256, sms=1), id="one-sm-qo>kv-mix-split256"),
    pytest.param(Case(QO_MIX, page=5, dtype="fp16", tiles=(128, 32, 3), sms=1), id="one-sm-qo>kv-mix-p5-3stages"),
    pytest.param(Case(QO_MIX, (28, 4), (256, 256), page=1, tiles=(128,), sms=1), id="one-sm-d256-8warps-p1"),
    # --- paired blocks (two CTAs of the plan per block; the policy pairs the ragged 128 x 64 tiles at d128) ----------
    pytest.param(Case(B12, tiles=(128, 64, 2, 1)), id="b12mix-ragged-unpaired"),
    pytest.param(Case(QO_MIX, split=256, sms=1, tiles=(128, 64, 2, 2)), id="one-sm-paired-qo>kv-mix-split256"),
    pytest.param(Case(QO_MIX, page=5, sms=2, tiles=(128, 64, 2, 2)), id="two-sm-paired-p5"),
    pytest.param(Case(B12, (28, 4), causal=False, dtype="fp16", tiles=(64, 64, 2, 2)), id="paired-q64-fp16"),
    pytest.param(Case(B12, (4, 4), (64, 64), tiles=(128, 32, 3, 2)), id="paired-d64-3stages"),
    # --- logits that keep rising along the keys: the rows' max climbs far above its first tiles' (the softmax's
    # lazy rescale and, on sm_90, the max-free tiles' fallback that recomputes a tile on the exact path) ---------------
    pytest.param(Case(B12, ramp=6.0), id="rising-logits-b12mix-ragged"),
    pytest.param(
        Case(B12_SHORT, (28, 4), causal=False, dtype="fp16", ramp=6.0, tiles=(64,)), id="rising-logits-fp16-q64"
    ),
    pytest.param(Case(QO_MIX, ramp=6.0, sms=1), id="rising-logits-one-sm-qo>kv-mix"),
    # --- ALiBi (Variant.rising_logits): an item's KV tiles run backwards (loader.cuh TileOrder), through every path
    # that places tiles: split items, the cross-item pipeline (next item's first tile and pages), 3 stages, paired
    # blocks, more queries than keys, a window's lower bound ----------------------------------------------------------
    pytest.param(Case(B12, split=256, opts={"pos_encoding": "alibi"}), id="alibi-ragged-split256"),
    pytest.param(
        Case(QO_MIX, page=5, tiles=(128, 32, 3), sms=1, opts={"pos_encoding": "alibi"}), id="alibi-one-sm-p5-3stages"
    ),
    pytest.param(Case(QO_MIX, sms=1, tiles=(128, 64, 2, 2), opts={"pos_encoding": "alibi"}), id="alibi-one-sm-paired"),
    pytest.param(Case(QO_GT_KV, page=16, tiles=(64,), opts={"pos_encoding": "alibi"}), id="alibi-qo>kv-p16-q64"),
    pytest.param(
        Case(B1_LONG, split=1000, opts={"pos_encoding": "alibi", "window_left": 300, "logits_soft_cap": 30.0}, loose=2),
        id="alibi-window300-softcap-split",
    ),
]


def _framework(name: str):
    from conftest import _load_framework

    return _load_framework(name)


def _indptr(lens) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _build(rng, c: Case):
    """Host data: q, (k, v) ragged or a paged cache, index arrays, and the reference inputs."""
    dt = DTYPES[c.dtype][0]
    qo, kv = (np.asarray(x) for x in c.lens)
    hq, hkv = c.heads
    dqk, dvo = c.dims
    q = (2 * rng.standard_normal((int(qo.sum()), hq, dqk), dtype=np.float32)).astype(dt)
    out = dict(q=q, qo_indptr=_indptr(qo))
    if c.page is None:
        k = rng.standard_normal((int(kv.sum()), hkv, dqk), dtype=np.float32)
        if c.ramp:
            pos = np.concatenate([np.arange(n) / max(n, 1) for n in kv]).astype(np.float32)
            k *= (1 + c.ramp * pos)[:, None, None]
        k = k.astype(dt)
        v = rng.standard_normal((int(kv.sum()), hkv, dvo), dtype=np.float32).astype(dt)
        out.update(k=k, v=v, kv_indptr=_indptr(kv))
    else:
        ps = c.page
        pages = (kv + ps - 1) // ps
        num_pages = int(pages.sum()) + 3
        shape = (num_pages, 2, ps, hkv, dqk) if c.layout == "NHD" else (num_pages, 2, hkv, ps, dqk)
        out.update(
            cache=rng.standard_normal(shape, dtype=np.float32).astype(dt),
            kv_indptr=_indptr(pages),
            kv_indices=rng.permutation(num_pages)[: int(pages.sum())].astype(np.int32),  # scattered pages
            kv_last_page_len=np.where(pages > 0, kv - (pages - 1) * ps, 1).astype(np.int32),
        )
    if c.mask:
        out["mask"] = rng.random(int((qo * kv).sum())) < 0.7
    return out


def _rope_rounded(c: Case, h: dict) -> dict:
    """q and k (ragged or the paged cache, NHD) rotated by RoPE in float64 and rounded to the input dtype: q row i of
    a request at kv position i + kv_len - qo_len, key j at j."""
    from cuinfer.reference.positional import rope

    assert c.layout == "NHD", "the rounded-RoPE reference handles NHD"
    dt = DTYPES[c.dtype][0]
    kw = {k: v for k, v in c.opts.items() if k in ("rope_scale", "rope_theta")}
    qo = h["qo_indptr"]
    out = dict(h)
    q = h["q"].copy()
    if c.page is None:
        kvp = h["kv_indptr"]
        k = h["k"].copy()
        kv_lens = np.diff(kvp)
    else:
        ps, pi, last = c.page, h["kv_indptr"], h["kv_last_page_len"]
        cache = h["cache"].copy()
        kv_lens = np.array(
            [0 if pi[b + 1] == pi[b] else (pi[b + 1] - pi[b] - 1) * ps + last[b] for b in range(len(qo) - 1)]
        )
    for b in range(len(qo) - 1):
        n_q, n_kv = qo[b + 1] - qo[b], int(kv_lens[b])
        if n_q:
            pos = np.arange(n_q) + n_kv - n_q
            q[qo[b] : qo[b + 1]] = rope(h["q"][qo[b] : qo[b + 1]].astype(np.float64), pos, **kw).astype(dt)
        if n_kv == 0:
            continue
        rows = np.arange(n_kv)
        if c.page is None:
            k[kvp[b] : kvp[b + 1]] = rope(h["k"][kvp[b] : kvp[b + 1]].astype(np.float64), rows, **kw).astype(dt)
        else:
            pages = h["kv_indices"][pi[b] : pi[b + 1]]
            page, slot = pages[rows // ps], rows % ps
            cache[page, 0, slot] = rope(h["cache"][page, 0, slot].astype(np.float64), rows, **kw).astype(dt)
    out["q"] = q
    if c.page is None:
        out["k"] = k
    else:
        out["cache"] = cache
    return out


def _reference(c: Case, h: dict):
    if c.rope_rounded:
        h = _rope_rounded(c, h)
        c = dataclasses.replace(
            c, opts={k: v for k, v in c.opts.items() if not k.startswith(("pos_encoding", "rope_"))}
        )
    kw = dict(causal=c.causal, custom_mask=h.get("mask"), **c.opts)
    if c.page is None:
        return reference.batch_attention_ragged(h["q"], h["k"], h["v"], h["qo_indptr"], h["kv_indptr"], **kw)
    return reference.batch_prefill_paged(
        h["q"], h["cache"], h["qo_indptr"], h["kv_indptr"], h["kv_indices"], h["kv_last_page_len"],
        kv_layout=c.layout, **kw,
    )  # fmt: skip


def _check(o, lse, ref_o, ref_lse, dtype: str, loose: float = 1.0, what: str = "o"):
    u = DTYPES[dtype][1]
    o = np.asarray(o, np.float64)
    assert np.isfinite(o).all(), f"{what} has NaN/inf: an element was never written (outputs are poisoned with NaN)"
    err = np.abs(o - ref_o)
    rms = np.sqrt(np.mean(ref_o**2, axis=-1, keepdims=True))
    bound = loose * 4 * u * (np.abs(ref_o) + rms) + 1e-6
    if (err > bound).any():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        raise AssertionError(
            f"{what}: {(err > bound).sum()} of {err.size} elements beyond 4u(|ref| + row rms); worst at {i}: "
            f"got {o[i]:.6f}, want {ref_o[i]:.6f} (max error {err.max():.3e})"
        )
    lse = np.asarray(lse, np.float64)
    empty = np.isneginf(ref_lse)
    assert np.isneginf(lse[empty]).all(), "a row with no keys must have lse = -inf"
    assert (o[empty] == 0).all(), "a row with no keys must have o = 0 exactly"
    tol = 1e-3 * loose
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=tol, atol=tol, err_msg=f"lse of {what}")


def _poison_workspace(w) -> None:
    if w._buffers is not None:
        w._buffers.workspace.fill(0xFF)  # 0xFFFFFFFF is a float32 NaN


def _run_case(fw, c: Case, h: dict):
    """Plan + run on the GPU with poisoned outputs; returns (o, lse) on the host and the wrapper."""
    from cuinfer.prefill import BatchPrefill

    dt = DTYPES[c.dtype][0]
    hq, hkv = c.heads
    dqk, dvo = c.dims
    q = h["q"]
    w = BatchPrefill(paged=c.page is not None, kv_layout=c.layout, backend=c.backend)
    kw = dict(
        num_qo_heads=hq, num_kv_heads=hkv, head_dim=dqk, head_dim_vo=dvo, causal=c.causal, q_dtype=dt,
        custom_mask=h.get("mask"), fixed_split_size=c.split, tile_sizes=c.tiles, num_sms=c.sms, **c.opts,
    )  # fmt: skip
    if c.page is None:
        w.plan(h["qo_indptr"], h["kv_indptr"], **kw)
        k, v = h["k"], h["v"]
        if c.layout == "HND":
            k, v = np.ascontiguousarray(k.transpose(1, 0, 2)), np.ascontiguousarray(v.transpose(1, 0, 2))
        kv = (fw.asarray(k), fw.asarray(v))
    else:
        w.plan(h["qo_indptr"], h["kv_indptr"], h["kv_indices"], h["kv_last_page_len"], page_size=c.page, **kw)
        cache = h["cache"]
        kv = ((fw.asarray(cache[:, 0]), fw.asarray(cache[:, 1])),) if c.cache == "tuple" else (fw.asarray(cache),)
    fa2_tiles = w.plan_backend == "fa2"  # (the sm90 kernel has its own fixed tiles)
    if c.tiles is not None:
        assert w._plan.config.tile_q == c.tiles[0]
        if len(c.tiles) > 3:
            assert w._plan.config.groups == c.tiles[3]
    elif c.page is None and c.dims == (128, 128) and w._plan.config.tile_q == 128 and not c.opts and fa2_tiles:
        assert w._plan.config.groups == 2, "the policy pairs the ragged 128 x 64 tiles at head dim 128"
    if c.split is not None and w._plan.work.n_items:
        assert w._plan.work.num_partial_rows > 0, "the fixed split size must split something"
    if c.q_slice:
        n = q.shape[0]
        width = hq * dqk
        fused = np.concatenate([q.reshape(n, width), q.reshape(n, width)[:, : 2 * hkv * dqk]], axis=1)
        gq = fw.asarray(fused)[:, :width].reshape(n, hq, dqk)  # strides (fused width, d, 1): a view
    else:
        gq = fw.asarray(q)
    out = fw.asarray(np.full((q.shape[0], hq, dvo), np.nan, dt))
    lse = fw.asarray(np.full((q.shape[0], hq), np.nan, np.float32))
    _poison_workspace(w)
    o, lse_out = w.run(gq, *kv, out=out, lse=lse)
    assert o is out and lse_out is lse
    return fw.to_numpy(o), fw.to_numpy(lse), w, (gq, kv)


@pytest.mark.parametrize("c", CASES)
def test_batch_prefill(rng, c: Case):
    fw = _framework("cupy")
    h = _build(rng, c)
    ref_o, ref_lse = _reference(c, h)
    o, lse, w, (gq, kv) = _run_case(fw, c, h)
    _check(o, lse, ref_o, ref_lse, c.dtype, c.loose)
    if c.split is None and not c.mask:  # the plan is reusable, and the kernel without lse gives the same o
        o2 = w.run(gq, *kv)
        np.testing.assert_array_equal(fw.to_numpy(o2).astype(np.float32), o.astype(np.float32))


@pytest.mark.parametrize(
    ("fw_name", "layout", "lens", "heads", "dims", "dt", "causal"),
    [
        pytest.param("torch", "NHD", (577, 4097), (32, 8), (128, 128), "bf16", True, id="torch-nhd-577x4097-causal"),
        pytest.param("cupy", "HND", (17, 97), (28, 4), (64, 64), "fp16", False, id="cupy-hnd-17x97"),
        pytest.param("jax", "NHD", (127, 512), (4, 4), (256, 256), "bf16", True, id="jax-nhd-127x512-d256"),
        pytest.param("torch", "NHD", (37, 54), (32, 8), (192, 128), "fp16", True, id="torch-d192x128"),
        pytest.param("cupy", "NHD", (127, 17), (32, 8), (128, 128), "bf16", True, id="cupy-qo>kv-causal"),
    ],
)
def test_single_prefill(rng, fw_name, layout, lens, heads, dims, dt, causal):
    from cuinfer.prefill import single_prefill

    fw = _framework(fw_name)
    dtype = DTYPES[dt][0]
    (lq, lkv), (hq, hkv), (dqk, dvo) = lens, heads, dims
    q = (2 * rng.standard_normal((lq, hq, dqk), dtype=np.float32)).astype(dtype)
    k = rng.standard_normal((lkv, hkv, dqk), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((lkv, hkv, dvo), dtype=np.float32).astype(dtype)
    ref_o, ref_lse = reference.attention(q, k, v, causal=causal)
    if layout == "HND":
        k, v = np.ascontiguousarray(k.transpose(1, 0, 2)), np.ascontiguousarray(v.transpose(1, 0, 2))
    o, lse = single_prefill(
        fw.asarray(q), fw.asarray(k), fw.asarray(v), causal=causal, kv_layout=layout, return_lse=True
    )
    assert tuple(o.shape) == (lq, hq, dvo) and tuple(lse.shape) == (lq, hq)
    _check(fw.to_numpy(o), fw.to_numpy(lse), ref_o, ref_lse, dt)


def test_cuda_graph_replays_after_replan(rng):
    """A run captured once keeps working after plan() is called again with other lengths (within the capacity)."""
    from cuinfer.prefill import BatchPrefill

    cupy = _framework("cupy").module
    hq, hkv, d, ps = 32, 8, 128, 16
    lens_a = ((100, 37, 5, 260), (300, 600, 77, 260))  # 79 pages: the graph buffers hold twice that
    lens_b = ((17, 300, 76, 9), (17, 500, 1000, 9))  # 98 pages, the same 402 query tokens
    num_pages = 200
    cache = rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    perm = rng.permutation(num_pages).astype(np.int32)
    q_all = (2 * rng.standard_normal((402, hq, d), dtype=np.float32)).astype(ml_dtypes.bfloat16)

    def table(lens):
        qo, kv = (np.asarray(x) for x in lens)
        pages = (kv + ps - 1) // ps
        return _indptr(qo), _indptr(pages), perm[: pages.sum()], (kv - (pages - 1) * ps).astype(np.int32)

    w = BatchPrefill(use_cuda_graph=True, max_batch_size=8)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, causal=True, q_dtype="bfloat16")
    n = sum(lens_a[0])
    assert n == sum(lens_b[0])  # a captured run keeps the shapes of its arrays
    gq, gc = cupy.asarray(q_all[:n]), cupy.asarray(cache)
    out = cupy.full((n, hq, d), np.nan, dtype=ml_dtypes.bfloat16)
    lse = cupy.full((n, hq), np.nan, dtype=np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        w.plan(*table(lens_a), **kw)
        w.run(gq, gc, out=out, lse=lse)  # compiles and loads everything before the capture
        stream.begin_capture()
        w.run(gq, gc, out=out, lse=lse)
        graph = stream.end_capture()
    for lens in (lens_a, lens_b):
        with stream:
            w.plan(*table(lens), **kw)
            out.fill(np.nan)
            lse.fill(np.nan)
            graph.launch(stream)
        stream.synchronize()
        ref_o, ref_lse = reference.batch_prefill_paged(q_all[:n], cache, *table(lens), causal=True)
        _check(out.get(), lse.get(), ref_o, ref_lse, "bf16", what=f"graph replay {lens}")


@pytest.mark.parametrize("split", [pytest.param(None, id="unsplit"), pytest.param(256, id="split256")])
def test_shared_tail_is_taken_once_per_launch(rng, monkeypatch, split):
    """A plan whose sorted deal leaves half its cost to the shared tail (the CTAs take those items by an atomic
    counter): every output row right in three launches in a row and in CUDA-graph replays after a re-plan, and the
    counters back at 0 after each launch (outputs poisoned before every run)."""
    from cuinfer.planner import assign as plan_assign

    from cuinfer.prefill import BatchPrefill

    monkeypatch.setattr(plan_assign, "POOL_SHARE", 0.5)
    fw = _framework("cupy")
    cupy = fw.module
    c = Case(((577, 127, 1000, 37, 300), (4097, 513, 1000, 97, 2048)), heads=(28, 4))
    h = _build(rng, c)
    ref_o, ref_lse = _reference(c, h)
    w = BatchPrefill(paged=False, backend="fa2")  # (the FA2-class plan's pool: plan_assign.POOL_SHARE)
    kw = dict(num_qo_heads=28, num_kv_heads=4, head_dim=128, causal=True, q_dtype="bfloat16", fixed_split_size=split)
    w.plan(h["qo_indptr"], h["kv_indptr"], **kw)
    work = w._plan.work
    assert work.assign_mode == "snake+pool" and work.n_pool >= 100, (work.assign_mode, work.n_pool)
    gq, gk, gv = fw.asarray(h["q"]), fw.asarray(h["k"]), fw.asarray(h["v"])
    n = h["q"].shape[0]
    for launch in range(3):
        out = cupy.full((n, 28, 128), np.nan, dtype=ml_dtypes.bfloat16)
        lse = cupy.full((n, 28), np.nan, dtype=np.float32)
        _poison_workspace(w)
        w.run(gq, gk, gv, out=out, lse=lse)
        _check(out.get(), lse.get(), ref_o, ref_lse, "bf16", what=f"launch {launch}")
        assert w._buffers.merge_count[:2].get().tolist() == [0, 0], "the last CTA out resets the pool counters"

    if split is not None:
        return  # (CUDA-graph capacities follow the automatic split policy)
    # CUDA graph: captured once, replayed after a plan of other lengths (the same token counts: the tail moves)
    g = BatchPrefill(paged=False, use_cuda_graph=True, max_batch_size=8, workspace_bytes=256 << 20)
    ind_a = (h["qo_indptr"], h["kv_indptr"])
    ind_b = (_indptr((600, 127, 977, 37, 300)), _indptr((700, 2000, 977, 3778, 300)))
    assert ind_b[0][-1] == ind_a[0][-1] and ind_b[1][-1] == ind_a[1][-1]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        g.plan(*ind_a, **kw)
        g.run(gq, gk, gv, out=out, lse=lse)  # compiles and loads everything before the capture
        stream.begin_capture()
        g.run(gq, gk, gv, out=out, lse=lse)
        graph = stream.end_capture()
    for ind in (ind_b, ind_a, ind_b):
        with stream:
            g.plan(*ind, **kw)
            assert g._plan.work.n_pool > 0
            out.fill(np.nan)
            lse.fill(np.nan)
            graph.launch(stream)
        stream.synchronize()
        ro, rl = reference.batch_attention_ragged(h["q"], h["k"], h["v"], *ind, causal=True)
        _check(out.get(), lse.get(), ro, rl, "bf16", what=f"graph replay, kv_indptr {ind[1].tolist()}")
        assert g._buffers.merge_count[:2].get().tolist() == [0, 0]


def test_one_wrapper_replanned_runs_fresh_launches(rng):
    """run() keeps what a plan launches (kernel, plan-buffer and workspace pointers, parameter struct) between calls:
    re-planning the same wrapper -- a bigger batch that grows the plan buffer, a split plan that needs the merge, an
    unsplit one again -- and new output arrays must each take effect. Outputs poisoned before every run."""
    from cuinfer.prefill import BatchPrefill

    fw = _framework("cupy")
    w = BatchPrefill(paged=False)
    # 24 items unsplit; 3184 items split at 256 (the plan buffer grows); B12 split by the planner; 4 x (577, 4097)
    # unsplit again
    split_seen = []
    for lens, split in (
        (((5, 17), (54, 97)), None), (B17, 256), (B12, None), (((577,) * 4, (4097,) * 4), None)
    ):  # fmt: skip
        c = Case(lens)
        h = _build(rng, c)
        ref_o, ref_lse = _reference(c, h)
        w.plan(h["qo_indptr"], h["kv_indptr"], num_qo_heads=32, num_kv_heads=8, head_dim=128, causal=True,
               q_dtype="bfloat16", fixed_split_size=split)  # fmt: skip
        split_seen.append(bool(w._plan.work.n_merge > 0))
        gq, gk, gv = fw.asarray(h["q"]), fw.asarray(h["k"]), fw.asarray(h["v"])
        for _ in range(2):  # a second pair of output arrays: new pointers for the same plan
            out = fw.asarray(np.full((h["q"].shape[0], 32, 128), np.nan, ml_dtypes.bfloat16))
            lse = fw.asarray(np.full((h["q"].shape[0], 32), np.nan, np.float32))
            _poison_workspace(w)
            w.run(gq, gk, gv, out=out, lse=lse)
            _check(fw.to_numpy(out), fw.to_numpy(lse), ref_o, ref_lse, "bf16", what=f"re-planned {lens[0][:3]}...")
    assert split_seen[0] is False and split_seen[1] is True and split_seen[-1] is False, split_seen


def test_gpu_errors_before_launch(rng):
    """Host-side checks of run() with device arrays: nothing is launched for a bad page table or a misaligned q."""
    from cuinfer.prefill import BatchPrefill

    fw = _framework("cupy")
    c = Case(B12_SHORT, page=16)
    h = _build(rng, c)
    w = BatchPrefill()
    w.plan(h["qo_indptr"], h["kv_indptr"], h["kv_indices"], h["kv_last_page_len"], num_qo_heads=32, num_kv_heads=8,
           head_dim=128, page_size=16, q_dtype="bfloat16")  # fmt: skip
    q, cache = h["q"], h["cache"]
    small = fw.asarray(cache[: int(h["kv_indices"].max())])
    with pytest.raises(ValueError, match=r"kv_indices holds page index \d+ but kv_cache has \d+ pages"):
        w.run(fw.asarray(q), small)
    flat = fw.asarray(np.concatenate([q.reshape(-1), q.reshape(-1)[:1]]))
    with pytest.raises(ValueError, match="q must start on a 16-byte boundary"):
        w.run(flat[1:].reshape(q.shape), fw.asarray(cache))
    with pytest.raises(ValueError, match=r"q has \d+ rows but qo_indptr\[-1\]"):
        w.run(fw.asarray(q[:-1]), fw.asarray(cache))
    k_only = fw.asarray(np.ascontiguousarray(cache[:, 0]))
    v_strided = fw.asarray(cache)[:, 1]
    with pytest.raises(ValueError, match="k_cache and v_cache must have the same strides"):
        w.run(fw.asarray(q), (k_only, v_strided))


# ---- the canary ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _canary():
    from conftest import run_canary

    run_canary(__file__, "prefill", "one small case per kernel family")


def _canary_main() -> None:
    """Small cases of each kernel family (ragged / paged, split, small and large tiles); exit 1 on a wrong result."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fw = _framework("cupy")
    rng = np.random.default_rng(11)
    small = ((3, 40, 1, 0, 29), (5, 97, 54, 3, 29))
    for c in (
        Case(small, (8, 2)),
        Case(small, (8, 2), page=5, split=16),
        Case(small, (8, 8), (64, 64), page=16, tiles=(16,)),
        Case(small, (4, 2), (256, 256), causal=False, tiles=(64,)),
        Case(small, (8, 2), page=5, sms=1),  # several items per CTA: the cross-item pipeline
    ):
        h = _build(rng, c)
        ref_o, ref_lse = _reference(c, h)
        o, lse, _, _ = _run_case(fw, c, h)
        fw.module.cuda.runtime.deviceSynchronize()
        _check(o, lse, ref_o, ref_lse, c.dtype, what=f"canary {c}")
        print(f"canary page={c.page} split={c.split} tiles={c.tiles}: ok", flush=True)


if __name__ == "__main__":
    _canary_main()
