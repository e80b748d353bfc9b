"""The Hopper prefill kernel (``BatchPrefill(paged=False, backend="sm90")``) against the float64 reference: request
mixes with tails that cross a tile (the cp.async zero-filled tiles), rows that see no key, empty requests, GQA groups
1 / 4 / 8, both 16-bit types, NHD and HND K / V, a strided q view, split items merged by the merge kernel, one SM
(every item from one CTA's list and the pool), and the variants it runs (soft cap, ALiBi, sliding window, custom
mask); paged caches (page sizes 1, 5, 16, NHD and HND, a 5-D cache and a (k, v) pair). Outputs and the workspace are
NaN-poisoned before each run. Skipped without an sm_90 GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_prefill import B1_LONG, B12, EMPTY, QO_GT_KV, QO_MIX, Case, _build, _check, _framework, _reference, _run_case

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    from cuinfer.runtime.device import current_device_id, device_info

    return device_info(current_device_id()).arch == "sm_90a"


def sm90(lens, **kw) -> Case:
    return Case(lens, backend="sm90", **kw)


LONG_TAIL = ((1000, 300), (1000, 1500))  # 1000 and 1500 keys: tiles that cross the last key of a request
CASES = [
    pytest.param(sm90(B1_LONG), id="b1-q577-kv4097-32x8-bf16-causal"),
    pytest.param(sm90(B12), id="b12mix-32x8-bf16-causal"),
    pytest.param(sm90(B12, causal=False, dtype="fp16"), id="b12mix-32x8-fp16-noncausal"),
    pytest.param(sm90(QO_GT_KV), id="qo>kv-causal-rows-without-keys"),
    pytest.param(sm90(QO_MIX), id="qomix-causal-empty-items"),
    pytest.param(sm90(EMPTY, causal=False), id="empty-requests"),
    pytest.param(sm90(LONG_TAIL, heads=(8, 8)), id="tails-gqa1"),
    pytest.param(sm90(LONG_TAIL, heads=(64, 8)), id="tails-gqa8"),
    pytest.param(sm90(B12, layout="HND", q_slice=True, dtype="fp16"), id="b12mix-hnd-qslice-fp16"),
    pytest.param(sm90(B12, split=256), id="b12mix-split256"),
    pytest.param(sm90(B1_LONG, split=512, causal=False), id="b1-split512-noncausal"),
    pytest.param(sm90(B12, sms=1), id="b12mix-one-sm"),
    pytest.param(sm90(B12, ramp=6.0), id="b12mix-rising-logits"),
    pytest.param(sm90(B12, opts={"logits_soft_cap": 30.0}), id="b12mix-soft-cap"),
    pytest.param(sm90(B12, opts={"pos_encoding": "alibi"}), id="b12mix-alibi"),
    pytest.param(sm90(B12, split=256, opts={"pos_encoding": "alibi"}), id="b12mix-alibi-split256"),
    pytest.param(sm90(B12, opts={"window_left": 100}), id="b12mix-window100"),
    pytest.param(sm90(B1_LONG, opts={"window_left": 1024}), id="b1-window1024"),
    pytest.param(sm90(B1_LONG, split=256, opts={"window_left": 300}), id="b1-window300-split256"),
    pytest.param(sm90(B12, mask=True, dtype="fp16"), id="b12mix-custom-mask-fp16"),
]


# Paged caches (K / V rows gathered by page table with cp.async, streamed through the stage barriers)
PAGED_CASES = [
    pytest.param(sm90(B12, page=16), id="paged-b12mix-page16-bf16-causal"),
    pytest.param(sm90(B1_LONG, page=1), id="paged-b1-page1"),
    pytest.param(sm90(QO_MIX, page=5, dtype="fp16"), id="paged-qomix-page5-fp16"),
    pytest.param(sm90(B12, page=16, layout="HND", cache="tuple", causal=False), id="paged-b12mix-hnd-tuple-noncausal"),
    pytest.param(sm90(LONG_TAIL, page=16, heads=(64, 8), split=256), id="paged-tails-gqa8-split256"),
    pytest.param(sm90(B12, page=16, mask=True), id="paged-b12mix-custom-mask"),
    pytest.param(sm90(B12, page=16, opts={"pos_encoding": "alibi", "window_left": 300}), id="paged-alibi-window300"),
]


@pytest.mark.parametrize("c", CASES + PAGED_CASES)
def test_batch_prefill_sm90(rng, c: Case):
    if not _hopper():
        pytest.skip("backend='sm90' needs an sm_90 GPU")
    fw = _framework("cupy")
    h = _build(rng, c)
    o, lse, w, _ = _run_case(fw, c, h)
    assert w.backend == "sm90" and type(w._launch_state).__name__ == "Sm90Launch"
    ref_o, ref_lse = _reference(c, h)
    _check(o, lse, ref_o, ref_lse, c.dtype, c.loose)


def test_sm90_nan_in_next_request_stays_out(rng):
    """A request's tail tile must not read the next request's rows: NaN values there (weighted 0) would turn the
    tail's P·V into NaN. Request 0 has 1000 keys (its last tile crosses into request 1, whose V is NaN)."""
    if not _hopper():
        pytest.skip("backend='sm90' needs an sm_90 GPU")
    from cuinfer.prefill import BatchPrefill

    fw = _framework("cupy")
    c = sm90(((1000, 300), (1000, 1500)), heads=(8, 8))
    h = _build(rng, c)
    v_nan = h["v"].copy()
    v_nan[1000:] = np.nan
    w = BatchPrefill(paged=False, backend="sm90")
    w.plan(h["qo_indptr"], h["kv_indptr"], num_qo_heads=8, num_kv_heads=8, head_dim=128, causal=True,
           q_dtype=h["q"].dtype)  # fmt: skip
    o, lse = w.run(fw.asarray(h["q"]), fw.asarray(h["k"]), fw.asarray(v_nan), return_lse=True)
    o = fw.to_numpy(o)[:1000]
    ref_o, ref_lse = _reference(c, h)
    _check(o, fw.to_numpy(lse)[:1000], ref_o[:1000], ref_lse[:1000], c.dtype)


