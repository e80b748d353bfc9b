"""The ``cuinfer`` command around the kernel cache: warmup's per-module status, errors as one line, closed pipes,
the dynamic shared memory column (cuinfer/cli.py). Runs ``main([...])`` in-process on a tiny kernel group."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cuinfer.cli import main
from cuinfer.jit import KernelSpec, cache, registry

ARCH = "sm_80"
TINY = "template <int N>\n__global__ void tiny(float* x) { x[threadIdx.x] += N * $v; }\n"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Fresh caches and a kernel group ``tiny`` of two quick modules (the second built for 48 KiB dynamic smem)."""
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CUINFER_CACHE_MODE", raising=False)
    monkeypatch.setattr(cache, "_warned", set())
    src = tmp_path / "tiny.cu"
    src.write_text(TINY)
    specs = [
        KernelSpec("tiny/a", str(src), ("tiny<1>",), substitutions=(("v", "1.0f"),)),
        KernelSpec("tiny/b", str(src), ("tiny<2>",), substitutions=(("v", "2.0f"),), smem_bytes=48 * 1024),
    ]
    monkeypatch.setitem(registry._GROUPS, "tiny", lambda: specs)
    yield tmp_path
    for dirpath, _, _ in os.walk(tmp_path):
        os.chmod(dirpath, 0o755)


def _statuses(lines: list[str]) -> list[str]:
    """The status column of warmup's per-module lines (``[  1/2] name  status``)."""
    return [line.split("] ", 1)[1].split(None, 1)[1] for line in lines if line.startswith("[")]


def _warmup(capsys, *extra) -> tuple[int, list[str], str]:
    rc = main(["warmup", "--group", "tiny", "--arch", ARCH, *extra])
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err


def test_warmup_reports_cached_entries_as_cached(env, capsys):
    rc, lines, _ = _warmup(capsys)
    assert rc == 0
    assert [st.split()[0] for st in _statuses(lines)] == ["compiled", "compiled"]
    assert "2 compiled, 0 already cached, 0 failed" in lines[-2] and lines[-1] == f"stored 2 in {env / 'cache'}"
    rc, lines, _ = _warmup(capsys, "--jobs", "1")
    assert rc == 0
    assert _statuses(lines) == ["cached", "cached"]  # not the compile time of the run that stored them
    assert "0 compiled, 2 already cached, 0 failed" in lines[-1]


def test_compile_failure_prints_the_first_error_line(env, capsys, monkeypatch):
    bad = KernelSpec("tiny/bad", str(env / "tiny.cu"), ("tiny<1>",), substitutions=(("v", "undefined_xyz"),))
    monkeypatch.setitem(registry._GROUPS, "tiny", lambda: [bad])
    rc, lines, _ = _warmup(capsys)
    assert rc == 1
    (row,) = [line for line in lines if line.startswith("[")]
    assert "FAILED: " in row and 'error: identifier "undefined_xyz" is undefined' in row, row


