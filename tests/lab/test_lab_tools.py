"""The lab tools of bench/lab without a GPU: each imports without torch, parses its command line and builds its kernel
specs, parameters or plans (tune_sched has its own file)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = (
    "tune_sched",
    "tune_prefill",
    "tune_decode",
    "tune_merge",
    "stream_floor",
    "ncu_case",
    "profile_decode",
    "sm90_probe",
)


def test_every_tool_answers_help_without_torch():
    code = (
        "import sys, importlib\n"
        f"for t in {TOOLS!r}:\n"
        "    m = importlib.import_module('bench.lab.' + t)\n"
        "    try:\n        m.parse_args(['--help'])\n    except SystemExit as e:\n        assert e.code == 0, t\n"
        "assert 'torch' not in sys.modules and 'flashinfer' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "python -m bench.lab.tune_prefill" in r.stdout and "python -m bench.lab.stream_floor" in r.stdout


@pytest.mark.parametrize("tool", TOOLS)
def test_no_tool_promises_a_removed_switch(tool):
    """The kernels' A/B switches are gone (docs/results/lab-findings.md): no tool names one."""
    gone = ("ADDR_SELECT", "EAGER_RESCALE", "NO_MAX_FREE", "NO_CROSS_ITEM", "NO_SLICE_SKIP", "SHUFFLE_EPI",
            "NO_Q_AHEAD", "NO_PLAN_PREFETCH", "MERGE_FENCE", "NOMATH", "EPI_ALL_ROWS")  # fmt: skip
    text = (REPO / "bench" / "lab" / f"{tool}.py").read_text()
    assert not [g for g in gone if g in text]
    assert "ITEM_CHUNK=" not in text


# ---- tune_prefill ----------------------------------------------------------------------------------------------------


def test_tune_prefill_configurations():
    from bench.lab import tune_prefill as tp

    assert tp.configs("") == list(tp.CONFIGS)
    assert tp.configs("new:128,64,2;ab:128,32,3,1;win4:128,64,2") == [
        ("new", (128, 64, 2)), ("ab", (128, 32, 3, 1)), ("win4", (128, 64, 2)),
    ]  # fmt: skip
    for bad in ("base:128,64,2", "noxi:128,64,2", "new:128,64"):
        with pytest.raises(ValueError):
            tp.configs(bad)
    a = tp.parse_args(["--configs", "new:128,64,2;ab:128,64,2", "--defines=-DCUINFER_X", "--cases", "p1,P3"])
    assert a.defines == ("-DCUINFER_X",) and a.cases == ["P1", "P3"] and a.configs[1] == ("ab", (128, 64, 2))


def test_tune_prefill_ab_needs_defines(capsys, monkeypatch):
    from bench.lab import tune_prefill as tp

    monkeypatch.delenv("CUINFER_TUNE_DEFINES", raising=False)
    with pytest.raises(SystemExit):
        tp.parse_args(["--configs", "ab:128,64,2"])
    assert "needs --defines" in capsys.readouterr().err


def test_tune_prefill_keys_and_specs():
    """The keys of P1-P6 at forced tiles (the policy's CTAs per block unless the tiles say), the A/B spec."""
    from bench.lab import tune_prefill as tp
    from cuinfer.prefill.specs import prefill_spec

    ragged, paged = tp.keys((128, 64, 2))
    assert (ragged.paged, ragged.cfg.groups, paged.paged, paged.cfg.groups) == (False, 2, True, 1)
    assert [k.cfg.groups for k in tp.keys((128, 64, 2, 1))] == [1, 1]
    assert ragged.variant.name == "causal" and ragged.cfg.tile_kv == 64
    assert tp.spec_for(ragged, "new") is prefill_spec(ragged) and tp.spec_for(ragged, "win2") is prefill_spec(ragged)
    ab = tp.spec_for(ragged, "ab", ("-DCUINFER_X=1",))
    assert ab.extra_options == ("-DCUINFER_X=1",) and ab.name == "lab-ab/" + prefill_spec(ragged).name
    with pytest.raises(ValueError, match="needs --defines"):
        tp.spec_for(ragged, "ab")


@pytest.mark.compile
def test_tune_prefill_builds_an_ab_configuration(monkeypatch):
    """``precompile``'s job on an A/B build: both kernels of the configuration compile (a define they ignore)."""
    from bench.lab import tune_prefill as tp

    built, line = tp._compile(("ab", (128, 64, 2), ("-DCUINFER_LAB_UNUSED",)))
    assert built, line
    assert "ragged" in line and "paged" in line and "spills 0/0" in line


