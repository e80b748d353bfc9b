"""``python -m bench``: run the benchmark suites (GPU machine), or list the cases / redraw results (anywhere).

    python -m bench {merge,decode,prefill,plan,all} [--cases D1,D5] [--iters 30] [--out bench/results]
                    [--no-peers] [--quick]
    python -m bench warm                 # only compile the peers' kernels (FlashInfer JIT: minutes, cached)
    python -m bench list                 # the standard cases and their targets
    python -m bench plot FILE.json ...   # table + PNG again from saved results (no GPU needed)

Each suite prints a progress line per measurement, then (after all suites) a table per suite; it writes
``<out>/<suite>-<timestamp>.json``, ``<out>/<suite>-latest.json`` (rewritten after every measurement, so a run
cut short still leaves its results) and a PNG bar chart per suite.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
import traceback
from pathlib import Path

from bench import cases as cases_mod
from bench.suite import SUITES

METHOD_MIN_ITERS = 20  # docs/benchmarks.md: median of >= 20 timed runs
COMMANDS = (*SUITES, "all", "warm", "list", "plot")
DEFAULT_OUT = Path("bench/results")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="cuinfer benchmark suites beside FlashInfer and torch SDPA (method and cases: docs/benchmarks.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="cases: " + ", ".join(cases_mod.known_ids()),
    )
    p.add_argument("command", choices=COMMANDS, help="a suite, all of them, warm (compile peers), list, or plot")
    p.add_argument("files", nargs="*", help="plot: result JSON files to redraw")
    p.add_argument("--cases", type=_case_list, default=None, help="comma-separated case ids, e.g. D1,D5,P4")
    p.add_argument("--iters", type=int, default=30, help=f"timed runs per measurement (>= {METHOD_MIN_ITERS})")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs before timing (default 5)")
    p.add_argument("--plan-iters", type=int, default=50, help="host plan() calls timed per measurement")
    p.add_argument("--out", type=Path, default=None,
                   help=f"directory for JSON and PNG (default {DEFAULT_OUT}; plot: beside each JSON)")  # fmt: skip
    p.add_argument("--no-peers", dest="peers", action="store_false", help="cuinfer only (no FlashInfer / SDPA)")
    p.add_argument("--quick", action="store_true", help="smoke run: 5 timed runs, small roofline (not a result)")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG plots")
    return p


def _case_list(text: str) -> list[str]:
    ids = [x.strip() for x in text.split(",") if x.strip()]
    if not ids:
        raise argparse.ArgumentTypeError(f"--cases needs at least one case id, got {text!r}")
    known = {k.lower() for k in cases_mod.known_ids()}
    unknown = [i for i in ids if i.lower() not in known]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown case id(s) {', '.join(unknown)}; known: {', '.join(cases_mod.known_ids())}"
        )
    return ids


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.quick:
        args.iters, args.warmup, args.plan_iters = 5, 2, 20
    elif args.iters < METHOD_MIN_ITERS:
        p.error(f"--iters {args.iters} is below the docs/benchmarks.md method's {METHOD_MIN_ITERS} timed runs; "
                "use --quick for a smoke run")  # fmt: skip
    if args.warmup < 1:
        p.error(f"--warmup must be >= 1 (the first run may compile), got {args.warmup}")
    if args.command == "plot" and not args.files:
        p.error("plot needs one or more result JSON files, e.g. bench/results/decode-latest.json")
    if args.command != "plot" and args.files:
        p.error(f"unexpected arguments {args.files} for {args.command!r} (only plot takes files)")
    return args


def suites_for(args: argparse.Namespace) -> list[tuple[str, tuple]]:
    """(suite, selected cases) to run, skipping suites none of whose cases were selected."""
    names = SUITES if args.command in ("all", "warm") else (args.command,)
    out = [(n, cases_mod.select(n, args.cases)) for n in names]
    return [(n, c) for n, c in out if c]


# ------------------------------------------------------------------------------------------------ commands


def cmd_list() -> int:
    for suite in SUITES:
        print(f"[{suite}]")
        for c in cases_mod.ALL_CASES[suite]:
            targets = [getattr(c, k).text for k in ("target", "target_fa2", "target_hopper") if hasattr(c, k)]
            print(f"  {c.id:<9} {c.describe():<42} seed {c.seed:<4} target {' / '.join(targets)}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from bench import report
    from bench.suite import spec_of

    for f in args.files:
        data, ms = report.load(Path(f))
        spec = spec_of(data["suite"])
        rows = report.summarize(spec, [c["id"] for c in data["cases"]], {c["id"]: c["desc"] for c in data["cases"]}, ms)
        print(report.format_table(spec, rows, ms))
        png = (args.out / Path(f).name if args.out else Path(f)).with_suffix(".png")
        if args.plot and report.plot(spec, data, ms, png):
            print(f"plot: {png}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from bench import peers, report
    from bench.suite import Context, first_line, spec_of
    from bench.timing import CudaTimer, NoDeviceError, measure_roofline

    out = args.out or DEFAULT_OUT
    selected = suites_for(args)
    if not selected:
        print(f"no case of {args.command!r} among --cases {','.join(args.cases)}", file=sys.stderr)
        return 2
    try:
        timer = CudaTimer()
    except NoDeviceError as ex:
        print(f"python -m bench {args.command}: {ex}", file=sys.stderr)
        return 2
    env = peers.environment(args.peers)
    print(f"device: {env['gpu']} ({env['sms']} SMs), torch {env['torch']}, CUDA {env['cuda']}, "
          f"cuinfer {env['cuinfer']}, FlashInfer {env['flashinfer']}", flush=True)  # fmt: skip
    ctx = Context(iters=args.iters, warmup=args.warmup, plan_iters=args.plan_iters, quick=args.quick,
                  peers=args.peers, timer=timer)  # fmt: skip
    if args.command == "warm":
        return _warm_only(ctx, selected)
    if any(n != "plan" for n, _ in selected):
        try:
            ctx.roofline = measure_roofline(timer, quick=args.quick)
            print(f"roofline: copy {ctx.roofline.copy_gbps:.0f} GB/s (read + written), bf16 matmul "
                  f"{ctx.roofline.matmul_tflops:.0f} TFLOP/s", flush=True)  # fmt: skip
        except Exception as ex:  # noqa: BLE001 - the suites still run; only the % columns stay empty
            print(f"roofline: not measured ({first_line(ex)}); % of copy / matmul columns show –", flush=True)
    run_args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "files"}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tables, tally, crashed = [], {"pass": 0, "miss": 0, "error": 0}, []
    for name, cases in selected:
        spec = spec_of(name)
        mod = sys.modules[f"bench.{name}"]
        ctx.measurements = []
        started = time.time()

        def save(complete: bool, spec=spec, cases=cases, started=started) -> dict:
            data = report.payload(spec, cases=list(cases), measurements=ctx.measurements,
                                  roofline=ctx.roofline.as_dict() if ctx.roofline else None, env=env, args=run_args,
                                  started=started)  # fmt: skip
            data["complete"], data["quick"] = complete, args.quick
            report.write_json(out, data, stamp)
            return data

        ctx.checkpoint = lambda: save(False)
        complete = True
        try:
            if args.peers:
                print(f"[{name}] compiling / warming peer kernels", flush=True)
                mod.warm(ctx, cases)
            mod.run(ctx, cases)
        except Exception:  # noqa: BLE001 - a harness bug: keep what was measured, say where it broke
            print(f"[{name}] suite stopped by an unexpected error:\n{traceback.format_exc()}", file=sys.stderr)
            complete = False
            crashed.append(name)
        ctx.checkpoint = None
        data = save(complete)
        ms = ctx.measurements
        tables.append(report.format_table(spec, data["summary"], ms))
        for r in data["summary"]:
            tally["error" if r["status"] != "ok" else ("pass" if r["pass"] else "miss")] += 1
        print(f"[{name}] results: {out}/{name}-{stamp}.json, {out}/{name}-latest.json", flush=True)
        if args.plot:
            png = report.plot(spec, data, ms, out / f"{name}-{stamp}.png")
            if png:
                shutil.copyfile(png, out / f"{name}-latest.png")
                print(f"[{name}] plot: {png}", flush=True)
    print()
    print("\n\n".join(tables))
    print(f"\ncuinfer rows: {tally['pass']} pass, {tally['miss']} miss, {tally['error']} error / not implemented"
          + ("   (--quick: smoke run, not a result)" if args.quick else ""))  # fmt: skip
    if crashed:
        print(f"suites stopped early by a harness error (see above): {', '.join(crashed)}", file=sys.stderr)
    return 1 if crashed else 0


def _warm_only(ctx, selected) -> int:
    import importlib

    if not ctx.peers:
        print("warm compiles the peers' kernels; with --no-peers there is nothing to do")
        return 0
    t0 = time.perf_counter()
    for name, cases in selected:
        print(f"[{name}] compiling / warming peer kernels", flush=True)
        importlib.import_module(f"bench.{name}").warm(ctx, cases)
    print(f"warm: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "list":
        return cmd_list()
    if args.command == "plot":
        return cmd_plot(args)
    return cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
