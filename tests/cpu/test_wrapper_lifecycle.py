"""The plan/run lifecycle of ``cuinfer.runtime.wrapper`` on the GPU path, without a GPU: the device, the buffers, the
kernels and the caller's arrays are stand-ins that record what run() enqueues (uploads, launches and their parameter
structs), so CPU CI runs the hooks every wrapper supplies and the rules the base keeps: the plan words go up once per
plan and stream (every run in CUDA-graph mode), the parameter struct is rebuilt only when an array changes, split
prefill plans add the merge launch, and out= / lse= come back as given."""

from __future__ import annotations

import numpy as np
import pytest
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType

from cuinfer.decode import BatchDecode, single_decode
from cuinfer.prefill import BatchPrefill
from tests.cpu.fake_gpu import (
    FakeKernel,  # noqa: F401 (tests/lab/test_lab_harness.py takes the stand-ins from here)
    install,
)
from tests.cpu.fake_gpu import cuda as _cuda


@pytest.fixture
def gpu(monkeypatch):
    """A fake GPU: returns the log of uploads and launches, and ``stream`` (a one-element list) for run()'s calls."""
    return install(monkeypatch)


def _page_table(rng, lens, ps=16):
    pages = -(-np.asarray(lens) // ps)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = ((np.asarray(lens) - 1) % ps + 1).astype(np.int32)
    return indptr, rng.permutation(int(indptr[-1])).astype(np.int32), last


HEADS = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128)


def test_decode_uploads_once_per_plan_and_stream(gpu, rng):
    log, stream = gpu
    cache = (_cuda((4000, 16, 8, 128)), _cuda((4000, 16, 8, 128)))
    w = BatchDecode()
    w.plan(*_page_table(rng, rng.integers(1, 3000, 12)), **HEADS, page_size=16, q_dtype="bfloat16")
    q = _cuda((12, 32, 128))
    o = w.run(q, cache)
    assert o.shape == (12, 32, 128) and o.dtype is DType.BFLOAT16
    w.run(q, cache)
    stream[0] = 9
    out, lse = _cuda((12, 32, 128)), _cuda((12, 32), DType.FLOAT32)
    assert w.run(q, cache, out=out, lse=lse) == (out, lse)
    kinds = [(e[0], e[1]) if e[0] == "upload" else (e[0], e[2]) for e in log]
    assert kinds == [("upload", 7), ("launch", 7), ("launch", 7), ("upload", 9), ("launch", 9)]
    first, _, last = (e[3] for e in log if e[0] == "launch")
    assert first["q"] == q.ptr and first["lse"] == 0 and first["plan_words"] == last["plan_words"]
    assert last["o"] == out.ptr and last["lse"] == lse.ptr and last["lse_stride_b"] == 32


def test_decode_graph_mode_uploads_every_run(gpu, rng):
    log, _ = gpu
    cache = _cuda((4000, 2, 16, 8, 128))
    w = BatchDecode(use_cuda_graph=True, max_batch_size=16)
    for b in (12, 16):
        w.plan(*_page_table(rng, rng.integers(1, 3000, b)), **HEADS, page_size=16, q_dtype="bfloat16")
        q = _cuda((b, 32, 128))
        w.run(q, cache)
        w.run(q, cache)
    assert [e[0] for e in log] == ["upload", "launch"] * 4
    words = {e[3]["plan_words"] for e in log if e[0] == "launch"}
    assert len(words) == 1, "a captured run keeps reading one plan buffer"


def test_run_checks_before_any_launch(gpu, rng):
    log, _ = gpu
    w = BatchDecode(device=1)
    with pytest.raises(ValueError, match=r"run\(\) needs a plan: call plan\(kv_indptr, kv_indices, kv_last_page_len"):
        w.run(_cuda((2, 32, 128)), _cuda((10, 2, 16, 8, 128)))
    w._device_id = 1  # (planned for cuda:1; the fake call's arrays are on cuda:0)
    w.plan(*_page_table(rng, [40, 50]), **HEADS, page_size=16, q_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"plan\(\) was made for cuda:1; call plan\(\) with BatchDecode\(device=0\)"):
        w.run(_cuda((2, 32, 128)), _cuda((10, 2, 16, 8, 128)))
    p = BatchPrefill(paged=False)
    with pytest.raises(ValueError, match=r"call plan\(qo_indptr, kv_indptr, \.\.\.\) first"):
        p.run(_cuda((4, 32, 128)))
    assert log == []