def test_tune_prefill_windows_deal_the_planners_items():
    from bench.lab import tune_prefill as tp
    from bench.lab.harness import LabPrefill

    lens = np.array([700, 1500, 90, 2048, 333])
    qo = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    plans = []
    for work in (None, tp.window_work(2)):
        w = LabPrefill(paged=False, backend="fa2", work=work)
        w.plan(qo, qo, num_qo_heads=32, num_kv_heads=8, head_dim=128, causal=True, q_dtype="bfloat16", num_sms=5)
        w._pack_host()
        plans.append(w._plan.work)
    names = ("item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end")
    a, b = ({tuple(x) for x in zip(*(getattr(p, n).tolist() for n in names), strict=True)} for p in plans)
    assert a == b and plans[1].assign_mode == "win2" and plans[1].n_items == plans[0].n_items


# ---- tune_decode, tune_merge, ncu_case, profile_decode, stream_floor -------------------------------------------------


def test_tune_decode_splits_and_stats():
    from bench.lab import tune_decode as td
    from cuinfer.decode import BatchDecode

    a = td.parse_args(["D1", "D5", "--splits", "auto,none,512"])
    assert a.cases == ["D1", "D5"] and a.splits == [None, 1 << 20, 512]
    with pytest.raises(SystemExit):
        td.parse_args(["D42"])
    lens = np.array([100, 3000, 17])
    pages = (lens + 15) // 16
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    w = BatchDecode(use_tensor_cores=True)
    w.plan(indptr, np.arange(indptr[-1], dtype=np.int32), (lens - (pages - 1) * 16).astype(np.int32),
           num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16, q_dtype="bfloat16", num_sms=4,
           fixed_split_size=512)  # fmt: skip
    stats = td.plan_stats(w._plan.work)
    assert stats.startswith("ctas 8 items ") and "chunk 512" in stats and "balance " in stats


def test_tune_merge_specs_and_params():
    from bench.lab import tune_merge as tm
    from cuinfer.merge.specs import merge_spec

    assert tm.parse_args(["--variants", "4x4,8x2"]).variants == ((4, 4), (8, 2))
    with pytest.raises(SystemExit):
        tm.parse_args(["--variants", "4,4"])
    spec, expr = tm.variant_spec(8, 2)
    assert spec.name_exprs == (expr,) and expr.endswith(", 8, 2>") and spec.source == merge_spec("float16", 128).source
    p = tm.states_params(1, 2, 3, 4, rows=10, states=8, heads=32, d=128)
    assert (p["o_in_s0"], p["o_in_s1"], p["lse_in_s0"], p["num_states"]) == (8 * 32 * 128, 32 * 128, 8 * 32, 8)


def test_ncu_case_forces_groups_through_tile_sizes():
    from bench.lab import ncu_case as nc
    from cuinfer.prefill.tiles import tile_config

    assert nc.forced_groups(tile_config(128, 64, 128, 2, 2), 1) == (128, 64, 2, 1)
    with pytest.raises(ValueError):
        nc.forced_groups(tile_config(128, 64, 128), 3)
    a = nc.parse_args(["P2", "fi", "--groups", "2"])
    assert (a.case, a.peer, a.groups, a.runs) == ("P2", "fi", 2, 5)
    assert nc.parse_args([]).case == "D7"


def test_profile_decode_and_stream_floor_command_lines():
    from bench.lab import profile_decode, stream_floor

    assert profile_decode.parse_args(["D1", "P2"]).cases == ["D1", "P2"]
    with pytest.raises(SystemExit):
        profile_decode.parse_args(["X9"])
    a = stream_floor.parse_args(["--cases", "d1,D4"])
    assert a.command is None and a.cases == ["D1", "D4"]
    p = stream_floor.parse_args(["plot", "out.png", "decode.json", "a.txt", "b.txt"])
    assert (p.command, p.png, p.floors) == ("plot", "out.png", ["a.txt", "b.txt"])
    assert stream_floor.kernel_options("first", 4, "block")[:3] == ("-DUNROLL=4", "-DPOLICY_FIRST=1", "-DORDER_BLOCK=1")
    with pytest.raises(ValueError):
        stream_floor.kernel_options("last", 1, "grid")


def test_tools_import_their_runtime_names():
    """Every lab module imports against the current runtime (names moved in the restructuring fail here)."""
    for name in (*TOOLS, "harness", "sass_snapshot", "sass_ctrl", "ab_compare", "dump_outputs", "mufu_probe"):
        importlib.import_module(f"bench.lab.{name}")


@pytest.mark.compile
def test_mufu_probe_sass_packed_forms_are_two_mufu_ops_each():
    """mufu_probe --sass: the f32 forms are one MUFU op each, and a packed f16x2 / bf16x2 tanh or ex2 becomes two
    16-bit MUFU ops (one per half) on sm_90a, so packing halves no MUFU work (the soft cap's second MUFU op stays)."""
    from bench.lab.mufu_probe import sass
    from cuinfer.jit.sass import find_cuobjdump

    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not installed (the test extra brings it)")
    rows = sass("sm_90a")
    assert rows["tanh"] == {"MUFU.TANH": 64} and rows["ex2"] == {"MUFU.EX2": 64}
    for op in ("tanh", "ex2"):
        for t in ("f16", "bf16"):
            ops = rows[f"{op}.{t}x2"]
            packs = ops[f"F2FP.{t.upper()}.F32.PACK_AB"]
            assert packs > 0 and ops[f"MUFU.{op.upper()}.{t.upper()}"] == 2 * packs, ops


