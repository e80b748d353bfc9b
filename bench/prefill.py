"""Prefill suite P1-P6 (causal, query length = KV length): cuinfer BatchPrefill against FlashInfer fa2 / fa3 and
torch SDPA (flash, cuDNN) in the same run.

cuinfer rows: ``backend="auto"`` (the default, judged against the Hopper-class target), then forced ``fa2`` (judged
against the FA2-class target) and ``sm90`` (Hopper class). SDPA runs only on the ragged cases whose requests all
have the same length (P1, P2), as in docs/benchmarks.md: SDPA has no ragged batch, and padding P3 would count work it
wastes.
Metric: FLOPs = 4·Hq·D·(attended q-k pairs) (cases.prefill_flops), TFLOP/s and % of the bf16 matmul rate measured
in this run.
"""

from __future__ import annotations

from functools import partial

from bench import inputs, peers
from bench.cases import PREFILL_CASES, prefill_flops
from bench.suite import Context, Prepared, SuiteSpec, check_outputs, failing, warm_one

NAME = "prefill"
_CUINFER_BACKENDS = ("auto", "fa2", "sm90")


def _target(case_id: str, variant: str):
    case = next(c for c in PREFILL_CASES if c.id == case_id)
    return case.target_fa2 if variant == "fa2" else case.target_hopper


SPEC = SuiteSpec(
    name=NAME,
    title="Batch prefill, causal, Llama-3.1-8B attention (32/8 heads, d128, bf16; paged: page 16, NHD, scattered)",
    cuinfer_variants=_CUINFER_BACKENDS,
    peers=(
        ("flashinfer", "fa2", "FI fa2 TFLOP/s"),
        ("flashinfer", "fa3", "FI fa3 TFLOP/s"),
        ("torch-sdpa", "flash", "SDPA flash TFLOP/s"),
        ("torch-sdpa", "cudnn", "SDPA cuDNN TFLOP/s"),
    ),
    columns=("us", "tflops", "pct_matmul"),
    peer_metric="tflops",
    plot_metric="tflops",
    ceiling="matmul",
    target=_target,
    compare_to=lambda case_id: next((c.compare_to for c in PREFILL_CASES if c.id == case_id), ""),
)


# ------------------------------------------------------------------------------------------------ implementations


def prepare_cuinfer(inp: inputs.PrefillInputs, backend: str, options: dict | None = None) -> Prepared:
    """cuinfer's wrapper of the case, planned (``options``: more ``plan`` keywords, e.g. a variant's)."""
    cuinfer = peers.cuinfer()
    case, s = inp.case, inp.case.shape
    heads = dict(num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim)
    dtypes = dict(q_dtype=s.dtype, kv_dtype=case.kv_dtype, **(options or {}))
    if case.layout == "paged":
        kv = inp.kv
        w = cuinfer.BatchPrefill(paged=True, kv_layout=s.kv_layout, backend=backend)

        def plan():
            w.plan(inp.qo_indptr, kv.table.kv_indptr, kv.table.kv_indices, kv.table.kv_last_page_len,
                   **heads, page_size=s.page_size, causal=case.causal, **dtypes)  # fmt: skip

        plan()
        return Prepared(run=lambda: w.run(inp.q, kv.cache), plan=plan)
    w = cuinfer.BatchPrefill(paged=False, kv_layout=s.kv_layout, backend=backend)

    def plan():
        w.plan(inp.qo_indptr, inp.qo_indptr, **heads, causal=case.causal, **dtypes)

    plan()
    return Prepared(run=lambda: w.run(inp.q, inp.k, inp.v), plan=plan)


def prepare_fi(inp: inputs.PrefillInputs, backend: str) -> Prepared:
    fi = peers.flashinfer()
    case, s = inp.case, inp.case.shape
    dt = inputs.torch_dtype(s.dtype)
    ws = peers.flashinfer_workspace()
    if case.layout == "paged":
        kv = inp.kv
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, s.kv_layout, backend=backend)

        def plan():
            w.plan(inp.qo_indptr_d, kv.kv_indptr_d, kv.kv_indices_d, kv.kv_last_page_len_d,
                   s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size,
                   causal=case.causal, q_data_type=dt, kv_data_type=dt)  # fmt: skip

        plan()
        return Prepared(run=lambda: w.run(inp.q, kv.cache), plan=plan)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, s.kv_layout, backend=backend)

    def plan():
        w.plan(inp.qo_indptr_d, inp.qo_indptr_d, s.num_qo_heads, s.num_kv_heads, s.head_dim,
               causal=case.causal, q_data_type=dt)  # fmt: skip

    plan()
    return Prepared(run=lambda: w.run(inp.q, inp.k, inp.v), plan=plan)


def sdpa_applies(case) -> bool:
    return case.layout == "ragged" and case.lengths.dist == "const"


def sdpa_skip_reason(case) -> str:
    if case.layout != "ragged":
        return "paged KV: SDPA reads contiguous K/V only"
    return "requests of different lengths: SDPA has no ragged batch"


