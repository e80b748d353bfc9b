"""bench suites end to end on the CPU with fake cuinfer / FlashInfer modules and a fake timer: rows per
implementation, error and not-implemented rows, peers columns, the output check, partial-result checkpoints."""

import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ runs from the checkout, not installed

from bench import decode, inputs, merge, peers, plan, prefill, report  # noqa: E402
from bench.cases import DECODE_CASES, MERGE_CASES, PLAN_CASES, PREFILL_CASES, Shape  # noqa: E402
from bench.suite import Context, spec_of  # noqa: E402
from bench.timing import Roofline, Timing  # noqa: E402

SMALL = Shape(num_qo_heads=4, num_kv_heads=2, head_dim=8, page_size=4)


class FakeTimer:
    def __init__(self, us=10.0):
        self.us, self.calls = us, 0

    def time(self, fn, *, iters, warmup):
        for _ in range(warmup + 1):
            fn()
        self.calls += 1
        return Timing(self.us * 1e-6, self.us * 0.9e-6, self.us * 1.2e-6, iters)

    def sync(self):
        pass


def _cpu_paged(kv_lens, shape, seed):
    t = inputs.page_table(kv_lens, shape.page_size, seed)
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(t.num_pages, 2, shape.page_size, shape.num_kv_heads, shape.head_dim, generator=g)
    i32 = lambda x: torch.from_numpy(np.asarray(x, dtype=np.int32))  # noqa: E731
    return inputs.PagedKV(cache, t, kv_lens, i32(t.kv_indptr), i32(t.kv_indices), i32(t.kv_last_page_len),
                          i32(kv_lens))  # fmt: skip


@pytest.fixture
def cpu_inputs(monkeypatch):
    """Small CPU tensors instead of device inputs (the shapes of the cases, scaled down)."""

    def decode_inputs(case):
        lens = case.lengths.draw(case.seed) % 37 + 1  # small, odd, >= 1
        q = torch.randn(case.lengths.batch, case.shape.num_qo_heads, case.shape.head_dim)
        return inputs.DecodeInputs(case, q, _cpu_paged(lens, case.shape, case.seed))

    def prefill_inputs(case):
        lens = case.lengths.draw(case.seed) % 29 + 1
        s = case.shape
        if case.lengths.dist == "const":
            lens = np.full_like(lens, 23)
        qo = inputs.indptr(lens)
        n = int(lens.sum())
        inp = inputs.PrefillInputs(case, lens, qo, torch.from_numpy(qo), torch.randn(n, s.num_qo_heads, s.head_dim))
        if case.layout == "ragged":
            inp.k, inp.v = torch.randn(n, s.num_kv_heads, s.head_dim), torch.randn(n, s.num_kv_heads, s.head_dim)
        else:
            inp.kv = _cpu_paged(lens, s, case.seed)
        return inp

    def merge_inputs(case):
        o = torch.randn(case.rows, case.num_states, case.num_heads, case.head_dim)
        return inputs.MergeInputs(case, o, torch.randn(case.rows, case.num_states, case.num_heads))

    monkeypatch.setattr(inputs, "decode_inputs", decode_inputs)
    monkeypatch.setattr(inputs, "prefill_inputs", prefill_inputs)
    monkeypatch.setattr(inputs, "merge_inputs", merge_inputs)
    monkeypatch.setattr(inputs, "free", lambda: None)
    monkeypatch.setattr(inputs, "cuda_torch", lambda: torch)


class _Wrapper:
    """A plan/run wrapper: run returns a deterministic function of q; ``fail`` makes run raise."""

    def __init__(self, *args, offset=0.0, fail=None, **kwargs):
        self.kwargs, self.offset, self.fail, self.plans = kwargs, offset, fail, 0

    def plan(self, *args, **kwargs):
        self.plans += 1

    def run(self, q, *rest, **kw):
        if self.fail:
            raise self.fail
        return q * 0.5 + self.offset


def _fake_cuinfer():
    def batch_decode(*, kv_layout, use_tensor_cores=None):
        if use_tensor_cores is False:
            raise NotImplementedError("use_tensor_cores=False: the CUDA-core decode kernel is not written yet")
        return _Wrapper()

    def batch_prefill(*, paged, kv_layout, backend="auto"):
        if backend == "sm90":
            raise ValueError("backend='sm90' needs an sm_90a device, this one is sm_80\nmore detail")
        return _Wrapper()

    return types.SimpleNamespace(
        BatchDecode=batch_decode,
        BatchPrefill=batch_prefill,
        merge_states=lambda o, lse: (o.mean(1), lse.mean(1)),
    )


def _fake_flashinfer():
    return types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=lambda ws, layout, use_tensor_cores: _Wrapper(offset=1e-3),
        BatchAttention=lambda kv_layout: _Wrapper(fail=RuntimeError("persistent kernel failed\nstack")),
        BatchPrefillWithPagedKVCacheWrapper=lambda ws, layout, backend: _Wrapper(offset=2e-3),
        BatchPrefillWithRaggedKVCacheWrapper=lambda ws, layout, backend: _Wrapper(offset=2e-3),
        merge_states=lambda o, lse: (o.mean(1) + 1.0, lse.mean(1)),  # a wrong peer: flagged by the check
    )


