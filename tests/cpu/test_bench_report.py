"""bench/report.py and bench/suite.py records: summary (ratio, target, pass/miss, missing peers), table, JSON, plot."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ runs from the checkout, not installed

from bench import report  # noqa: E402
from bench.cases import DECODE_CASES, select  # noqa: E402
from bench.suite import Measurement, first_line, progress_line, spec_of  # noqa: E402


def _m(case, impl, variant, us=None, status="ok", error="", nbytes=None, **kw):
    m = Measurement("decode", case, impl, variant, status=status, us=us, bytes=nbytes, error=error, **kw)
    if us is not None and nbytes:
        m.gbps = nbytes / (us * 1e-6) / 1e9
    return m


@pytest.fixture
def decode_run():
    """D1 (target ≤ 26.3 µs) with all FlashInfer rows that apply, D4 (≤ 43.2 µs) with the tensor-core peer failing."""
    d4_bytes = 134_250_496
    ms = [
        _m("D1", "cuinfer", "default", 20.0, plan_us=31.0),
        _m("D1", "cuinfer", "tensor-cores", 27.5),
        _m("D1", "cuinfer", "cuda-cores", status="not-implemented", error="not implemented yet: NotImplementedError"),
        _m("D1", "flashinfer", "cuda-cores", 34.8),
        _m("D1", "flashinfer", "tensor-cores", 30.0),
        _m("D4", "cuinfer", "default", 45.0, nbytes=d4_bytes),
        _m("D4", "flashinfer", "cuda-cores", 80.0, nbytes=d4_bytes),
        _m("D4", "flashinfer", "tensor-cores", status="error", error="RuntimeError: JIT failed"),
    ]
    cases = select("decode", ["D1", "D4"])
    return cases, ms


def test_summary_ratio_target_and_missing_peers(decode_run):
    cases, ms = decode_run
    spec = spec_of("decode")
    rows = report.summarize(spec, [c.id for c in cases], {c.id: c.describe() for c in cases}, ms)
    by = {(r["case"], r["variant"]): r for r in rows}
    d1 = by[("D1", "default")]
    assert d1["best_peer"] == "flashinfer[tensor-cores]"
    assert d1["vs_peer"] == pytest.approx(30.0 / 20.0)
    assert d1["pass"] is True and d1["target"] == "≤ 26.3 µs (floor 23.3 + 3)"
    assert d1["peers"]["FI BatchAttention µs"] is None  # not run on D1: shown as –
    assert by[("D1", "tensor-cores")]["pass"] is False  # 27.5 µs misses ≤ 26.3
    nimp = by[("D1", "cuda-cores")]
    assert nimp["status"] == "not-implemented" and nimp["pass"] is None and "not implemented" in nimp["note"]
    d4 = by[("D4", "default")]
    assert d4["peers"]["FI tensor-cores µs"] == "err"
    assert d4["vs_peer"] == pytest.approx(80.0 / 45.0)  # only the CUDA-core peer ran
    assert d4["gbps"] == pytest.approx(134_250_496 / 45e-6 / 1e9)
    assert d4["pass"] is False  # 45 µs misses ≤ 43.2
    assert [r["variant"] for r in rows if r["case"] == "D4"] == ["default"]  # no row for unmeasured variants


def test_summary_without_peers_shows_dashes(decode_run):
    cases, ms = decode_run
    spec = spec_of("decode")
    ours = [m for m in ms if m.impl == "cuinfer"]
    rows = report.summarize(spec, [c.id for c in cases], {}, ours)
    assert all(r["vs_peer"] is None and set(r["peers"].values()) == {None} for r in rows)
    table = report.format_table(spec, rows, ours)
    d1_line = next(line for line in table.splitlines() if line.startswith("D1") and " default " in line)
    assert d1_line.count(report.DASH) >= 4  # three peer columns and the ratio


def test_table_lists_failed_peers_and_flags(decode_run):
    cases, ms = decode_run
    spec = spec_of("decode")
    rows = report.summarize(spec, [c.id for c in cases], {c.id: c.describe() for c in cases}, ms)
    table = report.format_table(spec, rows, ms)
    lines = table.splitlines()
    assert lines[0] == spec.title
    assert "FI cuda-cores µs" in lines[1] and "vs best peer" in lines[1]
    assert "1.50×" in table and "pass" in table and "MISS" in table
    assert "D4 flashinfer[tensor-cores]: RuntimeError: JIT failed" in table
    widths = {len(line) for line in lines[1:3]}
    assert len(widths) == 1  # header and rule line up


def test_json_written_twice_and_loads_back(tmp_path, decode_run):
    cases, ms = decode_run
    spec = spec_of("decode")
    data = report.payload(spec, cases=list(cases), measurements=ms, roofline={"copy_gbps": 4247.0},
                          env={"gpu": "test"}, args={"iters": 30}, started=0.0)  # fmt: skip
    path, latest = report.write_json(tmp_path / "out", data, "20261129-120000")
    assert path.name == "decode-20261129-120000.json" and latest.name == "decode-latest.json"
    assert path.read_text() == latest.read_text()
    loaded, back = report.load(latest)
    assert loaded["suite"] == "decode" and loaded["cases"][0]["target"] == "≤ 26.3 µs (floor 23.3 + 3)"
    assert [m.as_dict() for m in back] == [m.as_dict() for m in ms]
    assert json.loads(path.read_text())["summary"][0]["case"] == "D1"
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_plot_writes_png(tmp_path, decode_run):
    pytest.importorskip("matplotlib")
    cases, ms = decode_run
    spec = spec_of("decode")
    data = report.payload(spec, cases=list(cases), measurements=ms, roofline={"copy_gbps": 4247.0},
                          env={}, args={}, started=0.0)  # fmt: skip
    png = report.plot(spec, data, ms, tmp_path / "decode.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_suite_spec_is_consistent():
    for name in ("merge", "decode", "prefill", "plan"):
        spec = spec_of(name)
        assert spec.name == name
        headers = [h for _, _, h in spec.peers]
        assert len(headers) == len(set(headers))
        for c in select(name, None):
            for v in spec.cuinfer_variants:
                assert spec.target(c.id, v) is not None
    prefill = spec_of("prefill")
    assert prefill.target("P1", "fa2").value == 375 and prefill.target("P1", "auto").value == 680
    with pytest.raises(ValueError, match="unknown suite"):
        spec_of("attention")


def test_first_line_and_progress_line():
    ex = ValueError("q has shape (7, 32, 128) but plan() was made for num_qo_heads=64\nlong NVRTC log ...")
    assert first_line(ex) == "ValueError: q has shape (7, 32, 128) but plan() was made for num_qo_heads=64"
    assert first_line(RuntimeError()) == "RuntimeError"
    assert len(first_line(RuntimeError("x" * 1000))) == 300
    m = _m("D5", "cuinfer", "default", 257.1, nbytes=1_075_838_976, plan_us=31.25)
    m.pct_copy = 98.4
    line = progress_line(m)
    assert "D5" in line and "257.1 µs" in line and "GB/s" in line and "98.4 % copy" in line and "plan 31.2" in line
    bad = _m("D10", "cuinfer", "default", status="not-implemented", error="not implemented yet: fp8 KV")
    assert progress_line(bad).endswith("not implemented yet: fp8 KV")


def test_case_descriptions_are_in_json(decode_run):
    cases, ms = decode_run
    data = report.payload(spec_of("decode"), cases=list(DECODE_CASES), measurements=ms, roofline=None, env={},
                          args={}, started=0.0)  # fmt: skip
    d10 = next(c for c in data["cases"] if c["id"] == "D10")
    assert d10["kv_dtype"] == "float8_e4m3fn" and "fp8" not in d10["desc"] and "float8_e4m3fn" in d10["desc"]
