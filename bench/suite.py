"""What every suite shares: one measurement record, the run context, and the measure-or-report-the-error step.

A suite prepares each implementation (construct, plan once: ``Prepared``) and hands it to ``Context.measure``,
which runs it once (the first call absorbs JIT compiles and is timed separately as ``first_call_s``), times it,
times its ``plan()`` on the host, and turns any exception into an error row so the suite goes on to the next case.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from bench.timing import Roofline, Timing, time_host


@dataclass
class Measurement:
    """One implementation on one case. ``status``: ok | error | not-implemented | skipped."""

    suite: str
    case: str
    impl: str  # "cuinfer", "flashinfer", "torch-sdpa"
    variant: str  # "default", "tensor-cores", "fa2", "BatchAttention", "cudnn", ...
    status: str = "ok"
    us: float | None = None  # median (GPU time; host time for the plan suite)
    us_min: float | None = None
    us_max: float | None = None
    n: int = 0
    bytes: int | None = None
    flops: int | None = None
    gbps: float | None = None
    pct_copy: float | None = None
    tflops: float | None = None
    pct_matmul: float | None = None
    plan_us: float | None = None
    run_host_us: float | None = None  # host time of one run() call (validation and launch, GPU work not awaited)
    first_call_s: float | None = None
    max_abs_diff: float | None = None  # against the reference peer's output, when both ran
    error: str = ""
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.impl}[{self.variant}]"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Prepared:
    """An implementation ready to run: ``run()`` enqueues one call; ``plan()`` (optional) re-plans on the host."""

    run: Callable[[], object]
    plan: Callable[[], object] | None = None
    note: str = ""
    output: Callable[[], object] | None = None  # the output in the suite's common layout, when run()'s differs


@dataclass(frozen=True)
class SuiteSpec:
    """How a suite's measurements are summarised, tabulated and plotted (report.py reads only this)."""

    name: str
    title: str
    cuinfer_variants: tuple[str, ...]  # the first is the default policy (the main row)
    peers: tuple[tuple[str, str, str], ...]  # (impl, variant, column header)
    columns: tuple[str, ...]  # Measurement fields shown for cuinfer rows
    peer_metric: str  # field shown in the peer columns ("us" or "tflops")
    plot_metric: str  # "gbps" | "tflops" | "us"
    ceiling: str | None  # "copy" | "matmul" | None: the horizontal line of the plot
    target: Callable[[str, str], object]  # (case id, cuinfer variant) -> Target | AllOf | None
    compare_to: Callable[[str], str] | None = None  # case id -> the case its "ratio" target divides by ("" for none)


SUITES = ("merge", "decode", "prefill", "plan")


