"""python -m bench: argument parsing, --help without torch, list, plot from JSON, a clear refusal without a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # bench/ runs from the checkout, not installed

from bench.__main__ import main, parse_args, suites_for  # noqa: E402


def _run(*args, timeout=120):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip


def test_help_imports_no_framework():
    code = (
        "import sys; sys.argv = ['bench', '--help']\n"
        "import bench.__main__ as m\n"
        "try:\n    m.main()\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "bad = [k for k in ('torch', 'cupy', 'flashinfer', 'cuinfer', 'matplotlib', 'jax') if k in sys.modules]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "merge,decode,prefill,plan,all" in r.stdout and "--no-peers" in r.stdout and "D10" in r.stdout


def test_parse_defaults_and_options():
    a = parse_args(["decode", "--cases", "D1,d5", "--iters", "40", "--out", "/tmp/x", "--no-peers"])
    assert (a.command, a.cases, a.iters, a.warmup, a.peers, str(a.out)) == (
        "decode",
        ["D1", "d5"],
        40,
        5,
        False,
        "/tmp/x",
    )
    assert [c.id for _, cs in suites_for(a) for c in cs] == ["D1", "D5"]
    d = parse_args(["all"])
    assert (d.iters, d.peers, d.quick, d.out, d.plot) == (30, True, False, None, True)
    assert [name for name, _ in suites_for(d)] == ["merge", "decode", "prefill", "plan"]
    q = parse_args(["prefill", "--quick"])
    assert (q.iters, q.warmup) == (5, 2)
    mixed = parse_args(["all", "--cases", "D1,P4"])
    assert [(n, [c.id for c in cs]) for n, cs in suites_for(mixed)] == [("decode", ["D1"]), ("prefill", ["P4"])]


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["decode", "--iters", "10"], "below the docs/benchmarks.md method", id="too-few-iters"),
        pytest.param(["decode", "--cases", "D1,D99"], "unknown case id(s) D99", id="unknown-case"),
        pytest.param(["decode", "--cases", ","], "at least one case id", id="empty-cases"),
        pytest.param(["attention"], "invalid choice", id="unknown-suite"),
        pytest.param(["plot"], "plot needs one or more result JSON files", id="plot-without-files"),
        pytest.param(["decode", "x.json"], "only plot takes files", id="files-for-suite"),
        pytest.param(["decode", "--warmup", "0"], "--warmup must be >= 1", id="no-warmup"),
    ],
)
def test_bad_arguments_say_why(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_list_prints_every_case(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for cid in ("M1", "D1", "D10", "P6", "plan-P64"):
        assert cid in out
    assert "onelong" in out and "≥ 4.1 TB/s" in out


def test_suite_without_gpu_refuses_clearly():
    pytest.importorskip("torch")
    r = _run("decode", "--cases", "D1", "--no-plot")
    assert r.returncode == 2
    assert "no CUDA device" in r.stderr and "python -m bench decode" in r.stderr


def test_no_selected_case_in_suite(capsys):
    assert main(["merge", "--cases", "D1"]) == 2
    assert "no case of 'merge'" in capsys.readouterr().err


def test_plot_command_redraws_from_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from bench import report
    from bench.cases import select
    from bench.suite import Measurement, spec_of

    m = Measurement("merge", "M1", "cuinfer", "default", us=310.0, gbps=3900.0, pct_copy=91.8)
    data = report.payload(spec_of("merge"), cases=list(select("merge", None)), measurements=[m],
                          roofline={"copy_gbps": 4247.0}, env={}, args={}, started=0.0)  # fmt: skip
    _, latest = report.write_json(tmp_path, data, "x")
    assert main(["plot", str(latest)]) == 0
    out = capsys.readouterr().out
    assert "merge_states" in out and "310.0" in out and "pass" in out
    assert latest.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    other = tmp_path / "elsewhere"
    assert main(["plot", str(latest), "--out", str(other), "--no-plot"]) == 0
    assert not other.exists()