# ---- sm90_probe ------------------------------------------------------------------------------------------------------


@pytest.mark.compile
@pytest.mark.parametrize("bound", [(), ("-DCUINFER_SM90_PROBE_NO_CONVERT",), ("-DCUINFER_SM90_PROBE_NO_STAGE",)])
def test_sm90_probe_builds_compile_without_spills(bound):
    """The cycle probe (kernel_src/debug/sm90_probe.cuh) and its bound probes compile into the fp8 Hopper kernel under
    a name of their own, spill-free (a spill would time something else)."""
    from bench.lab.sm90_probe import probe_spec
    from cuinfer.jit import get_compiled
    from cuinfer.prefill import sm90

    (spec,) = [s for s in sm90.default_specs() if s.name == "prefill_sm90/paged/bfloat16/kv-float8_e4m3fn/d128/causal"]
    probe = probe_spec(spec, bound)
    assert probe.name == "lab-probe/" + spec.name and probe.extra_options[-len(bound) - 1 :] == (
        "-DCUINFER_SM90_PROBE", *bound)  # fmt: skip
    mod = get_compiled(probe, "sm_90a")
    assert mod.cubin and "0 bytes spill stores" in mod.log, mod.log


# ---- sass_ctrl -------------------------------------------------------------------------------------------------------


def _hi_word(stall, yld, wb, rb, wait):
    c = stall | (yld << 4) | (wb << 5) | (rb << 8) | (sum(1 << s for s in wait) << 11)
    return c << 41


def test_sass_ctrl_decodes_the_control_fields():
    """Bits 105-125: stall 4, yield 1, write and read scoreboards 3 each (7: none), wait mask 6."""
    from bench.lab.sass_ctrl import control

    assert control(_hi_word(8, 1, 2, 7, (1, 3))) == {"stall": 8, "yld": True, "wb": 2, "rb": None, "wait": (1, 3)}
    assert control(_hi_word(1, 0, 7, 4, ())) == {"stall": 1, "yld": False, "wb": None, "rb": 4, "wait": ()}
    assert control(0x000FE20000000800)["stall"] == 1  # (a cuobjdump high word: LDC's)


def test_sass_ctrl_parses_a_listing_and_models_a_waiting_consumer():
    """A MUFU op's consumer that waits on its scoreboard issues `latency` cycles after it; with the result read
    sooner (no wait) the window is its stall counts; two warps share the MUFU unit."""
    from bench.lab.sass_ctrl import issue_model, parse_listing, softmax_window

    def line(addr, text, stall, wb=7, wait=()):
        hi = _hi_word(stall, 1, wb, 7, wait)
        return f"   /*{addr:04x}*/   {text} ;   /* 0x0000000000000000 */\n" + f"{' ' * 40}/* 0x{hi:016x} */\n"

    text = "        Function : k\n" + "".join([
        line(0, "WARPGROUP.DEPBAR.LE gsb0, 0x1", 1),
        line(0x10, "MUFU.TANH R2, R2", 1, wb=1),
        line(0x20, "FFMA R2, R7, R2, -UR6", 1, wait=(1,)),
        line(0x30, "MUFU.EX2 R2, R2", 1, wb=2),
        line(0x40, "FADD R3, R3, R2", 4, wait=(2,)),
        line(0x50, "WARPGROUP.DEPBAR.LE gsb0, 0x0", 1),
    ])  # fmt: skip
    prog = softmax_window(parse_listing(text)["k"], tile="all")
    assert [x.opcode for x in prog] == ["MUFU.TANH", "FFMA", "MUFU.EX2", "FADD"]
    assert (prog[0].wb, prog[1].wait, prog[3].stall) == (1, (1,), 4)
    # tanh at 0, FFMA at 24, ex2 at 25 (result 49), FADD at 49 (next issue 53)
    assert issue_model(prog, [0], latency=24, interval=8) == [53]
    assert issue_model(prog, [0], latency=24, interval=8, slot=2) == [54]  # ex2 two cycles behind the FFMA
    free = [x.__class__(x.text, x.stall, x.yld, x.wb, x.rb, ()) for x in prog]  # (no waits)
    assert issue_model(free, [0], latency=24, interval=8)[0] == 8 + 24  # ex2 behind the tanh on the unit
    a, b = issue_model(prog, [0, 0], latency=24, interval=8)
    assert a == 53 and b == 53 + 8  # the second warp's tanh waits for the unit: it trails by one interval
