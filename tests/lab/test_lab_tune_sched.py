"""``python -m bench.lab.tune_sched`` without a GPU: its command line, its kernel specs (the trace builds compile with
NVRTC), its decode configurations and work plans, through the lab wrappers (nothing of cuinfer patched)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from bench.lab import tune_sched as ts
from bench.lab.harness import LabDecode, LabPrefill, TraceBuffer
from cuinfer import reference
from cuinfer.decode.policy import REFERENCE_SMEM_PER_SM, ctas_per_sm, decode_config
from cuinfer.decode.specs import DecodeKernelKey, decode_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu"))  # the plan emulation of test_decode_plan
from test_decode_plan import _emulate  # noqa: E402

LLAMA_TC = DecodeKernelKey(decode_config(4, 128, use_tensor_cores=True), "bfloat16", "bfloat16", "bfloat16")


def test_command_line():
    a = ts.parse_args([])
    assert a.experiments == ["prefill", "decode"] and a.dtrace == "base,nosplit,s2,s4" and a.defines == ()
    a = ts.parse_args(["dab", "dtrace", "--defines=-DCUINFER_X -DCUINFER_Y=2", "--dtrace", "base,ab", "--cases", "D1"])
    assert a.defines == ("-DCUINFER_X", "-DCUINFER_Y=2") and a.cases == "D1"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dab"], "need --defines"),
        (["dtrace", "--dtrace", "base,no-pf"], "unknown variant 'no-pf'"),
        (["prefill", "--assign", "default,snake"], "unknown assignment 'snake'"),
        (["tracee"], "unknown experiment(s) tracee"),
    ],
)
def test_command_line_errors(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("CUINFER_DAB_DEFINES", raising=False)
    with pytest.raises(SystemExit):
        ts.parse_args(argv)
    assert message in capsys.readouterr().err


def test_trace_specs_add_their_define_under_a_name_of_their_own():
    from cuinfer.prefill.specs import default_specs

    shipped = decode_spec(LLAMA_TC)
    traced = ts.decode_trace_spec(LLAMA_TC, ("-DCUINFER_X",))
    assert traced.extra_options == ("-DCUINFER_DECODE_TRACE", "-DCUINFER_X") and shipped.extra_options == ()
    assert traced.name == "lab-dtrace/" + shipped.name and traced.name_exprs == shipped.name_exprs
    ab = ts.decode_ab_spec_of(("-DCUINFER_X",))(LLAMA_TC)
    assert ab.extra_options == ("-DCUINFER_X",) and ab.name.startswith("lab-ab/")
    prefill = default_specs()[0]
    assert "-DCUINFER_TRACE" not in prefill.extra_options


@pytest.mark.compile
def test_trace_builds_compile():
    """The stamps of kernel_src/debug/trace.cuh compile into the decode and prefill kernels (p.lse as the buffer)."""
    from cuinfer.jit import get_compiled
    from cuinfer.prefill.specs import PrefillKernelKey
    from cuinfer.prefill.tiles import tile_config
    from cuinfer.variants import lookup, render

    prefill = PrefillKernelKey("bfloat16", "bfloat16", 128, 128, tile_config(128, 64, 128), False,
                               render((lookup("causal"),)))  # fmt: skip
    for spec in (ts.decode_trace_spec(LLAMA_TC), ts.prefill_trace_spec(prefill)):
        mod = get_compiled(spec, "sm_90a")
        assert mod.cubin and set(mod.lowered) == set(spec.name_exprs), spec.name


def test_dtrace_variants():
    base = ts.dtrace_variant("base")
    assert base["use_tensor_cores"] is True and "-DCUINFER_DECODE_TRACE" in base["spec_of"](LLAMA_TC).extra_options
    assert ts.dtrace_variant("nosplit")["fixed_split_size"] == 1 << 20
    assert ts.dtrace_variant("s2")["config"].stages == 2 and ts.dtrace_variant("s4")["config"].stages == 4
    assert ts.dtrace_variant("ab", ("-DCUINFER_X",))["spec_of"](LLAMA_TC).extra_options[-1] == "-DCUINFER_X"
    with pytest.raises(ValueError, match="needs --defines"):
        ts.dtrace_variant("ab")
    with pytest.raises(ValueError, match="one of"):
        ts.dtrace_variant("fence")


@pytest.mark.parametrize(
    ("spec", "threads", "tile", "per_sm"),
    [("2,2,3", 128, 32, 3), ("4,1,2,2", 128, 64, 2), ("fp8:4,1,3", 128, 128, 2), ("fp8:2,1,3", 64, 64, 3)],
)
def test_decode_variant_sizes(spec, threads, tile, per_sm):
    """``dcfg`` configurations: tile and threads from the warps, the cap bounds the CTAs per SM."""
    c = ts.decode_variant(spec)
    assert (c.threads, c.tile_kv) == (threads, tile)
    assert c.kv_itemsize == (1 if spec.startswith("fp8:") else 2)
    assert min(ctas_per_sm(c, smem_per_sm=REFERENCE_SMEM_PER_SM), c.min_blocks) == per_sm
    assert ts.decode_variant("default") is None
    with pytest.raises(ValueError, match="item chunk"):
        ts.decode_variant("2,2,3,0,32")


def _decode(lens, **lab):
    hq, hkv, d, ps = 32, 8, 64, 16
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    w = LabDecode(**lab)
    w.plan(indptr, np.arange(indptr[-1], dtype=np.int32), (lens - (pages - 1) * ps).astype(np.int32),
           num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="float16", num_sms=7)  # fmt: skip
    return w


@pytest.mark.parametrize(("work", "mode"), [(ts.cta_cut_work, "cta-cut-experiment"), (ts.lane_cut_work, "lanes")])
def test_lab_plans_reproduce_the_reference(work, mode, rng):
    """The ``ctacut`` and ``lanecut`` plans, through the NumPy emulation of the kernels' plan contract."""
    lens = np.array([1, 17, 513, 4097, 300, 1000, 999])
    w = _decode(lens, work=work)
    w._pack_host()  # (packs like any plan)
    assert w._plan.work.assign_mode.startswith(mode) and w._plan.work.n_merge > 0
    hq, hkv, d = 32, 8, 64
    q = rng.standard_normal((lens.shape[0], hq, d))
    k = rng.standard_normal((int(lens.sum()), hkv, d))
    v = rng.standard_normal((int(lens.sum()), hkv, d))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    o, lse = _emulate(w, q, k, v, starts)
    for b in range(lens.shape[0]):
        sl = slice(starts[b], starts[b] + lens[b])
        ro, rl = reference.attention(q[b : b + 1], k[sl], v[sl])
        np.testing.assert_allclose(o[b], ro[0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(lse[b], rl[0], rtol=1e-9, atol=1e-9)


def test_fp8_cost_variants_plan_with_their_fields():
    """``fp8prev`` (FP8_COST before 2026-12-04) plans D10's equal requests whole, the current FP8_COST and its
    ``fp8piece`` / ``fp8gamma`` variants cut them; the WorkFns plan the wrapper's configuration and grid."""
    from types import SimpleNamespace

    from cuinfer.decode.policy import decode_config

    plan = SimpleNamespace(num_qo_heads=32, num_kv_heads=8, config=decode_config(4, 128, kv_itemsize=1),
                           kv_lens=np.full(128, 2048, np.int32), batch=128)  # fmt: skip
    modes = {
        k: ts.WORK_VARIANTS[k](plan, 264, lambda: None).assign_mode for k in ("fp8prev", "fp8piece128", "fp8gamma192")
    }
    assert modes == {"fp8prev": "linear", "fp8piece128": "lanes", "fp8gamma192": "lanes"}


def test_cta_cut_plan_balances_tiles():
    """D2's lengths: every CTA gets 5 or 6 KV tiles (the lane plan gives some 8)."""
    from bench.cases import DECODE_CASES

    case = next(c for c in DECODE_CASES if c.id == "D2")
    w = ts.cta_cut_plan(case.lengths.draw(case.seed), 8, 4, 264, 64)
    s, e = np.asarray(w.group_kv_start), np.asarray(w.group_kv_end)
    tiles = np.concatenate([[0], np.cumsum(-(-(e - s) // 64))])
    per_cta = tiles[w.work_indptr[1:]] - tiles[w.work_indptr[:-1]]
    assert per_cta.min() >= 5 and per_cta.max() <= 6


def test_a_lab_configuration_plans_its_own_grid():
    """A capped configuration (2 CTAs per SM of 32-token tiles) sizes the grid and the planner's tile."""
    cfg = ts.decode_variant("2,2,3,2")
    w = _decode(np.array([300, 2000, 64, 5000]), config=cfg)
    assert w._plan.config is cfg and w._plan.work.num_ctas == 2 * 7
    assert _decode(np.array([300, 2000, 64, 5000]))._plan.config.tile_kv == 64


def _prefill(sms: int = 5, **lab):
    lens = np.array([700, 1500, 90, 2048, 333])
    qo = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    w = LabPrefill(paged=False, backend="fa2", **lab)
    w.plan(qo, qo, num_qo_heads=32, num_kv_heads=8, head_dim=128, causal=True, q_dtype="bfloat16", num_sms=sms)
    return w


def _items(work) -> list:
    names = ("item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial")
    return sorted(zip(*(getattr(work, n).tolist() for n in names), strict=True))


@pytest.mark.parametrize("kind", ["list", "lpt", "lptfit"])
def test_assignments_deal_the_planners_items_again(kind):
    default = _prefill()._plan.work
    w = _prefill(work=ts.assignment_work(kind))
    w._pack_host()  # (packs like any plan)
    work = w._plan.work
    assert work.assign_mode == kind and work.n_pool == 0 and work.num_ctas == default.num_ctas
    assert _items(work) == _items(default) and work.work_indptr[-1] == work.n_items
    assert ts.assignment_work("default") is None


def test_pool_shares_are_an_argument():
    """``pool``: the share of the shared tail is plan_work's argument (a sorted deal, here on 264 CTAs)."""
    assert _prefill(132, work=ts.pool_work(0.0))._plan.work.n_pool == 0
    assert _prefill(132, work=ts.pool_work(0.3))._plan.work.n_pool > 0


def test_trace_buffers():
    from bench.lab.harness import prefill_trace

    t = prefill_trace(1 << 20, 64, 32)
    assert t == TraceBuffer((1 << 20) + 256, (-32, -1))
    with pytest.raises(ValueError, match="even"):
        prefill_trace(0, 3, 1)