def prepare_sdpa(inp: inputs.PrefillInputs, backend: str) -> Prepared:
    """torch SDPA on [B, H, L, D] copies of the ragged inputs (as the anchor: GQA through ``enable_gqa`` for the
    flash backend, K/V heads repeated for cuDNN). The output is returned in the ragged layout for the check."""
    inputs.cuda_torch()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    case, s = inp.case, inp.case.shape
    b, length = len(inp.lens), int(inp.lens[0])
    if (inp.lens != length).any():
        raise ValueError(f"SDPA needs requests of one length, got lengths {sorted(set(inp.lens.tolist()))[:4]}...")
    q = inp.q.view(b, length, s.num_qo_heads, s.head_dim).transpose(1, 2).contiguous()
    k = inp.k.view(b, length, s.num_kv_heads, s.head_dim).transpose(1, 2).contiguous()
    v = inp.v.view(b, length, s.num_kv_heads, s.head_dim).transpose(1, 2).contiguous()
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    if backend != "flash":
        k = k.repeat_interleave(s.num_qo_heads // s.num_kv_heads, dim=1)
        v = v.repeat_interleave(s.num_qo_heads // s.num_kv_heads, dim=1)
    gqa = k.shape[1] != s.num_qo_heads

    def run():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    def ragged_output():
        return run().transpose(1, 2).reshape(b * length, s.num_qo_heads, s.head_dim)

    return Prepared(run=run, output=ragged_output)


# ------------------------------------------------------------------------------------------------ suite


def run(ctx: Context, cases) -> None:
    use_fi = peers.use_flashinfer(ctx)
    for case in cases:
        anchor = ", ".join(f"{k} {v}" for k, v in case.anchor.items())
        ctx.log(
            f"[prefill] {case.id}: {case.describe()}  (targets FA2-class {case.target_fa2.text}, Hopper-class "
            f"{case.target_hopper.text}; docs/benchmarks.md peers TFLOP/s: {anchor})"
        )
        run_case(ctx, case, use_fi)
        inputs.free()


def run_case(ctx: Context, case, use_fi: bool) -> None:
    try:
        inp = inputs.prefill_inputs(case)
    except Exception as ex:  # noqa: BLE001 - e.g. out of memory: every cuinfer row of the case says so
        for backend in _CUINFER_BACKENDS:
            ctx.measure(NAME, case.id, "cuinfer", backend, failing(ex))
        return
    flops = prefill_flops(inp.lens, inp.lens, case.shape, case.causal)
    ours = [
        ctx.measure(NAME, case.id, "cuinfer", b, partial(prepare_cuinfer, inp, b), flops=flops)
        for b in _CUINFER_BACKENDS
    ]
    reference = None
    if case.kv_dtype != case.shape.dtype:  # fp8 KV: judged against cuinfer's 16-bit-KV case of the shape (its ratio)
        for impl, variant, _ in SPEC.peers:
            ctx.skip(NAME, case.id, impl, variant, f"{case.kv_dtype} KV: compared with cuinfer's {case.compare_to}")
        check_outputs(ctx, ours, None)
        return
    if use_fi:
        for backend in _fi_backends():
            m, out = ctx.measure(NAME, case.id, "flashinfer", backend, partial(prepare_fi, inp, backend), flops=flops)
            if reference is None and out is not None:
                reference = (m, out)
    if ctx.peers:
        for backend in ("flash", "cudnn"):
            if not sdpa_applies(case):
                ctx.skip(NAME, case.id, "torch-sdpa", backend, sdpa_skip_reason(case))
                continue
            m, out = ctx.measure(NAME, case.id, "torch-sdpa", backend, partial(prepare_sdpa, inp, backend), flops=flops)
            if reference is None and out is not None:
                reference = (m, out)
    check_outputs(ctx, ours, reference)


def warm(ctx: Context, cases) -> None:
    """Compile FlashInfer's fa2 and fa3 prefill modules for every layout the selected cases use (~100 s for an sm90
    module) on a tiny batch, before anything is timed."""
    from dataclasses import replace

    from bench.cases import Lengths

    if not peers.use_flashinfer(ctx):
        return
    cases = [c for c in cases if c.kv_dtype == c.shape.dtype]  # (fp8-KV cases run no peer)
    for layout in sorted({c.layout for c in cases}):
        tiny = replace(next(c for c in cases if c.layout == layout), id="warm", lengths=Lengths("const", 2, 200))
        inp = inputs.prefill_inputs(tiny)
        for backend in _fi_backends():
            warm_one(ctx, f"flashinfer {backend} ({layout})", _run_once(inp, backend))
    inputs.free()


def _fi_backends() -> tuple[str, ...]:
    """FlashInfer prefill backends to run: both, or those in $CUINFER_BENCH_FI_PREFILL (e.g. "fa2": its sm90 module
    takes ~100 s to JIT-compile, more than a short GPU call can spare)."""
    import os

    chosen = os.environ.get("CUINFER_BENCH_FI_PREFILL", "fa2,fa3")
    return tuple(b for b in ("fa2", "fa3") if b in chosen.split(","))


def _run_once(inp, backend: str):
    return lambda: prepare_fi(inp, backend).run()
