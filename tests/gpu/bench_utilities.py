"""Lab timing of the memory-bound serving utilities on large inputs: GB/s and % of a device-to-device copy.

    python tests/gpu/bench_utilities.py [--reps 30] [--dtype bfloat16] [--only append,rope,packbits] [--kernels]

A plain script, not a test (pytest collects test_*.py only). Needs torch with CUDA. Each timed run is preceded by a
512 MB write that flushes the L2 (50 MB on an H200), so every run reads its inputs from DRAM, and by a ~1 ms GPU
sleep enqueued before the start event: the host's work in the call (argument checks, launch) then overlaps the
sleep instead of landing between the two events, where an idle GPU would count it as kernel time (a call whose host
work outlasted the ~0.2 ms flush showed a third of its kernels' bandwidth that way). The host's time per call is
printed beside, so it stays visible. segment_packbits reads indptr on the host (a synchronising copy), so its host
work after that read is GPU idle time inside its figure. The figure is the median of ``--reps`` runs timed with CUDA
events. ``--kernels`` times the kernels alone instead (the torch profiler's durations of cuinfer's kernels, and of
the copy's, each the median over the runs, summed over a call's kernels): the GPU's side without any host work.
Bytes are what the kernel must move at least (each input element read once, each output element written once); the
copy baseline is ``torch.Tensor.copy_`` of a buffer of the same
size, timed the same way, so "% copy" compares like with like.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cuinfer  # noqa: E402

FLUSH_BYTES = 512 << 20
SLEEP_CYCLES = 2_000_000  # ~1 ms at the H200's ~2 GHz: longer than any call's host work
_host_us: list[float] = []  # host time of the last timed() call's runs


def timed(torch, fn: Callable[[], object], reps: int) -> float:
    """Median milliseconds of fn over reps runs, each after an L2 flush and a GPU sleep that covers the host's part
    of the call; the host's times go to ``_host_us``."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    fn()  # compile / load once
    torch.cuda.synchronize()
    times = []
    _host_us.clear()
    for _ in range(reps):
        flush.fill_(1)
        torch.cuda._sleep(SLEEP_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        _host_us.append((time.perf_counter() - t0) * 1e6)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernel_timed(torch, fn: Callable[[], object], reps: int) -> float:
    """Milliseconds of fn's GPU kernels alone (cuinfer's and device-to-device copies): per kernel name the median
    profiler duration over reps runs, each after an L2 flush; summed over the names."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    _host_us.clear()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.fill_(1)
            t0 = time.perf_counter()
            fn()
            _host_us.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    runs: dict[str, list[float]] = {}
    for ev in prof.profiler.kineto_results.events():
        name = ev.name()
        if ev.device_type() == torch.autograd.DeviceType.CUDA and ("cuinfer" in name or "Memcpy DtoD" in name):
            runs.setdefault(name, []).append(ev.duration_ns() / 1e6)
    return sum(statistics.median(v) for v in runs.values())


def copy_gbps(torch, nbytes: int, reps: int) -> float:
    """Device-to-device copy bandwidth (bytes read + written) for a buffer of about nbytes / 2."""
    src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timed(torch, lambda: dst.copy_(src), reps)
    return 2 * src.numel() / ms / 1e6


def report(name: str, nbytes: int, ms: float, copy: float, host_us: float) -> None:
    gbps = nbytes / ms / 1e6
    print(
        f"{name:58s} {nbytes / 2**20:9.1f} MiB {ms * 1e3:9.1f} us {gbps:8.0f} GB/s {100 * gbps / copy:6.1f} % copy"
        f" {host_us:8.1f} us host"
    )


def bench_append(torch, dtype, reps: int) -> None:
    rng = np.random.default_rng(0)
    for nnz, hkv, d, page, layout, fused in (
        (16384, 8, 128, 16, "NHD", False),
        (16384, 8, 128, 16, "NHD", True),
        (16384, 8, 128, 16, "HND", False),
        (65536, 2, 128, 1, "NHD", False),
        (8192, 8, 256, 64, "NHD", False),
    ):
        pages = -(-nnz // page)
        cache = torch.zeros((pages + 8, 2, page, hkv, d) if layout == "NHD" else (pages + 8, 2, hkv, page, d),
                            dtype=dtype, device="cuda")  # fmt: skip
        if fused:  # k and v sliced out of a fused qkv [nnz, 4 hkv, d] (Hq = 2 Hkv)
            qkv = torch.randn(nnz, 4 * hkv, d, dtype=dtype, device="cuda")
            k, v = qkv[:, 2 * hkv : 3 * hkv], qkv[:, 3 * hkv :]
        else:
            k = torch.randn(nnz, hkv, d, dtype=dtype, device="cuda")
            v = torch.randn(nnz, hkv, d, dtype=dtype, device="cuda")
        perm = torch.from_numpy(rng.permutation(pages + 8)[:pages].astype(np.int32)).cuda()
        indptr = torch.tensor([0, pages], dtype=torch.int32, device="cuda")
        last = torch.tensor([nnz - page * (pages - 1)], dtype=torch.int32, device="cuda")
        bidx = torch.zeros(nnz, dtype=torch.int32, device="cuda")
        pos = torch.arange(nnz, dtype=torch.int32, device="cuda")
        nbytes = 2 * 2 * k.numel() * k.element_size()  # read k, v; write them
        fn = partial(cuinfer.append_paged_kv_cache, k, v, bidx, pos, cache, perm, indptr, last, kv_layout=layout)
        ms = timed(torch, fn, reps)
        host = statistics.median(_host_us)
        name = f"append nnz={nnz} H={hkv} D={d} page={page} {layout}{' fused-qkv' if fused else ''}"
        report(name, nbytes, ms, copy_gbps(torch, nbytes, reps), host)


def bench_rope(torch, dtype, reps: int) -> None:
    rng = np.random.default_rng(1)
    for nnz, hq, hk, d, rot, interleave, kind in (
        (16384, 32, 8, 128, None, False, "pos_ids inplace"),
        (16384, 32, 8, 128, None, False, "pos_ids"),
        (16384, 32, 8, 128, None, True, "pos_ids interleave"),
        (16384, 32, 8, 128, None, False, "llama31 inplace"),
        (16384, 32, 8, 128, None, False, "cos_sin_cache inplace"),
        (16384, 32, 8, 128, 64, False, "pos_ids rotary_dim=64"),
        (128, 32, 8, 128, None, False, "pos_ids inplace (decode batch)"),
    ):
        q = torch.randn(nnz, hq, d, dtype=dtype, device="cuda")
        k = torch.randn(nnz, hk, d, dtype=dtype, device="cuda")
        pos = torch.from_numpy(rng.integers(0, 100_000, nnz).astype(np.int32)).cuda()
        inplace = "inplace" in kind
        r = rot or d
        if kind.startswith("cos_sin_cache"):
            table = torch.randn(131072, r, dtype=torch.float32, device="cuda")
            q2, k2 = q.view(nnz, -1), k.view(nnz, -1)
            fn = partial(cuinfer.apply_rope_with_cos_sin_cache_inplace, pos, q2, k2, d, table)
        else:
            base = "apply_llama31_rope_pos_ids" if kind.startswith("llama31") else "apply_rope_pos_ids"
            op = getattr(cuinfer, base + ("_inplace" if inplace else ""))
            fn = partial(op, q, k, pos, rotary_dim=rot, interleave=interleave)
        elems = (hq + hk) * nnz * (r if inplace else d)  # in place, the pass-through dims are not touched
        nbytes = 2 * elems * q.element_size()
        ms = timed(torch, fn, reps)
        host = statistics.median(_host_us)
        report(f"rope nnz={nnz} Hq={hq} Hk={hk} D={d} {kind}", nbytes, ms, copy_gbps(torch, nbytes, reps), host)


def bench_packbits(torch, reps: int) -> None:
    for n in (1 << 28, (1 << 28) + 5):
        x = torch.rand(n, device="cuda") < 0.5
        nbytes = n + (n + 7) // 8
        ms = timed(torch, partial(cuinfer.packbits, x), reps)
        host = statistics.median(_host_us)
        report(f"packbits n={n}", nbytes, ms, copy_gbps(torch, nbytes, reps), host)
    seg = torch.full((4096,), (1 << 28) // 4096 - 3, dtype=torch.int32)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(seg, 0).to(torch.int32)]).cuda()
    x = torch.rand(int(indptr[-1]), device="cuda") < 0.5
    nbytes = x.numel() + x.numel() // 8
    ms = timed(torch, partial(cuinfer.segment_packbits, x, indptr), reps)
    host = statistics.median(_host_us)
    name = "segment_packbits 4096 segments (includes the indptr read)"
    report(name, nbytes, ms, copy_gbps(torch, nbytes, reps), host)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    ap.add_argument("--only", default="append,rope,packbits")
    ap.add_argument("--kernels", action="store_true", help="time the kernels alone (torch profiler), not the calls")
    args = ap.parse_args(argv)
    import torch

    if args.kernels:
        global timed
        timed = kernel_timed

    if not torch.cuda.is_available():
        print("needs torch with a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    what = "kernels alone" if args.kernels else "calls"
    print(f"{torch.cuda.get_device_name()}  dtype={args.dtype}  reps={args.reps} (medians of {what}, L2 flushed)")
    only = set(args.only.split(","))
    if "append" in only:
        bench_append(torch, dtype, args.reps)
    if "rope" in only:
        bench_rope(torch, dtype, args.reps)
    if "packbits" in only:
        bench_packbits(torch, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