def spec_of(name: str) -> SuiteSpec:
    """The SuiteSpec of a suite module (bench.merge, bench.decode, ...); imports no torch."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; the suites are {', '.join(SUITES)}")
    import importlib

    return importlib.import_module(f"bench.{name}").SPEC


def first_line(ex: BaseException) -> str:
    """``Type: first line of the message`` (an NVRTC log or a traceback-sized message stays out of the table)."""
    text = str(ex).strip()
    line = text.splitlines()[0] if text else ""
    out = f"{type(ex).__name__}: {line}" if line else type(ex).__name__
    return out if len(out) <= 300 else out[:297] + "..."


def _log(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class Context:
    """Run settings and state shared by the suites of one ``python -m bench`` call."""

    iters: int = 30
    warmup: int = 5
    plan_iters: int = 50
    quick: bool = False
    peers: bool = True
    timer: object = None  # CudaTimer, or anything with .time(fn, iters=, warmup=) and .sync()
    roofline: Roofline | None = None
    log: Callable[[str], None] = _log
    measurements: list[Measurement] = field(default_factory=list)
    checkpoint: Callable[[], object] | None = None  # called after every record (saves partial results)

    # ----------------------------------------------------------------------------------------------- records

    def record(self, m: Measurement) -> Measurement:
        self.measurements.append(m)
        self.log(progress_line(m))
        if self.checkpoint is not None:
            try:
                self.checkpoint()
            except Exception as ex:  # noqa: BLE001 - a full disk must not stop the measurements
                self.log(f"    (saving partial results failed: {first_line(ex)})")
        return m

    def _metrics(self, m: Measurement, t: Timing) -> None:
        m.us, m.us_min, m.us_max, m.n = t.us, t.min_s * 1e6, t.max_s * 1e6, t.n
        if m.bytes:
            m.gbps = m.bytes / t.median_s / 1e9
            if self.roofline:
                m.pct_copy = 100.0 * m.gbps / self.roofline.copy_gbps
        if m.flops:
            m.tflops = m.flops / t.median_s / 1e12
            if self.roofline:
                m.pct_matmul = 100.0 * m.tflops / self.roofline.matmul_tflops

    @staticmethod
    def _fail(m: Measurement, ex: BaseException) -> None:
        if isinstance(ex, NotImplementedError):
            m.status, m.error = "not-implemented", "not implemented yet: " + first_line(ex)
        else:
            m.status, m.error = "error", first_line(ex)

    # ----------------------------------------------------------------------------------------------- measuring

    def measure(
        self,
        suite: str,
        case: str,
        impl: str,
        variant: str,
        prepare: Callable[[], Prepared],
        *,
        bytes: int | None = None,
        flops: int | None = None,
    ) -> tuple[Measurement, object]:
        """Prepare, run once, time on the GPU, time plan() on the host. Returns the record and the first output
        (None when it failed), so the suite can compare outputs across implementations."""
        m = Measurement(suite, case, impl, variant, bytes=bytes, flops=flops)
        out = None
        try:
            t0 = time.perf_counter()
            prepared = prepare()
            out = prepared.run()
            self.timer.sync()
            m.first_call_s = time.perf_counter() - t0
            m.note = prepared.note
            if prepared.output is not None:
                out = prepared.output()
            self._metrics(m, self.timer.time(prepared.run, iters=self.iters, warmup=self.warmup))
            if prepared.plan is not None:
                m.plan_us = time_host(prepared.plan, iters=self.plan_iters, warmup=3).us
                self.timer.sync()
            m.run_host_us = time_host(prepared.run, iters=self.plan_iters, warmup=3).us
            self.timer.sync()
        except Exception as ex:  # noqa: BLE001 - a failing case is a row, not the end of the suite
            self._fail(m, ex)
            out = None
            _quiet_sync(self.timer)
        return self.record(m), out

    def measure_host(
        self, suite: str, case: str, impl: str, variant: str, prepare: Callable[[], Callable[[], object]]
    ) -> Measurement:
        """Host time of the callable ``prepare()`` returns (plan suite): first call, then the median of many."""
        m = Measurement(suite, case, impl, variant)
        try:
            t0 = time.perf_counter()
            fn = prepare()
            fn()
            m.first_call_s = time.perf_counter() - t0
            t = time_host(fn, iters=max(self.plan_iters, 20), warmup=3)
            m.us, m.us_min, m.us_max, m.n = t.us, t.min_s * 1e6, t.max_s * 1e6, t.n
            self.timer.sync()
        except Exception as ex:  # noqa: BLE001
            self._fail(m, ex)
            _quiet_sync(self.timer)
        return self.record(m)

    def skip(self, suite: str, case: str, impl: str, variant: str, why: str) -> Measurement:
        return self.record(Measurement(suite, case, impl, variant, status="skipped", note=why))


def warm_one(ctx: Context, what: str, fn: Callable[[], object]) -> None:
    """Run ``fn`` once (a peer's first call: its JIT compile) and log how long it took; failures only log, the
    timed row of the same implementation reports them."""
    t0 = time.perf_counter()
    try:
        fn()
        ctx.timer.sync()
        ctx.log(f"  warm {what}: {time.perf_counter() - t0:.1f} s")
    except Exception as ex:  # noqa: BLE001
        ctx.log(f"  warm {what}: failed after {time.perf_counter() - t0:.1f} s: {first_line(ex)}")
        _quiet_sync(ctx.timer)


def failing(ex: BaseException) -> Callable[[], Prepared]:
    """A prepare() that raises ``ex``: how a case whose inputs could not be built reports it on every row."""

    def prepare() -> Prepared:
        raise ex

    return prepare


def _quiet_sync(timer) -> None:
    """Drain the stream after a failure so the error does not surface in the next case; a sticky CUDA error
    (illegal address) will fail every later case anyway, and each says so in its row."""
    try:
        timer.sync()
    except Exception as ex:  # noqa: BLE001
        print(f"    (device error after failure: {first_line(ex)})", file=sys.stderr, flush=True)


def progress_line(m: Measurement) -> str:
    head = f"  {m.case:<8} {m.label:<28}"
    if m.status == "skipped":
        return f"{head} skipped: {m.note}"
    if not m.ok:
        return f"{head} {m.error}"
    parts = [f"{m.us:9.1f} µs"]
    if m.gbps is not None:
        parts.append(f"{m.gbps:7.0f} GB/s")
    if m.pct_copy is not None:
        parts.append(f"{m.pct_copy:5.1f} % copy")
    if m.tflops is not None:
        parts.append(f"{m.tflops:6.1f} TFLOP/s")
    if m.pct_matmul is not None:
        parts.append(f"{m.pct_matmul:5.1f} % mm")
    if m.plan_us is not None:
        parts.append(f"plan {m.plan_us:.1f} µs")
    if m.run_host_us is not None:
        parts.append(f"run() host {m.run_host_us:.1f} µs")
    if m.first_call_s is not None and m.first_call_s > 1.0:
        parts.append(f"first call {m.first_call_s:.1f} s")
    if m.max_abs_diff is not None:
        parts.append(f"max|Δ| {m.max_abs_diff:.2g}")
    if m.note:
        parts.append(m.note)
    return head + "  ".join(parts)


# Outputs are bf16 averages of unit-normal V rows (|o| < ~1): two correct kernels differ by a few bf16 ulps
# (~1e-2 at most); 0.05 flags a wrong result without flagging summation-order noise.
MISMATCH_TOL = 0.05


def check_outputs(ctx: Context, ours: list, reference) -> None:
    """Compare every cuinfer output with the first peer that ran (a fast wrong kernel must not pass unnoticed)."""
    for m, out in ours:
        if out is None:
            continue
        if nonfinite(out):
            m.note = (m.note + " output has NaN/inf").strip()
            ctx.log(f"  {m.case:<8} {m.label:<28} WARNING: output has NaN/inf")
        if reference is not None:
            m.max_abs_diff = compare_outputs(out, reference[1])
            if m.max_abs_diff is None:
                continue
            ctx.log(f"  {m.case:<8} {m.label:<28} max|Δ| vs {reference[0].label}: {m.max_abs_diff:.3g}")
            if m.max_abs_diff > MISMATCH_TOL:
                m.note = (m.note + f" output differs from {reference[0].label}").strip()


def compare_outputs(a, b) -> float | None:
    """max |a - b| of two torch outputs (first element of a tuple), None when the shapes differ."""
    a = a[0] if isinstance(a, tuple) else a
    b = b[0] if isinstance(b, tuple) else b
    if a is None or b is None or tuple(a.shape) != tuple(b.shape):
        return None
    return float((a.float() - b.float()).abs().max().item())


def nonfinite(x) -> bool:
    x = x[0] if isinstance(x, tuple) else x
    import torch

    return not bool(torch.isfinite(x.float()).all().item())