@pytest.fixture
def fakes(monkeypatch, cpu_inputs):
    fi = _fake_flashinfer()
    monkeypatch.setattr(peers, "cuinfer", _fake_cuinfer)
    monkeypatch.setattr(peers, "flashinfer", lambda: fi)
    monkeypatch.setattr(peers, "flashinfer_or_reason", lambda: (fi, "fake"))
    monkeypatch.setattr(peers, "flashinfer_workspace", lambda: None)


def _ctx(**kw):
    logged = []
    ctx = Context(iters=3, warmup=1, plan_iters=3, timer=FakeTimer(), roofline=Roofline(4000.0, 700.0, 0, 0),
                  log=logged.append, **kw)  # fmt: skip
    return ctx, logged


def _by_label(ctx):
    return {(m.case, m.label): m for m in ctx.measurements}


def test_decode_suite_rows(fakes):
    ctx, logged = _ctx()
    cases = [replace(c, shape=SMALL) for c in DECODE_CASES if c.id in ("D1", "D8")]
    decode.run(ctx, cases)
    got = _by_label(ctx)
    assert set(got) == {
        (cid, f"{impl}[{v}]")
        for cid in ("D1", "D8")
        for impl, v in [
            ("cuinfer", "default"),
            ("cuinfer", "tensor-cores"),
            ("cuinfer", "cuda-cores"),
            ("flashinfer", "cuda-cores"),
            ("flashinfer", "tensor-cores"),
        ]  # fmt: skip
    } | {("D8", "flashinfer[BatchAttention]")}
    ok = got[("D1", "cuinfer[default]")]
    assert ok.status == "ok" and ok.us == pytest.approx(10.0) and ok.plan_us is not None
    assert ok.gbps == pytest.approx(ok.bytes / 10e-6 / 1e9) and ok.pct_copy == pytest.approx(ok.gbps / 40.0)
    assert ok.max_abs_diff == pytest.approx(1e-3, rel=1e-3)  # compared with FlashInfer's CUDA-core output
    nimp = got[("D1", "cuinfer[cuda-cores]")]
    assert nimp.status == "not-implemented" and nimp.error.startswith("not implemented yet: NotImplementedError")
    ba = got[("D8", "flashinfer[BatchAttention]")]
    assert ba.status == "error" and ba.error == "RuntimeError: persistent kernel failed"
    assert any("max|Δ|" in line for line in logged)
    rows = report.summarize(spec_of("decode"), ["D1", "D8"], {}, ctx.measurements)
    d8 = next(r for r in rows if r["case"] == "D8" and r["variant"] == "default")
    assert d8["peers"]["FI BatchAttention µs"] == "err" and d8["vs_peer"] == pytest.approx(1.0)


def test_decode_without_peers(fakes):
    ctx, _ = _ctx(peers=False)
    decode.run(ctx, [replace(DECODE_CASES[0], shape=SMALL)])
    assert {m.impl for m in ctx.measurements} == {"cuinfer"}
    assert all(m.max_abs_diff is None for m in ctx.measurements)


def test_inputs_failure_is_a_row_per_variant(fakes, monkeypatch):
    def oom(case):
        raise MemoryError("CUDA out of memory. Tried to allocate 68.00 GiB")

    monkeypatch.setattr(inputs, "decode_inputs", oom)
    ctx, _ = _ctx()
    decode.run(ctx, [replace(DECODE_CASES[4], shape=SMALL)])
    assert [m.variant for m in ctx.measurements] == ["default", "tensor-cores", "cuda-cores"]
    assert all(m.status == "error" and m.error.startswith("MemoryError: CUDA out of memory") for m in ctx.measurements)


def test_prefill_suite_rows(fakes, monkeypatch):
    import contextlib

    import torch.nn.attention

    # the SDPA call of the GPU run, on CPU: no backend forcing (flash and cuDNN are CUDA-only), math kernel
    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", lambda backend: contextlib.nullcontext())
    ctx, _ = _ctx()
    cases = [replace(c, shape=SMALL) for c in PREFILL_CASES if c.id in ("P1", "P3", "P4")]
    prefill.run(ctx, cases)
    got = _by_label(ctx)
    assert got[("P1", "cuinfer[auto]")].tflops == pytest.approx(got[("P1", "cuinfer[auto]")].flops / 10e-6 / 1e12)
    assert got[("P1", "cuinfer[sm90]")].error == "ValueError: backend='sm90' needs an sm_90a device, this one is sm_80"
    assert got[("P3", "torch-sdpa[flash]")].status == "skipped"  # different lengths
    assert got[("P4", "torch-sdpa[cudnn]")].status == "skipped"  # paged
    assert got[("P1", "torch-sdpa[flash]")].status == "ok" and got[("P1", "torch-sdpa[cudnn]")].status == "ok"
    assert got[("P1", "flashinfer[fa3]")].status == "ok"
    assert got[("P4", "cuinfer[fa2]")].max_abs_diff == pytest.approx(2e-3, rel=1e-2)