@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_sm90_cuda_graph_replays_later_plans(rng, paged):
    """CUDA-graph mode on the Hopper kernel: one capture, then replays after plans of other lengths (the same token
    totals), each checked against float64 with poisoned outputs; the TMA maps and the plan-buffer pointers are the
    captured launch's."""
    if not _hopper():
        pytest.skip("backend='sm90' needs an sm_90 GPU")
    import cupy

    from cuinfer import reference
    from cuinfer.prefill import BatchPrefill

    lens_a = ((600, 127, 977, 37, 300), (4097, 513, 1000, 97, 2048))
    lens_b = ((700, 27, 977, 137, 200), (700, 2000, 977, 3778, 300))
    c = sm90(lens_a, page=16 if paged else None)
    h = _build(rng, c)
    kw = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, causal=True, q_dtype=h["q"].dtype)
    g = BatchPrefill(paged=paged, use_cuda_graph=True, max_batch_size=8)
    n = h["q"].shape[0]
    fw = _framework("cupy")
    gq = fw.asarray(h["q"])
    if paged:
        cache = h["cache"]
        kv = (fw.asarray(cache),)
        pages = cache.shape[0]

        def index(lens):
            kv_lens = np.asarray(lens[1])
            npg = -(-kv_lens // 16)
            assert npg.sum() <= pages
            ind = np.concatenate([[0], np.cumsum(npg)]).astype(np.int32)
            qo = np.concatenate([[0], np.cumsum(lens[0])]).astype(np.int32)
            last = ((kv_lens - 1) % 16 + 1).astype(np.int32)
            return qo, ind, rng.permutation(pages)[: ind[-1]].astype(np.int32), last

        extra = dict(page_size=16)
    else:
        kv = (fw.asarray(h["k"]), fw.asarray(h["v"]))

        def index(lens):
            return tuple(np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in lens)

        extra = {}
    ind_a, ind_b = index(lens_a), index(lens_b)
    assert ind_b[0][-1] == ind_a[0][-1] and (paged or ind_b[1][-1] == ind_a[1][-1])
    out = cupy.full((n, 32, 128), np.nan, dtype=h["q"].dtype)
    lse = cupy.full((n, 32), np.nan, dtype=np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        g.plan(*ind_a, **kw, **extra)
        assert g.plan_backend == "sm90"
        g.run(gq, *kv, out=out, lse=lse)  # compiles and loads everything before the capture
        stream.begin_capture()
        g.run(gq, *kv, out=out, lse=lse)
        graph = stream.end_capture()
    for ind in (ind_b, ind_a, ind_b):
        with stream:
            g.plan(*ind, **kw, **extra)
            out.fill(np.nan)
            lse.fill(np.nan)
            g._buffers.workspace.fill(0xFF)
            graph.launch(stream)
        stream.synchronize()
        if paged:
            ro, rl = reference.batch_prefill_paged(h["q"], h["cache"], *ind, causal=True)
        else:
            ro, rl = reference.batch_attention_ragged(h["q"], h["k"], h["v"], *ind, causal=True)
        _check(out.get(), lse.get(), ro, rl, c.dtype)


def test_sm90_auto_picks_the_hopper_kernel(rng):
    """backend="auto" on an sm_90 GPU: long prefills on the Hopper kernel, a batch of short appends on
    the FA2-class kernel; both against float64."""
    if not _hopper():
        pytest.skip("needs an sm_90 GPU")
    fw = _framework("cupy")
    for lens, expect in ((((1000, 300), (1000, 1500)), "sm90"), (((16,) * 8, (700,) * 8), "fa2")):
        c = Case(lens)
        h = _build(rng, c)
        o, lse, w, _ = _run_case(fw, c, h)
        assert w.plan_backend == expect
        ref_o, ref_lse = _reference(c, h)
        _check(o, lse, ref_o, ref_lse, c.dtype, c.loose)


@pytest.mark.parametrize(
    "cap, dtype, free",
    [(30.0, "bf16", True), (50.0, "bf16", True), (54.7, "bf16", True), (60.0, "bf16", False), (50.0, "fp16", False)],
)
def test_sm90_soft_cap_rows_saturated_at_both_ends(rng, cap, dtype, free):
    """The soft cap at the ends of its range: every key of a row aligned with its query (logits saturated at +cap)
    or against it (at -cap; with the max-free softmax, p = 2^(32 - 2 cap log2 e) there: 2^-125.8 at cap 54.7), and
    rows of mixed keys, against the float64 reference. The max-free kernel runs where the bound allows (bfloat16,
    cap log2 e <= 79), the running max elsewhere."""
    if not _hopper():
        pytest.skip("backend='sm90' needs an sm_90 GPU")
    from test_prefill import DTYPES

    from cuinfer.prefill import BatchPrefill

    fw = _framework("cupy")
    dt = DTYPES[dtype][0]
    hq, hkv, d, n = 8, 2, 128, 700
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    # keys: u plus small noise; queries: +-200 u, so with sm_scale 1 the logits are ~ +-200: capped to ~ +-cap
    k = (u + 0.05 * rng.standard_normal((n, hkv, d))).astype(dt)
    sign = np.where(np.arange(n) % 3 == 0, 1.0, -1.0)[:, None, None]
    q = sign * 200.0 * u + 0.05 * rng.standard_normal((n, hq, d))
    q[n // 2 :: 7] = 3.0 * rng.standard_normal((len(q[n // 2 :: 7]), hq, d))  # (mixed rows)
    q = q.astype(dt)
    v = rng.standard_normal((n, hkv, d)).astype(dt)
    indptr = np.array([0, 300, n], np.int32)
    w = BatchPrefill(paged=False, backend="sm90")
    w.plan(indptr, indptr, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, causal=True, q_dtype=dt,
           logits_soft_cap=cap, sm_scale=1.0)  # fmt: skip
    out = fw.asarray(np.full((n, hq, d), np.nan, dt))
    o, lse = w.run(fw.asarray(q), fw.asarray(k), fw.asarray(v), out=out, return_lse=True)
    assert w._launch_state.max_free is free
    from cuinfer import reference

    ref_o, ref_lse = reference.batch_attention_ragged(q, k, v, indptr, indptr, causal=True, logits_soft_cap=cap,
                                                      sm_scale=1.0)  # fmt: skip
    assert np.abs(ref_lse).max() > cap * np.log2(np.e) * 0.99, "rows saturate at the cap"
    # tanh.approx: a saturated logit within cap * 2^-11 of the cap (lse within ~0.04 base 2 at cap 54.7)
    _check(fw.to_numpy(o), fw.to_numpy(lse), ref_o, ref_lse, dtype, loose=2.0 * cap / 30.0)


@pytest.mark.parametrize("backend", ["sm90", "fa2"])
def test_soft_cap_accurate_variant(rng, backend):
    """``variant="soft_cap_accurate"`` (the tanh to ~2e-7) against the float64 reference at the default tolerance,
    on the max-free Hopper kernel and the FA2-class kernel."""
    if backend == "sm90" and not _hopper():
        pytest.skip("backend='sm90' needs an sm_90 GPU")
    from cuinfer import reference
    from cuinfer.prefill import BatchPrefill

    fw = _framework("cupy")
    c = sm90(B12)
    h = _build(rng, c)
    w = BatchPrefill(paged=False, backend=backend)
    w.plan(h["qo_indptr"], h["kv_indptr"], num_qo_heads=32, num_kv_heads=8, head_dim=128, causal=True,
           q_dtype=h["q"].dtype, variant="soft_cap_accurate",
           variant_params={"soft_cap_accurate": {"cap": 30.0}})  # fmt: skip
    o, lse = w.run(fw.asarray(h["q"]), fw.asarray(h["k"]), fw.asarray(h["v"]), return_lse=True)
    if backend == "sm90":
        assert w._launch_state.max_free
    ref_o, ref_lse = reference.batch_attention_ragged(h["q"], h["k"], h["v"], h["qo_indptr"], h["kv_indptr"],
                                                      causal=True, logits_soft_cap=30.0)  # fmt: skip
    _check(fw.to_numpy(o), fw.to_numpy(lse), ref_o, ref_lse, c.dtype)
