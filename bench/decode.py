"""Decode suite D1-D10: cuinfer BatchDecode against FlashInfer's decode wrappers in the same run.

Rows per case: cuinfer with its default policy (the row judged against the docs/benchmarks.md target), then forced
``use_tensor_cores=True`` / ``False``; FlashInfer's BatchDecodeWithPagedKVCacheWrapper on CUDA cores and on tensor
cores, and its persistent BatchAttention on the skewed cases D8/D9, called exactly as the anchor script calls them.
Metric: bytes = K and V actually read + q + o (cases.decode_bytes), GB/s and % of the copy bandwidth measured in
this run; plan() host time beside each.
"""

from __future__ import annotations

from functools import partial

from bench import inputs, peers
from bench.cases import DECODE_CASES, decode_bytes
from bench.suite import Context, Prepared, SuiteSpec, check_outputs, failing, warm_one

NAME = "decode"
BATCH_ATTENTION_CASES = ("D8", "D9")
_CUINFER_TC = {"default": None, "tensor-cores": True, "cuda-cores": False}


def _target(case_id: str, variant: str):
    return next(c.target for c in DECODE_CASES if c.id == case_id)


SPEC = SuiteSpec(
    name=NAME,
    title="Batch decode, Llama-3.1-8B attention (32/8 heads, d128, bf16, page 16, NHD, pages scattered)",
    cuinfer_variants=tuple(_CUINFER_TC),
    peers=(
        ("flashinfer", "cuda-cores", "FI cuda-cores µs"),
        ("flashinfer", "tensor-cores", "FI tensor-cores µs"),
        ("flashinfer", "BatchAttention", "FI BatchAttention µs"),
    ),
    columns=("us", "gbps", "pct_copy", "plan_us"),
    peer_metric="us",
    plot_metric="gbps",
    ceiling="copy",
    target=_target,
    compare_to=lambda case_id: next((c.compare_to for c in DECODE_CASES if c.id == case_id), ""),
)


# ------------------------------------------------------------------------------------------------ implementations


def prepare_cuinfer(inp: inputs.DecodeInputs, use_tensor_cores: bool | None, pos_encoding: str = "none") -> Prepared:
    cuinfer = peers.cuinfer()
    s, kv = inp.case.shape, inp.kv
    w = cuinfer.BatchDecode(kv_layout=s.kv_layout, use_tensor_cores=use_tensor_cores)

    def plan():
        w.plan(
            kv.table.kv_indptr,
            kv.table.kv_indices,
            kv.table.kv_last_page_len,
            num_qo_heads=s.num_qo_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            page_size=s.page_size,
            q_dtype=s.dtype,
            kv_dtype=inp.case.kv_dtype,
            pos_encoding=pos_encoding,
        )

    plan()
    return Prepared(run=lambda: w.run(inp.q, kv.cache), plan=plan)


def prepare_fi_decode(inp: inputs.DecodeInputs, use_tensor_cores: bool) -> Prepared:
    fi = peers.flashinfer()
    s, kv = inp.case.shape, inp.kv
    q_dt, kv_dt = inputs.torch_dtype(s.dtype), inputs.torch_dtype(inp.case.kv_dtype)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(
        peers.flashinfer_workspace(), s.kv_layout, use_tensor_cores=use_tensor_cores
    )

    def plan():
        w.plan(
            kv.kv_indptr_d,
            kv.kv_indices_d,
            kv.kv_last_page_len_d,
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
            q_data_type=q_dt,
            kv_data_type=kv_dt,
        )

    plan()
    return Prepared(run=lambda: w.run(inp.q, kv.cache), plan=plan)


def prepare_fi_batch_attention(inp: inputs.DecodeInputs) -> Prepared:
    """FlashInfer's persistent kernel on a decode batch: every request is one query token (qo_indptr = arange)."""
    fi = peers.flashinfer()
    s, kv = inp.case.shape, inp.kv
    dt = inputs.torch_dtype(s.dtype)
    qo_indptr = kv.kv_indptr_d.new_tensor(list(range(inp.case.lengths.batch + 1)))  # int32, on the cache's device
    w = fi.BatchAttention(kv_layout=s.kv_layout)

    def plan():
        w.plan(
            qo_indptr,
            kv.kv_indptr_d,
            kv.kv_indices_d,
            kv.kv_lens_d,
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.head_dim,
            s.page_size,
            causal=True,
            q_data_type=dt,
            kv_data_type=dt,
        )

    plan()
    return Prepared(run=lambda: w.run(inp.q, kv.cache), plan=plan)


def peer_variants(case) -> list[tuple[str, object]]:
    """(variant, prepare(inp)) of the FlashInfer rows of one case."""
    out = [
        ("cuda-cores", partial(prepare_fi_decode, use_tensor_cores=False)),
        ("tensor-cores", partial(prepare_fi_decode, use_tensor_cores=True)),
    ]
    if case.id in BATCH_ATTENTION_CASES:
        out.append(("BatchAttention", prepare_fi_batch_attention))
    return out


# ------------------------------------------------------------------------------------------------ suite


def run(ctx: Context, cases) -> None:
    use_fi = peers.use_flashinfer(ctx)
    for case in cases:
        anchor = f"docs/benchmarks.md peer {case.anchor}"
        ctx.log(f"[decode] {case.id}: {case.describe()}  (target {case.target.text}; {anchor})")
        run_case(ctx, case, use_fi)
        inputs.free()  # this case's tensors died with run_case


def run_case(ctx: Context, case, use_fi: bool) -> None:
    try:
        inp = inputs.decode_inputs(case)
    except Exception as ex:  # noqa: BLE001 - e.g. out of memory: every cuinfer row of the case says so
        for variant in _CUINFER_TC:
            ctx.measure(NAME, case.id, "cuinfer", variant, failing(ex))
        return
    nbytes = decode_bytes(inp.kv.kv_lens, case.shape, case.kv_dtype)
    ours = [
        ctx.measure(NAME, case.id, "cuinfer", variant, partial(prepare_cuinfer, inp, tc), bytes=nbytes)
        for variant, tc in _CUINFER_TC.items()
    ]
    reference = None
    if use_fi:
        for variant, prep in peer_variants(case):
            m, out = ctx.measure(NAME, case.id, "flashinfer", variant, partial(prep, inp), bytes=nbytes)
            if reference is None and out is not None:
                reference = (m, out)
    check_outputs(ctx, ours, reference)


def warm(ctx: Context, cases) -> None:
    """Compile every FlashInfer kernel the selected cases use, on a tiny batch, before anything is timed."""
    from bench.cases import DecodeCase, Lengths

    if not peers.use_flashinfer(ctx):
        return
    jobs: dict[str, dict] = {}  # kv dtype -> {variant: prepare}
    for c in cases:
        jobs.setdefault(c.kv_dtype, {}).update(peer_variants(c))
    for kv_dtype, variants in jobs.items():
        tiny = DecodeCase("warm", Lengths("const", 4, 100), 0, cases[0].target, "", kv_dtype=kv_dtype)
        inp = inputs.decode_inputs(tiny)
        for variant, prep in variants.items():
            warm_one(ctx, f"flashinfer {variant} ({kv_dtype} KV)", _run_once(prep, inp))
    inputs.free()


def _run_once(prepare, inp):
    return lambda: prepare(inp).run()
