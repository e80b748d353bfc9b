"""Plan suite: host time of ``plan()`` at decode batch 128 (target <= 50 µs) and prefill batch 64 (<= 80 µs).

plan() runs on the host once per generation step, so its wall time is paid every step: median of many single calls
(perf_counter), after a first call that is reported separately (it may JIT-compile, for the peers). cuinfer gets
NumPy index arrays (its documented no-sync path); FlashInfer gets device int32 tensors, as the anchor script gave it
(docs/benchmarks.md's 175-260 µs / 400-710 µs / 431.8 µs were measured that way).
"""

from __future__ import annotations

import dataclasses
from functools import partial

from bench import inputs, peers
from bench.cases import PLAN_CASES, PlanCase, indptr, page_table
from bench.suite import Context, SuiteSpec

NAME = "plan"


def _target(case_id: str, variant: str):
    return next(c.target for c in PLAN_CASES if c.id == case_id)


SPEC = SuiteSpec(
    name=NAME,
    title="plan() host time (median of single calls), Llama-3.1-8B shape, page 16",
    cuinfer_variants=("default", "new batch each call"),
    peers=(
        ("flashinfer", "decode cuda-cores", "FI decode µs"),
        ("flashinfer", "decode tensor-cores", "FI decode-tc µs"),
        ("flashinfer", "BatchAttention", "FI BatchAttention µs"),
        ("flashinfer", "prefill fa2", "FI prefill fa2 µs"),
        ("flashinfer", "prefill fa3", "FI prefill fa3 µs"),
    ),
    columns=("us",),
    peer_metric="us",
    plot_metric="us",
    ceiling=None,
    target=_target,
)


class _Tables:
    """Index arrays of one plan case: host (NumPy) and device (int32 tensors)."""

    def __init__(self, case: PlanCase) -> None:
        torch = inputs.cuda_torch()
        s = case.shape
        self.lens = case.lengths.draw(case.seed)
        self.table = page_table(self.lens, s.page_size, case.seed)
        self.qo_indptr = indptr(self.lens if case.kind == "prefill" else [1] * len(self.lens))

        def dev(x):
            return torch.from_numpy(x.astype("int32")).to("cuda")

        self.kv_indptr_d = dev(self.table.kv_indptr)
        self.kv_indices_d = dev(self.table.kv_indices)
        self.last_d = dev(self.table.kv_last_page_len)
        self.kv_lens_d = dev(self.lens)
        self.qo_indptr_d = dev(self.qo_indptr)


def cuinfer_plan(case: PlanCase, tables: list):
    """plan() on one wrapper of ``tables`` in turn, one per call (like a serving loop); one table: the same batch
    planned again every call (docs/benchmarks.md's row)."""
    cuinfer = peers.cuinfer()
    s = case.shape
    kw = dict(num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, page_size=s.page_size,
              q_dtype=s.dtype, kv_dtype=s.dtype)  # fmt: skip
    if case.kind == "decode":
        w = cuinfer.BatchDecode(kv_layout=s.kv_layout)
        calls = [partial(w.plan, t.table.kv_indptr, t.table.kv_indices, t.table.kv_last_page_len, **kw) for t in tables]
    else:
        w = cuinfer.BatchPrefill(paged=True, kv_layout=s.kv_layout)
        calls = [
            partial(w.plan, t.qo_indptr, t.table.kv_indptr, t.table.kv_indices, t.table.kv_last_page_len, causal=True,
                    **kw)
            for t in tables
        ]  # fmt: skip
    if len(calls) == 1:
        return calls[0]
    turn = [0]

    def step():
        calls[turn[0]]()
        turn[0] = (turn[0] + 1) % len(calls)

    return step


def fi_plans(case: PlanCase, t: _Tables) -> dict:
    """variant -> prepare() returning the plan callable, for the FlashInfer plans that apply to this case."""
    s = case.shape
    dt = inputs.torch_dtype(s.dtype)
    heads = (s.num_qo_heads, s.num_kv_heads, s.head_dim)

    def decode(tc):
        fi = peers.flashinfer()
        w = fi.BatchDecodeWithPagedKVCacheWrapper(peers.flashinfer_workspace(), s.kv_layout, use_tensor_cores=tc)
        return lambda: w.plan(t.kv_indptr_d, t.kv_indices_d, t.last_d, *heads, s.page_size,
                              q_data_type=dt, kv_data_type=dt)  # fmt: skip

    def batch_attention():
        fi = peers.flashinfer()
        w = fi.BatchAttention(kv_layout=s.kv_layout)
        return lambda: w.plan(t.qo_indptr_d, t.kv_indptr_d, t.kv_indices_d, t.kv_lens_d, *heads, s.head_dim,
                              s.page_size, causal=True, q_data_type=dt, kv_data_type=dt)  # fmt: skip

    def prefill(backend):
        fi = peers.flashinfer()
        w = fi.BatchPrefillWithPagedKVCacheWrapper(peers.flashinfer_workspace(), s.kv_layout, backend=backend)
        return lambda: w.plan(t.qo_indptr_d, t.kv_indptr_d, t.kv_indices_d, t.last_d, *heads, s.page_size,
                              causal=True, q_data_type=dt, kv_data_type=dt)  # fmt: skip

    if case.kind == "decode":
        return {
            "decode cuda-cores": lambda: decode(False),
            "decode tensor-cores": lambda: decode(True),
            "BatchAttention": batch_attention,
        }
    return {"prefill fa2": lambda: prefill("fa2"), "prefill fa3": lambda: prefill("fa3")}


def run(ctx: Context, cases) -> None:
    from bench.plan_host import calibrate

    use_fi = peers.use_flashinfer(ctx)
    # plan() is a few dozen NumPy calls: its time scales with this host's per-call cost (~1.1 us on a quiet core)
    ctx.log(f"[plan] host: one small NumPy call = {calibrate():.2f} us")
    for case in cases:
        ctx.log(f"[plan] {case.id}: {case.describe()}  (target {case.target.text})")
        tables = _Tables(case)
        ctx.measure_host(NAME, case.id, "cuinfer", "default", partial(cuinfer_plan, case, [tables]))
        if case.kind == "prefill":
            # The default row plans one batch over and over, which lets the planner keep the query-tile structure of
            # repeated query lengths; here every call plans another batch of the same distribution (no reuse).
            batches = [_Tables(dataclasses.replace(case, seed=case.seed + 1 + i)) for i in range(8)]
            ctx.measure_host(NAME, case.id, "cuinfer", "new batch each call", partial(cuinfer_plan, case, batches))
        if use_fi:
            for variant, prepare in fi_plans(case, tables).items():
                ctx.measure_host(NAME, case.id, "flashinfer", variant, prepare)
    inputs.free()


def warm(ctx: Context, cases) -> None:
    """Nothing to do: each plan's first call (a peer's JIT compile included) is made and reported before its
    timed calls by Context.measure_host."""
