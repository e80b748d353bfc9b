"""The ``cuinfer`` command: info, demo, kernels [--report], warmup, bundle export|import.

Exit status: 0 done; 1 a failure the output describes (a kernel that did not compile, spills in ``kernels --report``,
``warmup`` that could store nothing, a refused cache or bundle); 2 bad usage (argparse's one-line error); 141 (128 +
SIGPIPE, as a shell reports for any filter) when stdout was closed early, e.g. ``cuinfer kernels | head``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import sys
import time
import warnings

_ARCH = re.compile(r"^sm_(\d+)(\d)([af]?)$")
_ARCH_FORM = (
    "sm_<major><minor> of compute capability 8.0 or newer, with the 'a' (or 'f') suffix for arch-specific "
    "instructions: sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120"
)


def _arch(value: str) -> str:
    m = _ARCH.match(value)
    if not m or int(m.group(1)) < 8:
        raise argparse.ArgumentTypeError(f"{value!r} is not a target arch; expected {_ARCH_FORM}")
    return value


def _jobs(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of threads (1 or more; 0 means one per CPU)")
    return n


def _group(value: str) -> str:
    from cuinfer.jit.registry import groups

    known = groups()
    if value not in known:
        raise argparse.ArgumentTypeError(f"unknown kernel group {value!r}; groups are {', '.join(known)}")
    return value


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


def _describe_tiers(tiers) -> str:
    """Where lookups read and new entries go, in one line."""
    parts = []
    for t in tiers:
        state = "writable" if t.writable else f"read-only: {t.why_read_only}"
        parts.append(f"{t.path} ({state}{'' if t.exists else ', not created yet'})")
    return ", then ".join(parts)


def cmd_info(args: argparse.Namespace) -> int:
    from cuinfer.jit import cache
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
    try:
        tiers = cache.cache_tiers()
    except cache.CacheTrustError as exc:
        print(f"{'cache':16s} REFUSED: {exc}")
        return 1
    for i, t in enumerate(tiers):
        n, size = cache.cache_size(t.path)
        label = "cache" if i == 0 else "cache (then)"
        print(f"{label:16s} {_describe_tiers([t])}: {n} modules, {size / 1e6:.1f} MB")
    print(f"{'cache mode':16s} {cache.cache_mode()}")
    return 0


def _target_arch(arch: str | None) -> str:
    if arch:
        return arch
    from cuinfer.runtime.device import device_info, gpu_available

    return device_info().arch if gpu_available() else "sm_90a"


def _first_line(exc: BaseException) -> str:
    """The first line of an error worth printing: a compiler log's first error line, not its 'failed to compile X:'
    header (whose details start on the next line)."""
    log = [line.strip() for line in (getattr(exc, "log", "") or "").splitlines() if line.strip()]
    for line in log:
        if "error" in line.lower():
            return line
    if log:
        return log[0]
    text = [line.strip() for line in str(exc).splitlines() if line.strip()]
    informative = [line for line in text if not line.endswith(":")]
    if informative:
        return informative[0]
    return f"{text[0]} (no compiler log)" if text else type(exc).__name__


def cmd_kernels(args: argparse.Namespace) -> int:
    from cuinfer.jit import CacheTrustError, cache_tiers, get_compiled
    from cuinfer.jit.registry import specs

    arch = _target_arch(args.arch)
    todo = [s for s in specs(args.group) if s.builds_for(arch)]  # (the sm_90a-only kernels on sm_90a only)
    if not args.report:
        for s in todo:
            print(s.name)
        sys.stdout.flush()
        return 0
    cache_tiers()  # an untrusted cache is one error, not one per module
    print(f"resource report for {arch} ({len(todo)} modules; compiling any that are not cached)")
    print(f"{'module':34s} {'kernel':44s} {'regs':>5s} {'spill st/ld':>11s} {'stack':>6s} {'smem':>6s} "
          f"{'dyn smem':>8s}")  # fmt: skip
    worst = failed = 0
    for s in todo:
        try:
            mod = get_compiled(s, arch)
        except CacheTrustError:
            raise
        except Exception as exc:
            failed += 1
            print(f"{s.name:34s} FAILED: {_first_line(exc)}", flush=True)
            continue
        names = {v: k for k, v in mod.lowered.items()}
        dyn = str(s.smem_bytes) if s.smem_bytes else "-"
        for sym, r in sorted(mod.resources.items()):
            kname = names.get(sym, sym).replace("cuinfer::", "")
            kname = kname if len(kname) <= 44 else kname[:41] + "..."
            print(f"{s.name:34s} {kname:44s} {r.registers:5d} {r.spill_stores:5d}/{r.spill_loads:<5d} "
                  f"{r.stack_frame:6d} {r.smem_static:6d} {dyn:>8s}")  # fmt: skip
            worst = max(worst, r.spill_stores + r.spill_loads)
    print("smem: static shared memory per CTA (ptxas); dyn smem: dynamic shared memory of the launch configuration "
          "the module is built for ('-': decided at launch)")  # fmt: skip
    sys.stdout.flush()
    return 1 if worst or failed else 0


def _warm_one(fut, spec) -> tuple[str, str, object]:
    """(kind, status line, result) of one warmup future; kind is compiled / cached / failed."""
    try:
        r = fut.result()
    except Exception as exc:  # report every failure, keep going
        return "failed", f"FAILED: {_first_line(exc)}", None
    if not r.compiled:
        return "cached", "cached (compiled by another process just now)" if r.waited else "cached", r
    status = f"compiled {r.module.compile_seconds:5.2f}s"
    return "compiled", status + ("" if r.directory else ", NOT STORED"), r


def cmd_warmup(args: argparse.Namespace) -> int:
    from cuinfer.jit import cache
    from cuinfer.jit.registry import specs

    arch = _target_arch(args.arch)
    todo = [s for s in specs(args.group) if s.builds_for(arch)]
    jobs = args.jobs or max(1, os.cpu_count() or 1)
    tiers = cache.cache_tiers()
    print(f"warming {len(todo)} kernel modules for {arch} with {jobs} threads; cache: {_describe_tiers(tiers)}",
          flush=True)  # fmt: skip
    start = time.perf_counter()
    counts = {"compiled": 0, "cached": 0, "failed": 0}
    stored: dict[str, int] = {}
    unstored: dict[str, int] = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {pool.submit(cache.fetch, s, arch): s for s in todo}
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            s = futures[fut]
            kind, status, r = _warm_one(fut, s)
            counts[kind] += 1
            if kind == "compiled" and r.directory:
                stored[r.directory] = stored.get(r.directory, 0) + 1
            elif kind == "compiled":
                unstored[r.store_error] = unstored.get(r.store_error, 0) + 1
            print(f"[{i:3d}/{len(todo)}] {s.name:40s} {status}", flush=True)
    print(f"done in {time.perf_counter() - start:.1f}s: {counts['compiled']} compiled, {counts['cached']} already "
          f"cached, {counts['failed']} failed")  # fmt: skip
    for directory, n in stored.items():
        print(f"stored {n} in {directory}")
    for why, n in unstored.items():
        print(f"could not store {n} compiled modules: {why}")
    nowhere = bool(unstored) and not stored
    if nowhere:
        hint = "(CUINFER_CACHE_DIR, or XDG_CACHE_HOME behind a read-only CUINFER_CACHE_DIR)"
        print(f"nothing could be stored: later processes compile again. Make a cache directory writable {hint}",
              file=sys.stderr)  # fmt: skip
    sys.stdout.flush()
    return 1 if counts["failed"] or nowhere else 0


def cmd_bundle(args: argparse.Namespace) -> int:
    from cuinfer.jit import bundle

    try:
        if args.action == "export":
            manifest, digest = bundle.export_bundle(args.file, arch=args.arch)
            size = os.path.getsize(args.file)
        else:
            report = bundle.import_bundle(args.file, sha256=args.sha256, force=args.force)
    except OSError as exc:  # the bundle file or a cache directory: say which, no traceback
        raise bundle.BundleError(f"{args.action} {args.file}: {exc}") from exc
    if args.action == "export":
        print(f"exported {len(manifest['entries'])} cache entries ({size / 1e6:.1f} MB) to {args.file}")
        print(f"toolchain {manifest['toolchain']}, cuinfer {manifest['cuinfer']}")
        print(f"sha256 {digest}  (check it on import: cuinfer bundle import {args.file} --sha256 {digest})")
        return 0
    m = report.manifest
    print(f"verified {len(m['entries'])} entries of {args.file} (toolchain {m['toolchain']}, cuinfer {m['cuinfer']})")
    print(f"imported {report.imported} into {report.directory}, {report.present} already there")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from cuinfer.demo import run_demo

    return run_demo(cpu=args.cpu)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cuinfer", description="cuinfer: attention kernels for LLM serving")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="GPU, arch, toolchain versions, kernel cache").set_defaults(fn=cmd_info)
    p = sub.add_parser("demo", help="run a small serving-shaped workload and check it against the reference")
    p.add_argument("--cpu", action="store_true", help="use the CPU reference backend even when a GPU is present")
    p.set_defaults(fn=cmd_demo)
    arch_help = "target, e.g. sm_80, sm_90a, sm_100a (default: this GPU's, or sm_90a without one)"
    p = sub.add_parser("kernels", help="list the kernel specialisations, or report their resources")
    p.add_argument("--report", action="store_true", help="registers, spills, stack and shared memory per kernel")
    p.add_argument("--arch", type=_arch, help=arch_help)
    p.add_argument("--group", type=_group, help="one kernel group (merge, decode, prefill, prefill_sm90, utility)")
    p.set_defaults(fn=cmd_kernels)
    p = sub.add_parser("warmup", help="pre-compile kernel specialisations into the disk cache (for deployments)")
    p.add_argument("--arch", type=_arch, help=arch_help)
    p.add_argument("--group", type=_group, help="one kernel group (merge, decode, prefill, prefill_sm90, utility)")
    p.add_argument("--jobs", type=_jobs, default=0, help="compiler threads (default 0: one per CPU)")
    p.set_defaults(fn=cmd_warmup)
    p = sub.add_parser("bundle", help="move a warmed kernel cache to another machine (docs/cache.md)")
    actions = p.add_subparsers(dest="action", required=True)
    e = actions.add_parser("export", help="write the cache's entries and a manifest to a tar file (.tar.gz: gzip)")
    e.add_argument("file")
    e.add_argument("--arch", type=_arch, help="only the entries for this target")
    e.set_defaults(fn=cmd_bundle)
    i = actions.add_parser("import", help="verify a bundle, then store its entries in this machine's cache")
    i.add_argument("file")
    i.add_argument("--sha256", help="refuse the bundle unless its SHA-256 is this (printed by export)")
    i.add_argument("--force", action="store_true", help="import a bundle of another toolchain or cuinfer version")
    i.set_defaults(fn=cmd_bundle)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"cuinfer: warning: {message}", file=sys.stderr)


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a captured stdout without a file descriptor
        pass


def main(argv: list[str] | None = None) -> int:
    from cuinfer.errors import CuinferError
    from cuinfer.jit.cache import cache_mode

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        cache_mode()
    except ValueError as exc:
        parser.error(str(exc))
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return int(args.fn(args))
        except BrokenPipeError:
            _quiet_stdout()
            return 141
        except CuinferError as exc:
            print(f"cuinfer {args.cmd}: error: {exc}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
