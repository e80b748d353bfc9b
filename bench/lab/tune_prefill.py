"""Tuning sweep for the FA2-class prefill kernel on P1-P6: configurations x cases -> TFLOP/s, in one GPU call (lab
code: it picks the tile policy and checks kernel changes; not a standard suite).

python -m bench.lab.tune_prefill            cuinfer configurations (table), outputs checked against the first
python -m bench.lab.tune_prefill --fi       FlashInfer fa2 on the same cases (waits for --fi-warm's JIT, up to a limit)
python -m bench.lab.tune_prefill --fi-warm  JIT-compile FlashInfer's fa2 prefill modules (run it in the background)

A configuration is ``variant:query_tile,kv_tile,stages[,ctas_per_block]`` (``--configs "new:128,64,2;ab:128,64,2"``,
or $CUINFER_TUNE_CONFIGS), its tiles forced through plan(tile_sizes=...). Variants: ``new`` (the kernel of this
checkout), ``ab`` (the same built with the ``-D`` options of ``--defines`` / $CUINFER_TUNE_DEFINES: the switches of a
kernel change under test; the shipped kernel has none) and ``win<k>`` (the kernel of this checkout on a planner
variant: the items in locality windows of k rounds). Every module is compiled up front in parallel processes into the
disk cache. Timing is the docs/benchmarks.md method: CUDA events, L2 flushed (512 MB write) before every timed run,
median of ``ROUNDS x ITERS`` runs taken round-robin over the configurations (drift hits them alike);
$CUINFER_TUNE_ROUNDS sets the rounds. Findings: docs/results/lab-findings.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np

from bench import inputs
from bench.cases import PREFILL_CASES, prefill_flops

VARIANTS = ("new", "ab", "win<k>")
# (variant, (query tile, kv tile, stages[, CTAs per block])); the first is the reference the others' outputs are
# compared with.
CONFIGS = (("new", (128, 64, 2)), ("new", (128, 64, 2, 1)), ("new", (128, 32, 2)))
ROUNDS, ITERS, WARMUP = int(os.environ.get("CUINFER_TUNE_ROUNDS", "3")), 8, 2
ARCH = os.environ.get("CUINFER_TUNE_ARCH", "sm_90a")
FI_MARKER = "/tmp/cuinfer-tune-fi-warm.done"


def _name(variant: str, tiles: tuple) -> str:
    cv = {0: "", 1: "cv", 2: "nocv"}[tiles[4]] if len(tiles) > 4 else ""
    return f"{variant} q{tiles[0]}k{tiles[1]}s{tiles[2]}" + (f"g{tiles[3]}" if len(tiles) > 3 else "") + cv


def _tile_sizes(tiles: tuple) -> tuple:
    """plan()'s tile_sizes of a configuration: a fifth entry 1 / 2 forces fp8's CTA conversion on / off (0: the
    policy's)."""
    convert = {1: True, 2: False}.get(tiles[4]) if len(tiles) > 4 else None
    return tiles[:4] + ((convert,) if convert is not None else ())


def spec_for(key, variant: str, defines: tuple[str, ...] = ()):
    """The KernelSpec of ``key`` for a variant (``ab``: built with ``defines``, under a name of its own)."""
    from bench.lab.harness import ab_spec
    from cuinfer.prefill.specs import prefill_spec

    spec = prefill_spec(key)
    if variant == "ab":
        if not defines:
            raise ValueError("variant 'ab' needs --defines (or $CUINFER_TUNE_DEFINES)")
        return ab_spec(spec, defines)
    return spec


def keys(tiles: tuple) -> list:
    """The causal bf16 d128 kernel keys of P1-P6 (ragged, paged) with these tiles: the CTAs per block of the tiles'
    fourth entry, else the policy's (a fifth entry, fp8's conversion: none; those compile when first run)."""
    from cuinfer.prefill.policy import block_groups
    from cuinfer.prefill.specs import PrefillKernelKey
    from cuinfer.prefill.tiles import tile_config
    from cuinfer.variants import lookup, render

    chain = render((lookup("causal"),))
    out = []
    if len(tiles) > 4:
        return []
    for paged in (False, True):
        cfg = tile_config(tiles[0], tiles[1], 128, *tiles[2:])
        if len(tiles) < 4:
            cfg = dataclasses.replace(cfg, groups=block_groups(cfg, 128, 128, paged))
        out.append(PrefillKernelKey("bfloat16", "bfloat16", 128, 128, cfg, paged, chain))
    return out


def _compile(job) -> tuple[bool, str]:
    from cuinfer.jit import get_compiled

    variant, tiles, defines = job
    out = []
    try:
        for key in keys(tiles):
            mod = get_compiled(spec_for(key, variant, defines), ARCH)
            r = next(iter(mod.resources.values()))
            out.append(
                f"{'paged' if key.paged else 'ragged'} {r.registers} regs, spills {r.spill_stores}/{r.spill_loads}"
            )
    except Exception as ex:  # noqa: BLE001 - a configuration that does not build is dropped, with the reason
        return False, f"{_name(variant, tiles)}: FAILED {str(ex)[:2000]}"
    return True, f"{_name(variant, tiles)}: " + "; ".join(out)


def configs(text: str | None = None) -> list[tuple[str, tuple]]:
    """CONFIGS, or those of ``text`` ("new:128,64,2;ab:128,64,2"; default $CUINFER_TUNE_CONFIGS)."""
    text = os.environ.get("CUINFER_TUNE_CONFIGS") if text is None else text
    if not text:
        return list(CONFIGS)
    out = []
    for c in text.split(";"):
        variant, _, tiles = c.partition(":")
        if variant not in ("new", "ab") and not (variant.startswith("win") and variant[3:].isdigit()):
            raise ValueError(f"configuration {c!r}: the variant is one of {', '.join(VARIANTS)}")
        t = tuple(int(x) for x in tiles.split(","))
        if len(t) not in (3, 4, 5):
            raise ValueError(f"configuration {c!r}: give variant:query_tile,kv_tile,stages[,ctas_per_block[,cv]]")
        out.append((variant, t))
    return out


def precompile(cfgs, defines: tuple[str, ...] = ()) -> list:
    """Build every configuration into the disk cache in parallel processes; returns those that built."""
    t0 = time.perf_counter()
    ok = []
    jobs = [(v, t, defines) for v, t in cfgs]
    with ProcessPoolExecutor(max_workers=min(len(cfgs), os.cpu_count() or 4), mp_context=get_context("spawn")) as ex:
        for cfg, (built, line) in zip(cfgs, ex.map(_compile, jobs), strict=True):
            print("  " + line)
            if built:
                ok.append(cfg)
    print(f"compiled {len(cfgs)} configurations in {time.perf_counter() - t0:.1f} s", flush=True)
    return ok


def window_work(k: int):
    """Planner variant ``win<k>`` (a ``WorkFn``): the planner's items in locality order (head major, then request and
    query tile), cut into windows of k rounds of P items; each window's items, largest first by the cost model, are
    dealt in a snake over the CTAs sorted by their load so far. The KV working set of a round is a few (request,
    head) pairs, as in FlashInfer's grid."""

    def work(plan, p: int, default):
        from bench.lab.harness import natural_index, reassigned
        from bench.plan_host import item_costs

        base = default()
        qo = plan.qo_lens if plan.qo_lens is not None else np.diff(plan.qo_indptr)
        ic = item_costs(base, qo, plan.num_qo_heads // plan.num_kv_heads, plan.config.tile_q)
        n = base.n_items
        o = np.lexsort((-ic, natural_index(base) // (k * p)))
        loads = np.zeros(p)
        owner = np.empty(n, dtype=np.int64)
        for s0 in range(0, n, k * p):
            m = min(k * p, n - s0)
            q, i = np.divmod(np.arange(m), p)
            c = np.argsort(loads, kind="stable").take(np.where(q % 2 == 0, i, p - 1 - i))
            owner[o[s0 : s0 + m]] = c
            loads += np.bincount(c, weights=ic[o[s0 : s0 + m]], minlength=p)
        rank = np.empty(n, dtype=np.int64)
        rank[o] = np.arange(n)
        return reassigned(base, owner, rank, f"win{k}")

    return work


def _cuinfer_runner(inp, variant: str, tiles: tuple, defines: tuple[str, ...] = ()):
    from bench.lab.harness import planned_prefill

    work = window_work(int(variant[3:])) if variant.startswith("win") else None
    w, run = planned_prefill(
        inp, tile_sizes=_tile_sizes(tiles), spec_of=lambda key: spec_for(key, variant, defines), work=work
    )
    wp = w._plan.work
    info = f"{wp.num_ctas} CTAs, {wp.n_items} items ({wp.assign_mode}), {wp.n_merge} merged rows"
    return run, info


def _time_round_robin(timer, runs: list, rounds: int, iters: int) -> list[list[float]]:
    torch = timer._torch
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for i, fn in enumerate(runs):
            samples[i] += list(_samples(timer, torch, fn, iters))
    return samples


def _samples(timer, torch, fn, iters: int):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    for _ in range(iters):
        timer.flush_l2()
        timer.head_start()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        yield start.elapsed_time(end) * 1e-3


def tune(case_ids: list[str] | None, cfgs: list, defines: tuple[str, ...] = ()) -> None:
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    print(f"{torch.cuda.get_device_name(0)}; configurations: {', '.join(_name(*c) for c in cfgs)}", flush=True)
    cfgs = precompile(cfgs, defines)
    names = [_name(v, t) for v, t in cfgs]
    timer = CudaTimer()
    table: dict[str, dict[str, float]] = {n: {} for n in names}
    for case in PREFILL_CASES:
        if case_ids and case.id not in case_ids:
            continue
        inp = inputs.prefill_inputs(case)
        flops = prefill_flops(inp.lens, inp.lens, case.shape, case.causal)
        runs, ref = [], None
        for (variant, tiles), name in zip(cfgs, names, strict=True):
            run, info = _cuinfer_runner(inp, variant, tiles, defines)
            out = run().float()
            torch.cuda.synchronize()
            if ref is None:
                ref = out
                check = "reference"
            else:
                diff = (out - ref).abs()
                check = f"max |diff| {diff.max().item():.2e} (mean {diff.mean().item():.1e})"
                if not torch.isfinite(out).all() or diff.max().item() > 0.05:
                    check += "  <-- MISMATCH"
            print(f"  {case.id} {name}: {info}; {check}", flush=True)
            runs.append(run)
        samples = _time_round_robin(timer, runs, ROUNDS, ITERS)
        for name, ts in zip(names, samples, strict=True):
            table[name][case.id] = flops / statistics.median(ts) / 1e12
        best = max(names, key=lambda n: table[n][case.id])
        print(f"{case.id}: " + ", ".join(f"{n} {table[n][case.id]:.0f}" for n in names) + f"  (best {best})",
              flush=True)  # fmt: skip
        del runs, ref
        inputs.free()
    ids = [c.id for c in PREFILL_CASES if not case_ids or c.id in case_ids]
    width = max(len(n) for n in names)
    print("\nTFLOP/s (median, L2 flushed)")
    print(" " * width + "".join(f"{i:>7}" for i in ids))
    for n in names:
        print(n.ljust(width) + "".join(f"{table[n].get(i, float('nan')):7.0f}" for i in ids))


def _fi_prepared(inp):
    from bench.prefill import prepare_fi

    return prepare_fi(inp, "fa2")


def fi_warm() -> None:
    """JIT-compile FlashInfer's fa2 modules (ragged and paged) on a tiny batch; then drop the marker file."""
    from bench.cases import Lengths

    t0 = time.perf_counter()
    for layout in ("ragged", "paged"):
        case = next(c for c in PREFILL_CASES if c.layout == layout)
        tiny = dataclasses.replace(case, id="warm", lengths=Lengths("const", 2, 200))
        _fi_prepared(inputs.prefill_inputs(tiny)).run()
        print(f"FlashInfer fa2 {layout} ready after {time.perf_counter() - t0:.0f} s", flush=True)
    with open(FI_MARKER, "w") as fh:
        fh.write("ok\n")


def fi(case_ids: list[str] | None, wait_s: float) -> None:
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    deadline = time.monotonic() + wait_s
    while not os.path.exists(FI_MARKER) and time.monotonic() < deadline:
        time.sleep(1.0)
    if not os.path.exists(FI_MARKER):
        print(f"FlashInfer JIT not ready after {wait_s:.0f} s: no FI rows", flush=True)
        return
    timer = CudaTimer()
    for case in PREFILL_CASES:
        if case_ids and case.id not in case_ids:
            continue
        inp = inputs.prefill_inputs(case)
        flops = prefill_flops(inp.lens, inp.lens, case.shape, case.causal)
        prep = _fi_prepared(inp)
        ts = _time_round_robin(timer, [prep.run], ROUNDS, ITERS)[0]
        print(f"{case.id}: FI fa2 {flops / statistics.median(ts) / 1e12:.0f} TFLOP/s", flush=True)
        del prep
        torch.cuda.synchronize()
        inputs.free()


def _case_id(text: str) -> str:
    """A case id as PREFILL_CASES spells it, from any case ("p4-E4M3" -> "P4-e4m3")."""
    ids = {c.id.upper(): c.id for c in PREFILL_CASES}
    return ids.get(text.strip().upper(), text.strip())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.tune_prefill", description=__doc__.splitlines()[0])
    ap.add_argument("--fi", action="store_true", help="time FlashInfer fa2 instead of the cuinfer configurations")
    ap.add_argument("--fi-warm", action="store_true", help="only JIT-compile FlashInfer's fa2 modules")
    ap.add_argument("--fi-wait", type=float, default=60.0, help="seconds --fi waits for --fi-warm (default 60)")
    ap.add_argument("--cases", default=None, help="comma-separated case ids (default: P1-P6)")
    ap.add_argument(
        "--configs", default=None, help="variant:q,kv,stages[,groups];... (default $CUINFER_TUNE_CONFIGS, else CONFIGS)"
    )
    ap.add_argument(
        "--defines",
        default=os.environ.get("CUINFER_TUNE_DEFINES", ""),
        help="-D options of the ab variant, as --defines='-DNAME[=value] ...' ($CUINFER_TUNE_DEFINES)",
    )
    args = ap.parse_args(argv)
    args.cases = None if args.cases is None else [_case_id(c) for c in args.cases.split(",")]
    args.defines = tuple(args.defines.split())
    try:
        args.configs = configs(args.configs)
    except ValueError as ex:
        ap.error(str(ex))
    if any(v == "ab" for v, _ in args.configs) and not args.defines:
        ap.error("the ab variant needs --defines (or $CUINFER_TUNE_DEFINES), e.g. --defines=-DCUINFER_MY_SWITCH")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.fi_warm:
        fi_warm()
    elif args.fi:
        fi(args.cases, args.fi_wait)
    else:
        tune(args.cases, args.configs, args.defines)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
