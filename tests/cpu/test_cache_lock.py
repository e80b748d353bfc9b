"""No compile stampede: processes compiling the same kernel into one cache wait for a single compile, and a crashed or
hung compiler never blocks the others for good (cuinfer/jit/cache.py, ``key_lock``)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest

from cuinfer.jit import KernelSpec, cache, fetch
from cuinfer.jit.cache import CacheWarning, key_lock, spec_key

ARCH = "sm_80"
# cuda_fp16.h makes a compile take a few hundred ms: long enough for the other processes to find the lock held.
SLOW = """#include <cuda_fp16.h>
template <int N>
__global__ void k(__half* x) { x[threadIdx.x] += __float2half(N * $v); }
"""


def slow_spec(tmp_path, v: str) -> KernelSpec:
    src = tmp_path / "slow.cu"
    if not src.exists():
        src.write_text(SLOW)
    return KernelSpec(f"test/slow/{v}", str(src), ("k<1>",), substitutions=(("v", v),))


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CUINFER_CACHE_MODE", raising=False)
    monkeypatch.delenv("CUINFER_CACHE_LOCK_TIMEOUT", raising=False)
    monkeypatch.setattr(cache, "_warned", set())
    return tmp_path


def _warm(specs, barrier, results) -> None:
    """One serving worker: wait for the others, then get every spec (spawned: a fresh interpreter)."""
    from cuinfer.jit import get_compiled, stats

    barrier.wait()
    for s in specs:
        get_compiled(s, ARCH)
    results.put((stats.compiles, stats.disk_hits, stats.lock_waits))


def test_four_processes_warming_one_fresh_cache_compile_each_kernel_once(env):
    specs = [slow_spec(env, v) for v in ("1.0f", "2.0f", "3.0f")]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_warm, args=(specs, barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    counts = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    compiles, hits, waits = (sum(c[i] for c in counts) for i in range(3))
    assert compiles == len(specs), f"NVRTC ran {compiles} times for {len(specs)} kernels (per process: {counts})"
    assert hits == 4 * len(specs) - compiles
    assert waits >= 1, "no process ever found the lock held: the test did not race"
    names = os.listdir(env / "cache")
    assert sorted(n.endswith(".cubin") for n in names) == [True] * len(specs), names  # lock files removed


def test_a_crashed_compiler_does_not_block_the_others(env):
    spec = slow_spec(env, "1.0f")
    directory = env / "cache"
    directory.mkdir(mode=0o700)
    lock = directory / f".{spec_key(spec, ARCH)}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, os, time\nfd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "locked"
    done = {}
    worker = threading.Thread(target=lambda: done.setdefault("r", fetch(spec, ARCH)))
    start = time.monotonic()
    worker.start()
    time.sleep(0.5)
    assert worker.is_alive(), "fetch did not wait for the process holding the lock"
    holder.kill()  # crashes mid-compile, leaving its lock file behind
    holder.wait()
    worker.join(timeout=60)
    assert not worker.is_alive() and time.monotonic() - start < 30
    assert done["r"].compiled and done["r"].waited
    assert not lock.exists()


def test_a_stale_lock_file_without_holder_costs_nothing(env):
    spec = slow_spec(env, "1.0f")
    directory = env / "cache"
    directory.mkdir(mode=0o700)
    lock = directory / f".{spec_key(spec, ARCH)}.lock"
    lock.write_text("")
    r = fetch(spec, ARCH)
    assert r.compiled and not r.waited and not lock.exists()


def test_a_hung_holder_is_given_up_on_after_the_timeout(env, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_LOCK_TIMEOUT", "0.5")
    spec = slow_spec(env, "1.0f")
    directory = env / "cache"
    directory.mkdir(mode=0o700)
    with key_lock(str(directory), spec_key(spec, ARCH)) as waited:  # another open file: conflicts like a process
        assert not waited
        start = time.monotonic()
        with pytest.warns(CacheWarning, match=r"waited 0.5s for the process compiling .*compiling it here as well"):
            r = fetch(spec, ARCH)
        assert time.monotonic() - start >= 0.5
    assert r.compiled and r.directory == str(directory)


def test_bad_lock_timeout_is_an_error(env, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="CUINFER_CACHE_LOCK_TIMEOUT='soon' is not a number of seconds"):
        fetch(slow_spec(env, "1.0f"), ARCH)