def test_arch_nvrtc_does_not_know_fails_with_its_message(env, capsys):
    rc = main(["warmup", "--group", "tiny", "--arch", "sm_99"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert rc == 1 and len(rows) == 2
    assert all(row.split("FAILED: ")[1].strip() for row in rows), rows  # never an empty reason
    assert "gpu-architecture" in rows[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["warmup", "--arch", "foo"], "argument --arch: 'foo' is not a target arch; expected sm_<major><minor>"),
        (["kernels", "--report", "--arch", "sm_75"], "argument --arch: 'sm_75' is not a target arch"),
        (["warmup", "--group", "nope"], "argument --group: unknown kernel group 'nope'; groups are "),
        (["kernels", "--group", "nope"], "argument --group: unknown kernel group 'nope'"),
        (["warmup", "--jobs", "-1"], "argument --jobs: '-1' is not a number of threads"),
        (["warmup", "--jobs", "many"], "argument --jobs: 'many' is not a number of threads"),
    ],
)
def test_bad_arguments_are_one_line_errors_with_exit_2(env, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.splitlines()[-1].startswith(f"cuinfer {argv[0]}: error: {message}"), err
    assert "Traceback" not in err


def test_accepted_arch_forms(env):
    from cuinfer.cli import _arch

    for arch in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120", "sm_120f"):
        assert _arch(arch) == arch


def test_bad_cache_mode_is_a_usage_error(env, capsys, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_MODE", "world")
    with pytest.raises(SystemExit) as info:
        main(["warmup", "--group", "tiny"])
    assert info.value.code == 2 and "'private'" in capsys.readouterr().err


def test_kernels_report_shows_dynamic_shared_memory(env, capsys):
    assert main(["kernels", "--report", "--group", "tiny", "--arch", ARCH]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[-3:] == ["smem", "dyn", "smem"]
    rows = {line.split()[0]: line.split() for line in lines[2:] if line.startswith("tiny/")}
    assert rows["tiny/a"][-1] == "-" and rows["tiny/b"][-1] == str(48 * 1024)


def test_warmup_into_a_read_only_cache_with_nowhere_else_fails_and_says_why(env, capsys):
    (env / "cache").mkdir(mode=0o555)
    (env / "xdg" / "cuinfer").mkdir(parents=True)
    for d in (env / "cache", env / "xdg" / "cuinfer"):
        os.chmod(d, 0o555)
    rc, lines, err = _warmup(capsys)
    assert rc == 1
    assert "read-only" in lines[0]
    assert [st.split()[0] for st in _statuses(lines)] == ["compiled", "compiled"]
    assert all(st.endswith(", NOT STORED") for st in _statuses(lines))
    assert any(line.startswith("could not store 2 compiled modules: ") for line in lines)
    assert "nothing could be stored" in err
    assert os.listdir(env / "cache") == []


def test_warmup_behind_a_read_only_cache_stores_in_the_user_cache(env, capsys):
    (env / "cache").mkdir(mode=0o555)
    os.chmod(env / "cache", 0o555)
    rc, lines, _ = _warmup(capsys)
    assert rc == 0
    assert f"{env / 'cache'} (read-only: mode 0555 (no owner write bit)), then {env / 'xdg' / 'cuinfer'}" in lines[0]
    assert lines[-1] == f"stored 2 in {env / 'xdg' / 'cuinfer'}"
    rc, lines, _ = _warmup(capsys)
    assert rc == 0 and "0 compiled, 2 already cached" in lines[-1]


@pytest.mark.parametrize("command", ["warmup", "kernels"])
def test_an_untrusted_cache_is_one_error(env, capsys, command):
    (env / "cache").mkdir()
    os.chmod(env / "cache", 0o777)
    extra = ["--report"] if command == "kernels" else []
    assert main([command, *extra, "--group", "tiny", "--arch", ARCH]) == 1
    out = capsys.readouterr()
    assert "tiny/" not in out.out
    assert out.err.startswith(f"cuinfer {command}: error: untrusted kernel cache directory") and "0777" in out.err
    assert out.err.count("\n") == 1


def test_info_shows_the_cache_tiers_and_mode(env, capsys):
    (env / "cache").mkdir(mode=0o555)
    os.chmod(env / "cache", 0o555)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"{env / 'cache'} (read-only: mode 0555" in out and f"{env / 'xdg' / 'cuinfer'} (writable" in out
    assert "cache mode       private" in out


def _cuinfer_env(env) -> dict:
    return {**os.environ, "PYTHONPATH": REPO, "CUINFER_CACHE_DIR": str(env / "cache")}


def test_kernels_into_a_closed_pipe_exits_quietly(env):
    shell = subprocess.run(
        f"{sys.executable} -m cuinfer kernels | head -1", shell=True, capture_output=True, text=True,
        env=_cuinfer_env(env), cwd=REPO,
    )  # fmt: skip
    assert shell.returncode == 0 and shell.stderr == "", shell.stderr
    assert shell.stdout.count("\n") == 1 and "/" in shell.stdout
    # The same, deterministic: the reader is gone before the first write (head may have read everything first).
    proc = subprocess.Popen(
        [sys.executable, "-m", "cuinfer", "kernels"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=_cuinfer_env(env), cwd=REPO,
    )  # fmt: skip
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == "", err