def test_single_decode_launches_once(gpu):
    log, _ = gpu
    q, k = _cuda((32, 128)), _cuda((700, 8, 128))
    o, lse = single_decode(q, k, _cuda((700, 8, 128)), return_lse=True)
    assert o.shape == (32, 128) and lse.shape == (32,) and lse.dtype is DType.FLOAT32
    assert [e[0] for e in log] == ["upload", "launch"]
    params = log[1][3]
    assert params["q"] == q.ptr and params["q_stride_b"] == 0 and params["k"] == k.ptr and params["lse"] == lse.ptr


@pytest.mark.parametrize(
    "paged, backend", [(True, "fa2"), (False, "fa2"), (True, "sm90"), (False, "sm90")],
    ids=["paged", "ragged", "paged-sm90", "ragged-sm90"],
)  # fmt: skip
def test_prefill_split_plans_add_the_merge_launch(gpu, rng, paged, backend):
    log, _ = gpu
    qo_lens = rng.integers(1, 300, 5)
    qo = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    w = BatchPrefill(paged=paged, backend=backend)
    if paged:
        w.plan(qo, *_page_table(rng, qo_lens + 700), **HEADS, page_size=16, q_dtype="bfloat16", fixed_split_size=256)
        kv = (_cuda((4000, 2, 16, 8, 128)),)
    else:
        kvi = np.concatenate([[0], np.cumsum(qo_lens + 700)]).astype(np.int32)
        w.plan(qo, kvi, **HEADS, q_dtype="bfloat16", fixed_split_size=256)
        kv = (_cuda((int(kvi[-1]), 8, 128)), _cuda((int(kvi[-1]), 8, 128)))
    assert w._plan.work.n_merge > 0
    q = _cuda((int(qo[-1]), 32, 128))
    o, lse = w.run(q, *kv, return_lse=True)
    w.run(q, *kv)
    assert [e[0] for e in log] == ["upload", "launch", "launch", "launch", "launch"]
    names = [e[1] for e in log if e[0] == "launch"]
    kernel = "cuinfer::batch_prefill_sm90" if backend == "sm90" else "cuinfer::batch_prefill"
    assert names == [kernel, "cuinfer::merge_partials"] * 2 and w.plan_backend == backend
    assert log[2][3]["o"] == o.ptr and log[2][3]["lse"] == lse.ptr and log[4][3]["lse"] == 0
    with pytest.raises(TypeError, match="runs as"):
        w.run(q, *kv, kv[0])


def test_prefill_auto_on_hopper_runs_the_sm90_kernel_where_it_fits(gpu, rng):
    """backend="auto" on an sm_90 device: the Hopper kernel for long prefills, the FA2-class kernel for short appends
    or a fixed split off its 128-key tiles."""
    log, _ = gpu
    k = _cuda((4096, 8, 128))
    w = BatchPrefill(paged=False)
    for qo, fixed, expect in (([0, 1024, 2048], None, "sm90"), ([0, 16, 40], None, "fa2"),
                              ([0, 1024, 2048], 200, "fa2"), ([0, 1024, 2048], 256, "sm90")):  # fmt: skip
        log.clear()
        w.plan(np.array(qo), np.array([0, 2048, 4096]), **HEADS, q_dtype="bfloat16", causal=True,
               fixed_split_size=fixed)  # fmt: skip
        w.run(_cuda((qo[-1], 32, 128)), k, k)
        names = [e[1] for e in log if e[0] == "launch"]
        assert w.plan_backend == expect and names[0] == (
            "cuinfer::batch_prefill_sm90" if expect == "sm90" else "cuinfer::batch_prefill"
        ), (qo, fixed, names)


