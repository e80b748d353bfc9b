"""Merge suite: ``merge_states`` of 8 attention states of [16384 rows, 32 heads, 128] bf16 (float32 base-2 LSE).

A pure streaming kernel: bytes = every state read (o and lse) + the merged state written (cases.merge_bytes); the
foundation target is >= 80 % of the device copy bandwidth measured in the same run. Peer: FlashInfer's
``merge_states`` (same argument layout: o [L, S, H, D], lse [L, S, H]).
"""

from __future__ import annotations

from functools import partial

from bench import inputs, peers
from bench.cases import MERGE_CASES, merge_bytes
from bench.suite import Context, Prepared, SuiteSpec, check_outputs, failing, warm_one

NAME = "merge"


def _target(case_id: str, variant: str):
    return next(c.target for c in MERGE_CASES if c.id == case_id)


SPEC = SuiteSpec(
    name=NAME,
    title="merge_states: 8 states of [16384, 32, 128] bf16 + float32 LSE",
    cuinfer_variants=("default",),
    peers=(("flashinfer", "merge_states", "FI merge_states µs"),),
    columns=("us", "gbps", "pct_copy"),
    peer_metric="us",
    plot_metric="gbps",
    ceiling="copy",
    target=_target,
)


def prepare_cuinfer(inp: inputs.MergeInputs) -> Prepared:
    cuinfer = peers.cuinfer()
    return Prepared(run=lambda: cuinfer.merge_states(inp.o, inp.lse))


def prepare_fi(inp: inputs.MergeInputs) -> Prepared:
    fi = peers.flashinfer()
    return Prepared(run=lambda: fi.merge_states(inp.o, inp.lse))


def run(ctx: Context, cases) -> None:
    use_fi = peers.use_flashinfer(ctx)
    for case in cases:
        ctx.log(f"[merge] {case.id}: {case.describe()}  (target {case.target.text})")
        run_case(ctx, case, use_fi)
        inputs.free()


def run_case(ctx: Context, case, use_fi: bool) -> None:
    try:
        inp = inputs.merge_inputs(case)
    except Exception as ex:  # noqa: BLE001
        ctx.measure(NAME, case.id, "cuinfer", "default", failing(ex))
        return
    nbytes = merge_bytes(case)
    ours = [ctx.measure(NAME, case.id, "cuinfer", "default", partial(prepare_cuinfer, inp), bytes=nbytes)]
    reference = None
    if use_fi:
        m, out = ctx.measure(NAME, case.id, "flashinfer", "merge_states", partial(prepare_fi, inp), bytes=nbytes)
        reference = (m, out) if out is not None else None
    check_outputs(ctx, ours, reference)


def warm(ctx: Context, cases) -> None:
    """Compile FlashInfer's merge kernel on a tiny input before anything is timed."""
    from dataclasses import replace

    if not peers.use_flashinfer(ctx) or not cases:
        return
    inp = inputs.merge_inputs(replace(cases[0], id="warm", rows=64))
    warm_one(ctx, "flashinfer merge_states", lambda: prepare_fi(inp).run())
    inputs.free()
