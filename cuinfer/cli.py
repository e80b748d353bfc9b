"""The ``cuinfer`` command: info, demo, kernels --report, warmup."""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time


def _versions() -> list[tuple[str, str]]:
    from importlib import metadata

    from cuinfer import __version__

    rows = [("cuinfer", __version__)]
    for dist in ("numpy", "cupy-cuda12x", "cupy-cuda13x", "cuda-bindings", "ml_dtypes"):
        try:
            rows.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            pass
    return rows


def cmd_info(args: argparse.Namespace) -> int:
    from cuinfer.jit import cache_dir, cache_size
    from cuinfer.jit.toolchain import toolchain
    from cuinfer.runtime.device import device_info, gpu_available

    for name, ver in _versions():
        print(f"{name:16s} {ver}")
    try:
        print(f"{'toolchain':16s} {toolchain().describe()}")
    except Exception as exc:
        print(f"{'toolchain':16s} unavailable: {exc}")
    if gpu_available():
        d = device_info()
        print(f"{'gpu':16s} {d.name} (device {d.device_id})")
        print(f"{'arch':16s} {d.arch} (compute capability {d.compute_capability[0]}.{d.compute_capability[1]})")
        print(f"{'SMs':16s} {d.sm_count}, {d.smem_per_block_optin // 1024} KB smem per block, "
              f"{d.l2_bytes // (1 << 20)} MB L2")  # fmt: skip
    else:
        print(f"{'gpu':16s} none (no CUDA driver or device): NumPy inputs run on the CPU reference backend")
    n, size = cache_size()
    print(f"{'cache':16s} {cache_dir()} ({n} modules, {size / 1e6:.1f} MB)")
    return 0


def _target_arch(arch: str | None) -> str:
    if arch:
        return arch
    from cuinfer.runtime.device import device_info, gpu_available

    return device_info().arch if gpu_available() else "sm_90a"


def cmd_kernels(args: argparse.Namespace) -> int:
    from cuinfer.jit import get_compiled
    from cuinfer.jit.registry import specs

    arch = _target_arch(args.arch)
    todo = specs(args.group)
    if not args.report:
        for s in todo:
            print(s.name)
        return 0
    print(f"resource report for {arch} ({len(todo)} modules; compiling any that are not cached)")
    print(f"{'module':34s} {'kernel':44s} {'regs':>5s} {'spill st/ld':>11s} {'stack':>6s} {'smem':>6s}")
    worst = 0
    for s in todo:
        mod = get_compiled(s, arch)
        names = {v: k for k, v in mod.lowered.items()}
        for sym, r in sorted(mod.resources.items()):
            kname = names.get(sym, sym).replace("cuinfer::", "")
            kname = kname if len(kname) <= 44 else kname[:41] + "..."
            print(f"{s.name:34s} {kname:44s} {r.registers:5d} {r.spill_stores:5d}/{r.spill_loads:<5d} "
                  f"{r.stack_frame:6d} {r.smem_static:6d}")  # fmt: skip
            worst = max(worst, r.spill_stores + r.spill_loads)
    return 1 if worst else 0


def cmd_warmup(args: argparse.Namespace) -> int:
    from cuinfer.jit import get_compiled, stats
    from cuinfer.jit.registry import specs

    arch = _target_arch(args.arch)
    todo = specs(args.group)
    jobs = args.jobs or max(1, os.cpu_count() or 1)
    print(f"warming {len(todo)} kernel modules for {arch} with {jobs} threads into the cache", flush=True)
    start = time.perf_counter()
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(get_compiled, s, arch): s for s in todo}
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            s = futures[fut]
            try:
                mod = fut.result()
                status = f"{mod.compile_seconds:5.2f}s"
            except Exception as exc:  # report every failure, keep going
                failed += 1
                status = f"FAILED: {str(exc).splitlines()[0]}"
            print(f"[{i:3d}/{len(todo)}] {s.name:40s} {status}", flush=True)
    print(f"done in {time.perf_counter() - start:.1f}s: {stats.compiles} compiled, {stats.disk_hits} already cached, "
          f"{failed} failed")  # fmt: skip
    return 1 if failed else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from cuinfer.demo import run_demo

    return run_demo(cpu=args.cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cuinfer", description="cuinfer: attention kernels for LLM serving")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="GPU, arch, toolchain versions, kernel cache").set_defaults(fn=cmd_info)
    p = sub.add_parser("demo", help="run a small serving-shaped workload and check it against the reference")
    p.add_argument("--cpu", action="store_true", help="use the CPU reference backend even when a GPU is present")
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("kernels", help="list the kernel specialisations, or report their resources")
    p.add_argument("--report", action="store_true", help="registers, spills, stack and shared memory per kernel")
    p.add_argument("--arch", help="target (default: this GPU's, or sm_90a without one)")
    p.add_argument("--group", help="one kernel group (merge, decode, prefill)")
    p.set_defaults(fn=cmd_kernels)
    p = sub.add_parser("warmup", help="pre-compile kernel specialisations into the disk cache (for deployments)")
    p.add_argument("--arch", help="target (default: this GPU's, or sm_90a without one)")
    p.add_argument("--group", help="one kernel group (merge, decode, prefill)")
    p.add_argument("--jobs", type=int, default=0, help="compiler threads (default: CPU count)")
    p.set_defaults(fn=cmd_warmup)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