def test_merge_suite_flags_a_mismatch(fakes):
    ctx, logged = _ctx()
    merge.run(ctx, [replace(MERGE_CASES[0], rows=37, num_heads=3, head_dim=8)])
    ours = _by_label(ctx)[("M1", "cuinfer[default]")]
    assert ours.max_abs_diff == pytest.approx(1.0, rel=1e-5)
    assert "output differs from flashinfer[merge_states]" in ours.note


def test_plan_suite_host_times(fakes, monkeypatch):
    class Tables:
        def __init__(self, case):
            s = case.shape
            self.lens = case.lengths.draw(case.seed)
            self.table = inputs.page_table(self.lens, s.page_size, case.seed)
            self.qo_indptr = inputs.indptr(self.lens)
            self.kv_indptr_d = self.kv_indices_d = self.last_d = self.kv_lens_d = self.qo_indptr_d = None

    monkeypatch.setattr(plan, "_Tables", Tables)
    ctx, _ = _ctx()
    plan.run(ctx, [c for c in PLAN_CASES if c.id in ("plan-D9", "plan-P64")])
    got = _by_label(ctx)
    assert got[("plan-D9", "cuinfer[default]")].status == "ok", got[("plan-D9", "cuinfer[default]")].error
    assert got[("plan-D9", "cuinfer[default]")].us > 0 and got[("plan-D9", "cuinfer[default]")].n >= 20
    assert ("plan-D9", "flashinfer[BatchAttention]") in got and ("plan-P64", "flashinfer[prefill fa3]") in got
    assert ("plan-D9", "flashinfer[prefill fa2]") not in got


def test_checkpoint_after_every_record(fakes):
    ctx, _ = _ctx()
    seen = []
    ctx.checkpoint = lambda: seen.append(len(ctx.measurements))
    decode.run(ctx, [replace(DECODE_CASES[0], shape=SMALL)])
    assert seen == list(range(1, len(ctx.measurements) + 1))

    def full_disk():
        raise OSError("No space left on device")

    ctx2, logged = _ctx()
    ctx2.checkpoint = full_disk
    decode.run(ctx2, [replace(DECODE_CASES[0], shape=SMALL)])  # keeps measuring
    assert len(ctx2.measurements) == 5 and any("saving partial results failed" in line for line in logged)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The CLI's device-facing calls faked: timer, roofline, environment."""
    import bench.timing as timing

    env = {"gpu": "fake", "sms": 1, "torch": "t", "cuda": "c", "cuinfer": "x", "flashinfer": "y"}
    monkeypatch.setattr(timing, "CudaTimer", FakeTimer)
    monkeypatch.setattr(timing, "measure_roofline", lambda timer, quick: Roofline(4000.0, 700.0, 1 << 30, 4096))
    monkeypatch.setattr(peers, "environment", lambda with_peers: env)


def test_cli_run_end_to_end(fakes, fake_gpu, tmp_path, capsys):
    """`python -m bench decode --cases D1,D8 --quick` with the GPU faked: progress, tables, JSON, PNG."""
    import json

    import bench.__main__ as cli

    rc = cli.main(["decode", "--cases", "D1,D8", "--quick", "--out", str(tmp_path), "--no-plot"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "roofline: copy 4000 GB/s" in out and "[decode] D8" in out and "vs best peer" in out
    assert (
        "cuinfer rows: 2 pass, 2 miss, 2 error" in out
    )  # D1 ≤ 26.3 µs passes at 10 µs, D8 misses 3.9 TB/s and "(--quick: smoke run, not a result)" in out
    latest = json.loads((tmp_path / "decode-latest.json").read_text())
    assert latest["complete"] is True and latest["quick"] is True and latest["args"]["iters"] == 5
    assert latest["roofline"]["copy_gbps"] == 4000.0
    assert len(list(tmp_path.glob("decode-*.json"))) == 2
    assert {m["case"] for m in latest["measurements"]} == {"D1", "D8"}


def test_cli_harness_error_keeps_partial_results(fakes, fake_gpu, monkeypatch, tmp_path, capsys):
    import json

    import bench.__main__ as cli

    monkeypatch.setattr(decode, "check_outputs", lambda *a: 1 / 0)  # a bug in the harness after the first case
    rc = cli.main(["decode", "--cases", "D1,D2", "--quick", "--out", str(tmp_path), "--no-plot"])
    assert rc == 1
    assert "ZeroDivisionError" in capsys.readouterr().err
    latest = json.loads((tmp_path / "decode-latest.json").read_text())
    assert latest["complete"] is False and {m["case"] for m in latest["measurements"]} == {"D1"}