@pytest.mark.parametrize("page", [None, 16, 8], ids=["ragged", "paged16", "paged8"])
def test_prefill_sm90_fp8_launch(gpu, page):
    """fp8 K / V on the Hopper kernel ("auto" on the sm_90 device): its own specialisation with the staging ring's
    shared memory, K / V pointers as given, k_scale folded into sm_scale, v_scale passed; the staging copies are TMA
    boxes (byte maps of K / V, the slots' barriers) for ragged K / V and page sizes that are multiples of 16, cp.async
    otherwise."""
    from cuinfer.prefill import sm90

    log, _ = gpu
    qo = np.array([0, 1024, 2048])
    w = BatchPrefill(paged=page is not None)
    if page is not None:
        n = 2048 // page
        w.plan(qo, np.array([0, n // 2, n]), np.arange(n), np.array([page, page]), **HEADS, page_size=page,
               q_dtype="bfloat16", kv_dtype="float8_e4m3fn", causal=True)  # fmt: skip
        kv = (_cuda((n, 2, page, 8, 128), DType.FLOAT8_E4M3FN),)
    else:
        w.plan(qo, qo, **HEADS, q_dtype="bfloat16", kv_dtype="float8_e4m3fn", causal=True)
        kv = (_cuda((2048, 8, 128), DType.FLOAT8_E4M3FN), _cuda((2048, 8, 128), DType.FLOAT8_E4M3FN))
    w.run(_cuda((2048, 32, 128)), *kv, k_scale=0.5, v_scale=2.0)
    (launch,) = [e for e in log if e[0] == "launch"]
    assert launch[1] == "cuinfer::batch_prefill_sm90" and w.plan_backend == "sm90"
    p = launch[3]
    assert p["sm_scale"] == pytest.approx(0.5 / 128**0.5) and p["v_scale"] == 2.0
    assert p["k"] == kv[0].ptr and p["k_scales"] == 0
    state = w._launch_state
    tma = page != 8
    assert state.stage_tma == tma and not state.tma_kv
    # (TMA staging: the staging slots' full and empty barriers, 64 bytes more)
    assert state.smem_bytes == sm90.SMEM_BYTES + sm90.FP8_STAGING_BYTES + (64 if tma else 0)


@pytest.mark.parametrize("first", ["sm90", "fa2"])
def test_prefill_auto_graph_mode_keeps_the_first_plans_kernel(gpu, first):
    """CUDA-graph mode: the captured kernel is the first plan's, so "auto" decides once; the Hopper kernel's plans fit
    the fixed layout (items of one query head) and its launches read the plan buffer at the same pointers."""
    log, _ = gpu
    g = BatchPrefill(paged=False, use_cuda_graph=True, max_batch_size=4)
    long, short = (
        (np.array([0, 1024, 2048]), np.array([0, 2048, 4096])),
        (np.array([0, 16, 32]), np.array([0, 2048, 4096])),
    )
    k = _cuda((4096, 8, 128))
    params = []
    for qo, kvi in (long, short, long) if first == "sm90" else (short, long, short):
        log.clear()
        g.plan(qo, kvi, **HEADS, q_dtype="bfloat16", causal=True)
        assert g.plan_backend == first
        g.run(_cuda((int(qo[-1]), 32, 128)), k, k)
        launches = [e for e in log if e[0] == "launch"]
        assert launches[0][1] == ("cuinfer::batch_prefill_sm90" if first == "sm90" else "cuinfer::batch_prefill")
        params.append(launches[0][3])
    for name in ("work_indptr", "item_req", "item_kv_start", "qo_indptr"):
        assert len({p[name] for p in params}) == 1, f"{name} moved between graph-mode plans"


@pytest.mark.parametrize("kind", ["decode", "paged", "ragged"])
def test_variant_arrays_reach_the_kernel_and_are_checked_first(gpu, rng, kind):
    """run()'s variant arrays: checked before any launch (on the GPU: a CUDA array of q's device), their addresses
    in the kernel's VariantParams, repacked only when an address changes."""
    log, _ = gpu
    sinks = _cuda((32,), DType.FLOAT32)
    if kind == "decode":
        w = BatchDecode()
        w.plan(*_page_table(rng, [40, 700]), **HEADS, page_size=16, q_dtype="bfloat16", variant="sinks")
        q, kv = _cuda((2, 32, 128)), (_cuda((100, 2, 16, 8, 128)),)
    else:
        qo = np.array([0, 3, 40], np.int32)
        w = BatchPrefill(paged=kind == "paged")
        if kind == "paged":
            w.plan(qo, *_page_table(rng, [40, 700]), **HEADS, page_size=16, q_dtype="bfloat16", variant="sinks")
            kv = (_cuda((100, 2, 16, 8, 128)),)
        else:
            w.plan(qo, np.array([0, 40, 740], np.int32), **HEADS, q_dtype="bfloat16", variant="sinks")
            kv = (_cuda((740, 8, 128)), _cuda((740, 8, 128)))
        q = _cuda((40, 32, 128))
    with pytest.raises(
        ValueError, match=r"read arrays given at run\(\): pass variant_arrays=\{'sinks': float32 \[32\]"
    ):
        w.run(q, *kv)
    with pytest.raises(ValueError, match=r"variant_arrays\['sinks'\] must be a CUDA array but is a host array"):
        w.run(q, *kv, variant_arrays={"sinks": np.zeros(32, np.float32)})
    elsewhere = Tensor(sinks.ptr, (32,), (1,), DType.FLOAT32, "cuda", 1, "cupy", None)
    with pytest.raises(ValueError, match=r"must be on the device of q \(cuda:0\) but is on cuda:1"):
        w.run(q, *kv, variant_arrays={"sinks": elsewhere})
    with pytest.raises(ValueError, match=r"must have dtype float32 but has dtype bfloat16"):
        w.run(q, *kv, variant_arrays={"sinks": _cuda((32,))})
    assert log == []
    w.run(q, *kv, variant_arrays={"sinks": sinks})
    w.run(q, *kv, variant_arrays={"sinks": sinks})
    other = _cuda((32,), DType.FLOAT32)
    w.run(q, *kv, variant_arrays={"sinks.sinks": other})
    vparams = [e[4] for e in log if e[0] == "launch" and "merge" not in e[1]]
    assert [int(v["sinks"]["sinks"]) for v in vparams] == [sinks.ptr, sinks.ptr, other.ptr]


def test_single_decode_passes_variant_arrays(gpu):
    log, _ = gpu
    q, k, sinks = _cuda((32, 128)), _cuda((700, 8, 128)), _cuda((32,), DType.FLOAT32)
    single_decode(q, k, _cuda((700, 8, 128)), variant="sinks", variant_arrays={"sinks": sinks})
    assert [e[0] for e in log] == ["upload", "launch"] and int(log[1][4]["sinks"]["sinks"]) == sinks.ptr


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_graph_mode_plans_keep_the_first_plans_option_values(gpu, rng, kind):
    """CUDA-graph mode: a captured launch holds the kernel's parameters (sm_scale, the soft cap, variant parameters)
    by value, so a later plan with other values raises (naming them) instead of replaying the first plan's."""
    if kind == "decode":
        w = BatchDecode(use_cuda_graph=True, max_batch_size=16)

        def plan(**kw):
            w.plan(*_page_table(rng, [40, 50]), **HEADS, page_size=16, q_dtype="bfloat16", **kw)
    else:
        w = BatchPrefill(paged=False, use_cuda_graph=True, max_batch_size=4)

        def plan(**kw):
            w.plan(np.array([0, 16, 32]), np.array([0, 64, 128]), **HEADS, q_dtype="bfloat16", causal=True, **kw)

    plan(logits_soft_cap=30.0)
    plan(logits_soft_cap=30.0)  # (the same values: fine)
    with pytest.raises(ValueError, match=r"keep the option values of the first .*logits_soft_cap: 30.0 -> 40.0"):
        plan(logits_soft_cap=40.0)
    with pytest.raises(ValueError, match=r"sm_scale: 0.088388\d* -> 0.5"):
        plan(logits_soft_cap=30.0, sm_scale=0.5)
    v = BatchDecode(use_cuda_graph=True, max_batch_size=16) if kind == "decode" else None
    if v is not None:  # a variant's scalar parameters too
        v.plan(*_page_table(rng, [40]), **HEADS, page_size=16, q_dtype="bfloat16", variant="sigmoid",
               variant_params={"sigmoid": {"bias": 1.0}})  # fmt: skip
        with pytest.raises(
            ValueError, match=r"variant_params: \{'sigmoid': \{'bias': 1.0\}\} -> \{'sigmoid': \{'bias': 2.0\}\}"
        ):
            v.plan(*_page_table(rng, [40]), **HEADS, page_size=16, q_dtype="bfloat16", variant="sigmoid",
                   variant_params={"sigmoid": {"bias": 2.0}})  # fmt: skip
