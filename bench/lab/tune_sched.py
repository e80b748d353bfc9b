"""Scheduling and per-item cost experiments on the standard cases (GPU machine; lab code, not a standard suite).

python -m bench.lab.tune_sched EXPERIMENT [EXPERIMENT ...] [--cases IDS] [--rounds N] [...]   (default: prefill decode)

trace    P1/P2/P3/P6, the prefill kernel built with -DCUINFER_TRACE: per item its start and end (global timer) and
         the SM clock at its phases; prints the per-item cost fit (fixed + per KV tile), the phases, the CTAs' end
         spread and busy fraction, for the planner's assignment and for LPT; saves $OUT/trace.npz.
cut      D5-D8 and D1: the default decode plan against the lane cut forced on every batch.
decode   D1-D4 split / unsplit, the L2 flushed by a write (the docs/benchmarks.md method) and by a write then a read.
evict    --cases (D1-D9): the decode kernel's K/V copies forced L2 evict-first against forced evict-normal.
dtrace   --cases (D1-D5), the decode kernel built with -DCUINFER_DECODE_TRACE: per-CTA phase medians of five runs
         under a dirty and a clean L2, the CTAs' exit spread, for the variants --dtrace (DTRACE_VARIANTS), timed in
         alternating rounds; plus the floors of the timer (near-empty kernel, torch.sum over the case's bytes).
dab      --cases (D1-D9): the default decode kernel against a build with --defines (the switches of a kernel change
         under test; the shipped kernels have none), same plans, alternating rounds.
dcfg     --cases (D1-D10): decode configurations --dcfg ("default;wkv,wd,stages[,cap];...": tile, stages, a cap on the
         CTAs per SM; "fp8:wkv,wd,stages[,cap]" for the fp8 cases), "lanecut" (the lane cut on every batch), "ctacut"
         (equal stretches of KV tiles per CTA), "bf16cost" / "costx<f>" (planned under the cost model with every term
         but beta times f = 1 (bf16's), 2, 3, 4, 6), "gammax<f>" (those times 2, gamma times f = 3, 4 (fp8's), 6,
         8), "fp8gamma<g>" / "fp8piece<g>" (FP8_COST with gamma or piece_gamma g: 128, 192, 320, 384 / 32, 128, 192),
         "fp8prev" (FP8_COST before 2026-12-04), "ctas<n>" (the planner on n = 240, 248, 256 CTAs instead of the
         occupancy's grid);
         a case id with "-e4m3" added runs that case over an e4m3 cache.
pool     --cases (P1-P6): each shared-tail share of --shares beside FlashInfer fa2 when importable, alternating rounds.
prefill  --cases (P1-P6): the planner's assignment against list schedules of its items (--assign: default, list,
         lpt, lptfit), and P2/P5 with half the heads.

Options default to the environment variables of earlier runs (CUINFER_TUNE_CASES, CUINFER_TUNE_ROUNDS,
CUINFER_DTRACE, CUINFER_DAB_DEFINES, CUINFER_DCFG, CUINFER_POOL_SHARES, CUINFER_TUNE_ASSIGN). Kernels, configurations
and plans are the tool's own (bench/lab/harness.py); nothing of cuinfer is patched. Findings:
docs/results/lab-findings.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

import numpy as np

from bench.lab.harness import (
    TraceBuffer,
    ab_spec,
    item_tiles,
    list_schedule,
    natural_index,
    planned_decode,
    planned_prefill,
    prefill_trace,
    reassigned,
)

EXPERIMENTS = ("trace", "cut", "decode", "dtrace", "dab", "dcfg", "evict", "pool", "prefill")
ASSIGNMENTS = ("default", "list", "lpt", "lptfit")
# dtrace variants: LabDecode arguments on top of the trace build ("ab": the trace build with --defines too)
DTRACE_VARIANTS = ("base", "nosplit", "s2", "s4", "ab")
PREFILL_TRACE_WORDS = 12  # u64 per item (kernel_src/debug/trace.cuh)


# ---- kernels and work plans of the experiments ----------------------------------------------------------------------


def decode_trace_spec(key, defines: tuple[str, ...] = ()):
    """The decode kernel of ``key`` built with -DCUINFER_DECODE_TRACE (and ``defines``)."""
    from cuinfer.decode.specs import decode_spec

    return ab_spec(decode_spec(key), ("-DCUINFER_DECODE_TRACE", *defines), "dtrace")


def prefill_trace_spec(key):
    """The prefill kernel of ``key`` built with -DCUINFER_TRACE."""
    from cuinfer.prefill.specs import prefill_spec

    return ab_spec(prefill_spec(key), ("-DCUINFER_TRACE",), "trace")


def decode_ab_spec_of(defines: tuple[str, ...]):
    """``spec_of`` of a decode A/B build with ``defines``."""
    from cuinfer.decode.specs import decode_spec

    return lambda key: ab_spec(decode_spec(key), defines)


def dtrace_variant(name: str, defines: tuple[str, ...] = ()) -> dict:
    """``planned_decode`` arguments of a ``dtrace`` variant: the trace build (``ab``: with ``defines``), planned
    unsplit (``nosplit``) or with 2 / 4 pipeline stages (``s2``, ``s4``; the Llama shape's tensor-core config)."""
    if name not in DTRACE_VARIANTS:
        raise ValueError(f"dtrace variant {name!r}: one of {', '.join(DTRACE_VARIANTS)}")
    if name == "ab" and not defines:
        raise ValueError("dtrace variant 'ab' needs --defines")
    extra = defines if name == "ab" else ()
    lab: dict = {"spec_of": lambda key: decode_trace_spec(key, extra), "use_tensor_cores": True}
    if name == "nosplit":
        lab["fixed_split_size"] = 1 << 20
    if name in ("s2", "s4"):
        from cuinfer.decode.policy import decode_config

        lab["config"] = dataclasses.replace(decode_config(4, 128, use_tensor_cores=True), stages=int(name[1]))
    return lab


def decode_variant(spec: str):
    """A decode configuration from ``"warps_kv,warps_d,stages[,ctas_per_sm_cap]"`` (the tensor-core kernel at the
    Llama shape; ``"fp8:..."`` the same for an fp8 cache: FP8_WARP_TOKENS tokens per warp): a ``DecodeConfig`` whose
    ``min_blocks`` (the CTAs per SM the kernel is compiled and the grid sized for) honours the cap, or None for
    ``"default"`` (the policy's, for the case's KV type)."""
    from cuinfer.decode import policy as pol

    if spec == "default":
        return None
    fp8 = spec.startswith("fp8:")
    if fp8:
        spec = spec[len("fp8:") :]
    parts = [int(x) for x in spec.split(",")]
    if len(parts) == 5:
        raise ValueError(
            f"decode configuration {spec!r}: the item chunk (fifth field) is fixed in the kernel now (its "
            "-DCUINFER_DECODE_ITEM_CHUNK switch is gone); give warps_kv,warps_d,stages[,cap]"
        )
    if len(parts) not in (3, 4):
        raise ValueError(f"decode configuration {spec!r}: give warps_kv,warps_d,stages[,cap]")
    wkv, wd, stages, *rest = parts
    cap = rest[0] if rest else 0

    class Capped(pol.DecodeConfig):
        @property
        def min_blocks(self) -> int:
            m = super().min_blocks
            return min(m, cap) if cap else m

    base = pol.decode_config(4, 128, use_tensor_cores=True, kv_itemsize=1 if fp8 else 2)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    tile = (pol.FP8_WARP_TOKENS if fp8 else 16) * wkv
    fields.update(threads=32 * wkv * wd, tile_kv=tile, stages=stages, warps_kv=wkv, warps_d=wd)
    return Capped(**fields)


def forced_lane_cut(planner, kv: np.ndarray):
    """The lane cut of ``DecodePlanner`` (stream-K over lanes, ``_cut``) for any batch, small ones too (no window),
    or None when it would not cut anything."""
    b, hi = kv.shape[0], int(kv.max())
    prefix = planner._prefix(kv, b, hi)
    length = prefix.item(-1) + b * planner.o
    lane_len = max((length + planner.extra) / planner.width, planner.min_lane)
    return planner._cut(kv, 0, prefix, lane_len, length, hi)


def lane_cut_work(plan, num_ctas: int, default):
    """A ``WorkFn``: the lane cut for every batch (the default plan where it cuts nothing)."""
    from cuinfer.planner import decode_planner

    g = plan.num_qo_heads // plan.num_kv_heads
    planner = decode_planner(plan.num_kv_heads, g, plan.config.rows_per_tile, num_ctas, plan.config.tile_kv, -1)
    work = forced_lane_cut(planner, plan.kv_lens)
    return default() if work is None else work


def planner_work(make_cost=None, ctas: int | None = None):
    """A ``WorkFn``: the decode planner under the cost model ``make_cost()`` builds (None: the policy's model for the
    cache's element size), on ``ctas`` CTAs (None: the occupancy's grid); the default plan where the planner gives
    none."""

    def work(plan, num_ctas: int, default):
        from cuinfer.planner import decode_planner, kv_itemsize_cost

        g = plan.num_qo_heads // plan.num_kv_heads
        c = plan.config
        cost = make_cost() if make_cost is not None else kv_itemsize_cost(c.kv_itemsize)
        planner = decode_planner(plan.num_kv_heads, g, c.rows_per_tile, ctas or num_ctas, c.tile_kv, -1, cost=cost)
        work = planner.plan(plan.kv_lens) if plan.batch else None
        return default() if work is None else work

    return work


def cost_work(factor: float, gamma_factor: float | None = None):
    """A ``WorkFn``: the decode planner under ``DEFAULT_COST`` with every term but beta times ``factor`` (1: the bf16
    model, which the policy uses for 16-bit K/V), gamma times ``gamma_factor`` when given (2 and 4: ``FP8_COST``'s
    terms before 2026-12-04)."""
    gf = factor if gamma_factor is None else gamma_factor

    def make_cost():
        from cuinfer.planner import DEFAULT_COST, CostModel

        d = DEFAULT_COST
        return CostModel(alpha=d.alpha * factor, beta=d.beta, gamma=d.gamma * gf,
                         partial_row=d.partial_row * factor, split_fixed=d.split_fixed * factor)  # fmt: skip

    return planner_work(make_cost)


def cta_cut_work(plan, num_ctas: int, default):
    """A ``WorkFn``: ``cta_cut_plan`` of the batch."""
    g = plan.num_qo_heads // plan.num_kv_heads
    return cta_cut_plan(np.asarray(plan.kv_lens, np.int64), plan.num_kv_heads, g, num_ctas, plan.config.tile_kv)


def fp8_cost_work(**fields):
    """A ``WorkFn``: the decode planner under ``FP8_COST`` with ``fields`` replaced (e.g. gamma, piece_gamma)."""

    def make_cost():
        from cuinfer.planner import FP8_COST

        return dataclasses.replace(FP8_COST, **fields)

    return planner_work(make_cost)


# dcfg's plan variants: name -> WorkFn
WORK_VARIANTS = {"lanecut": lane_cut_work, "ctacut": cta_cut_work, "bf16cost": cost_work(1.0)}
WORK_VARIANTS.update({f"costx{f}": cost_work(float(f)) for f in (1, 2, 3, 4, 6)})
WORK_VARIANTS.update({f"gammax{f}": cost_work(2.0, float(f)) for f in (3, 4, 6, 8)})  # fp8's model, gamma times f
# FP8_COST with its gamma or piece_gamma replaced: fp8gamma<g>, fp8piece<g>
WORK_VARIANTS.update({f"fp8gamma{g}": fp8_cost_work(gamma=float(g)) for g in (128, 192, 320, 384)})
WORK_VARIANTS.update({f"fp8piece{g}": fp8_cost_work(piece_gamma=float(g)) for g in (32, 128, 192)})
WORK_VARIANTS.update({f"ctas{n}": planner_work(ctas=n) for n in (240, 248, 256)})  # the planner on n CTAs
# FP8_COST before 2026-12-04 (no piece cost of its own, the split policy's constants, split_fixed 256)
WORK_VARIANTS["fp8prev"] = fp8_cost_work(split_fixed=256.0, piece_gamma=None, balanced_efficiency=None, min_gain=None)


def cta_cut_plan(kv: np.ndarray, h: int, g: int, p: int, gr: int):
    """A decode plan cut at CTA granularity (the ``ctacut`` variant of ``dcfg``; an experiment): the (request, KV
    head) units request-major on a line of KV tiles (``gr`` tokens each), cut into ``p`` stretches of equal tiles;
    CTA ``c`` runs the pieces of the units inside its stretch (a unit that spans cuts is merged in the kernel)."""
    from cuinfer.planner.workplan import WorkPlan

    tiles = np.maximum(1, -(-kv // gr)).astype(np.int64)
    unit_tiles = np.repeat(tiles, h)  # unit u = request u // h, head u % h
    ends = np.cumsum(unit_tiles)
    cuts = np.round(np.arange(p + 1) * ends[-1] / p).astype(np.int64)
    req, head, start, end, partial, indptr = [], [], [], [], [], [0]
    pieces: dict = {}
    for c in range(p):
        a, z = int(cuts[c]), int(cuts[c + 1])
        u = int(np.searchsorted(ends, a, side="right"))
        while a < z and u < len(ends):
            u0 = int(ends[u] - unit_tiles[u])
            lo, hi = max(a, u0) - u0, min(z, int(ends[u])) - u0
            r, n = u // h, int(kv[u // h])
            req.append(r), head.append(u % h), start.append(min(n, lo * gr)), end.append(min(n, hi * gr))
            pieces.setdefault(u, []).append(len(req) - 1)
            a = u0 + hi
            u += 1
        indptr.append(len(req))
    partial = [-1] * len(req)
    m_ptr, m_src, m_tok, m_head = [0], [], [], []
    rows = 0
    for u, its in pieces.items():
        if len(its) < 2:
            continue
        for j, it in enumerate(its):
            partial[it] = rows + j * g
        for x in range(g):
            m_src.extend(rows + j * g + x for j in range(len(its)))
            m_ptr.append(len(m_src)), m_tok.append(u // h), m_head.append((u % h) * g + x)
        rows += len(its) * g
    n = len(req)
    items = {"item_req": req, "item_qo_tile": [0] * n, "item_kv_head": head, "item_kv_start": start,
             "item_kv_end": end, "item_partial": partial}  # fmt: skip
    merge = {"merge_indptr": m_ptr, "merge_src": m_src, "merge_dst_token": m_tok, "merge_dst_head": m_head}
    work = WorkPlan.from_items(p, indptr, items, merge, rows, 0, "cta-cut-experiment")
    work.num_kv_heads = h
    work.merge_in_kernel = True
    return work


def assignment_work(kind: str):
    """A prefill ``WorkFn``: the planner's items dealt again by a list schedule, ``list`` in reverse natural order
    (each (request, KV head)'s tiles together, for L2 reuse), ``lpt`` largest first by the cost model, ``lptfit``
    largest first by the traced item cost (1.9 + 2.92 µs per KV tile); ``default``: None (the planner's)."""
    if kind not in ASSIGNMENTS:
        raise ValueError(f"assignment {kind!r}: one of {', '.join(ASSIGNMENTS)}")
    if kind == "default":
        return None

    def work(plan, num_ctas: int, default):
        from bench.plan_host import item_costs

        base = default()
        if kind == "lptfit":
            costs = 1.9 + 2.92 * item_tiles(base, plan.config.tile_kv)
        else:
            qo = plan.qo_lens if plan.qo_lens is not None else np.diff(plan.qo_indptr)
            costs = item_costs(base, qo, plan.num_qo_heads // plan.num_kv_heads, plan.config.tile_q)
        key = -natural_index(base) if kind == "list" else -costs
        owner, rank, _ = list_schedule(costs, np.argsort(key, kind="stable"), num_ctas)
        return reassigned(base, owner, rank, kind)

    return work


def pool_work(share: float):
    """A prefill ``WorkFn``: the planner's plan with ``share`` of the cost left to the shared tail."""

    def work(plan, num_ctas: int, default):
        from cuinfer.planner import plan_work

        cfg, opts = plan.config, plan.options
        qo = plan.qo_lens if plan.qo_lens is not None else np.diff(plan.qo_indptr)
        return plan_work(
            qo, plan.kv_lens, num_kv_heads=plan.num_kv_heads, group_size=plan.num_qo_heads // plan.num_kv_heads,
            tile_rows=cfg.tile_q, num_ctas=num_ctas, kv_granule=cfg.tile_kv, causal=opts.causal,
            window_left=opts.window_left, pool_share=share,
        )  # fmt: skip

    return work


# ---- prefill -------------------------------------------------------------------------------------------------------


def _case_bytes(inp) -> int:
    from bench import cases

    c = inp.case
    return cases.decode_bytes(c.lengths.draw(c.seed), c.shape, c.kv_dtype)


def prefill(case_ids: list[str], kinds: list[str]) -> None:
    from bench import cases, inputs
    from bench.plan_host import plan_balance
    from bench.timing import CudaTimer

    timer = CudaTimer()
    todo = [(c, "") for c in cases.PREFILL_CASES if c.id in case_ids]
    for c in cases.PREFILL_CASES:
        if c.id in ("P2", "P5") and c.id in case_ids:
            todo.append((dataclasses.replace(c, shape=dataclasses.replace(c.shape, num_qo_heads=16, num_kv_heads=4)),
                         " half-heads"))  # fmt: skip
    for case, tag in todo:
        inp = inputs.prefill_inputs(case)
        flops = cases.prefill_flops(inp.lens, shape=case.shape)
        g = case.shape.num_qo_heads // case.shape.num_kv_heads
        for kind in kinds:
            w, run = planned_prefill(inp, work=assignment_work(kind))
            t = timer.time(run, iters=20, warmup=3)
            bal = plan_balance(w._plan.work, inp.lens, g, w._plan.config.tile_q)[0]
            print(f"{case.id}{tag} {kind:8s} {t.us:9.1f} us {flops / t.median_s / 1e12:7.1f} TFLOP/s  "
                  f"model balance {bal:.3f}", flush=True)  # fmt: skip
        inputs.free()


def pool(case_ids: list[str], shares: list[float], rounds: int) -> None:
    from bench import cases, inputs, peers
    from bench.prefill import prepare_fi
    from bench.timing import CudaTimer

    timer = CudaTimer()
    for case in cases.PREFILL_CASES:
        if case.id not in case_ids:
            continue
        inp = inputs.prefill_inputs(case)
        flops = cases.prefill_flops(inp.lens, shape=case.shape)
        runs = {f"pool {share:.3f}": planned_prefill(inp, work=pool_work(share))[1] for share in shares}
        try:
            peers.flashinfer()
            runs["flashinfer fa2"] = prepare_fi(inp, "fa2").run
        except Exception as e:  # noqa: BLE001 (no peer pack: cuinfer rows only)
            print(f"{case.id}: no FlashInfer ({type(e).__name__}: {e})", flush=True)
        times = _rounds(timer, runs, rounds, iters=20, warmup=3)
        fi = float(np.median(times["flashinfer fa2"])) if "flashinfer fa2" in times else float("nan")
        for k, ts in times.items():
            us = float(np.median(ts))
            print(f"{case.id} {k:16s} {us:9.1f} us {flops / us / 1e6:7.1f} TFLOP/s  vs FI {fi / us:6.3f}x  "
                  f"rounds {' '.join(f'{t:.1f}' for t in ts)}", flush=True)  # fmt: skip
        inputs.free()


def _rounds(timer, runs: dict, rounds: int, iters: int, warmup: int) -> dict[str, list[float]]:
    """``rounds`` alternating rounds over ``runs`` (name -> callable): each name's round medians (µs)."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, run in runs.items():
            times[k].append(timer.time(run, iters=iters, warmup=warmup).us)
    return times


def trace(case_ids: list[str], out_dir: str | None) -> None:
    """Per-item stamps of the prefill kernel built with -DCUINFER_TRACE, for the planner's assignment and for LPT:
    per-item time against its KV tiles (fixed + per-tile cost), the CTAs' idle tail, the phases of an item."""
    from bench import cases, inputs
    from bench.timing import cuda_torch

    torch = cuda_torch()
    saved = {}
    for case in cases.PREFILL_CASES:
        if case.id not in case_ids:
            continue
        inp = inputs.prefill_inputs(case)
        heads = case.shape.num_qo_heads
        guard = -(-int(inp.lens.sum()) * heads // 2) * 2  # float32 words that take the kernel's lse (prefill_trace)
        buf = torch.zeros(guard // 2 + (4 << 20), dtype=torch.int64, device="cuda")
        for kind in ("default", "lpt"):
            tb = prefill_trace(buf.data_ptr(), guard, heads)
            w, run = planned_prefill(inp, spec_of=prefill_trace_spec, work=assignment_work(kind), trace=tb)
            for _ in range(3):
                run()
            buf.zero_()
            torch.cuda.synchronize()
            run()
            torch.cuda.synchronize()
            wp = w._plan.work
            n = wp.n_items
            words = buf[guard // 2 : guard // 2 + PREFILL_TRACE_WORDS * n]
            t = words.view(n, PREFILL_TRACE_WORDS).cpu().numpy()
            tiles = item_tiles(wp, w._plan.config.tile_kv)
            tag = f"{case.id}-{kind}"
            saved[tag] = np.concatenate([t, tiles[:, None]], axis=1)
            # item 0's start time may hold the lse of row 0, head 0 (see prefill_trace): left out
            _report(tag, t[1:], tiles[1:], wp.num_ctas)
        del buf
        inputs.free()
    if out_dir:
        np.savez_compressed(f"{out_dir}/trace.npz", **saved)


def _report(tag: str, t: np.ndarray, tiles: np.ndarray, p: int) -> None:
    start, end, cta = t[:, 0].astype(np.float64), t[:, 1].astype(np.float64), t[:, 2]
    t0 = start.min()
    start, end = (start - t0) / 1e3, (end - t0) / 1e3  # us
    dur = end - start
    span = end.max()
    cta_end = np.zeros(p)
    np.maximum.at(cta_end, cta, end)
    cta_busy = np.bincount(cta, weights=dur, minlength=p)
    cta_first = np.full(p, np.inf)
    np.minimum.at(cta_first, cta, start)
    a = np.stack([np.ones_like(dur), tiles], axis=1)
    (fixed, per_tile), *_ = np.linalg.lstsq(a, dur, rcond=None)
    print(f"{tag}: items {len(dur)} span {span:.1f} us; CTA end mean {cta_end.mean():.1f} min {cta_end.min():.1f} "
          f"(busy/span {cta_busy.mean() / span:.3f}); first start max {cta_first.max():.1f} us; "
          f"item = {fixed:.2f} + {per_tile:.3f} x tiles us; tiles mean {tiles.mean():.1f}", flush=True)  # fmt: skip
    for lo, hi in ((0, 2), (2, 8), (8, 32), (32, 10**9)):
        m = (tiles >= lo) & (tiles < hi)
        if m.any():
            print(f"    tiles [{lo},{hi}): n {m.sum():5d} mean dur {dur[m].mean():7.2f} us, per tile "
                  f"{(dur[m] / np.maximum(tiles[m], 1)).mean():.3f}")  # fmt: skip
    # Phases from thread 0's SM clock: start -> loop (table, prologue) -> first tile ready -> loop end -> o stored ->
    # next item's copies issued; cycles to us by the items' own timer / clock ratio.
    c = t[:, 4:10].astype(np.float64)
    ok = (t[:, 6] > 0) & (c[:, 5] > c[:, 0])
    if ok.any():
        us_per_cycle = float((end - start)[ok].sum() / (c[ok, 5] - c[ok, 0]).sum())
        d = np.diff(c[ok], axis=1) * us_per_cycle
        names = ("table+prologue", "first tile wait", "loop after it", "epilogue", "next copies")
        print("    phases (us, mean over items with tiles): " + ", ".join(
            f"{nm} {v:.2f}" for nm, v in zip(names, d.mean(axis=0), strict=True)))  # fmt: skip
        per = d[:, 2] / np.maximum(tiles[ok] - 1, 1)
        print(f"    loop per tile after the first: {np.median(per):.3f} us; SM clock {1 / us_per_cycle / 1e3:.2f} GHz")


# ---- decode --------------------------------------------------------------------------------------------------------


def _decode_input(cid: str):
    from bench import cases, inputs

    by_id = {c.id: c for c in cases.DECODE_CASES + SMALL_DECODE_CASES}
    if cid not in by_id and cid.endswith("-e4m3"):  # any case over an e4m3 cache (the lab's own, e.g. D8-e4m3)
        base = by_id[cid[: -len("-e4m3")]]
        by_id[cid] = dataclasses.replace(base, id=cid, kv_dtype="float8_e4m3fn", compare_to=base.id)
    return inputs.decode_inputs(by_id[cid])


def decode(case_ids: list[str]) -> None:
    from bench import inputs
    from bench.timing import CudaTimer

    timers = {"dirty": CudaTimer(), "clean": CudaTimer(clean_flush=True)}
    for cid in case_ids:
        inp = _decode_input(cid)
        nbytes = _case_bytes(inp)
        for split in (None, 1 << 20):
            w, run = planned_decode(inp, use_tensor_cores=True, fixed_split_size=split)
            for mode, timer in timers.items():
                t = timer.time(run, iters=25, warmup=3)
                print(f"{cid} split {str(split):8s} flush {mode}: {t.us:7.1f} us {nbytes / t.median_s / 1e9:6.0f} "
                      f"GB/s items {w._plan.work.n_items}", flush=True)  # fmt: skip
        inputs.free()


def decode_cut(case_ids: list[str]) -> None:
    """The default decode plan against the lane cut on every batch (exact balance)."""
    from bench import inputs
    from bench.timing import CudaTimer

    timer = CudaTimer()
    for cid in case_ids:
        inp = _decode_input(cid)
        nbytes = _case_bytes(inp)
        for name, work in (("def", None), ("cut", lane_cut_work)):
            w, run = planned_decode(inp, work=work)
            t = timer.time(run, iters=30, warmup=3)
            wp = w._plan.work
            print(f"{cid} {name} {t.us:7.1f} us {nbytes / t.median_s / 1e12:5.3f} TB/s items {wp.n_items} ctas "
                  f"{wp.num_ctas} merge {wp.n_merge} mode {wp.assign_mode}", flush=True)  # fmt: skip
        inputs.free()


def _compare(cid: str, nbytes: int, runs: list, rounds: int) -> None:
    """``runs`` ``(name, wrapper, run)``, alternating rounds of 20 timed runs each: per run its median of round
    medians, GB/s, the ratio to the first and the largest output difference from the first."""
    from bench.timing import CudaTimer

    timer = CudaTimer()
    outs = [run().float() for _n, _w, run in runs]  # (compiles each build and prepares its launch)
    times = _rounds(timer, {i: run for i, (_n, _w, run) in enumerate(runs)}, rounds, iters=20, warmup=2)
    first = statistics.median(times[0])
    for i, (name, w, _run) in enumerate(runs):
        t = statistics.median(times[i])
        diff = (outs[i] - outs[0]).abs().max().item()
        print(f"{cid} {name:14s} grid {w._plan.work.num_ctas:4d}: {t:7.2f} us ({nbytes / t / 1e3:5.0f} GB/s) ratio "
              f"{first / t:.3f} rounds {' '.join(f'{x:.1f}' for x in times[i])} max |diff| {diff:.1e}",
              flush=True)  # fmt: skip


def decode_ab(case_ids: list[str], defines: tuple[str, ...], rounds: int = 3) -> None:
    """The default decode kernel against an A/B build with ``defines``, same plans, alternating rounds."""
    from bench import inputs

    spec_of = decode_ab_spec_of(defines)
    for cid in case_ids:
        inp = _decode_input(cid)
        runs = [("default", *planned_decode(inp)), (" ".join(defines), *planned_decode(inp, spec_of=spec_of))]
        _compare(cid, _case_bytes(inp), runs, rounds)
        del runs
        inputs.free()


def decode_configs(case_ids: list[str], variants: list[str], rounds: int = 3) -> None:
    """Decode kernel configurations (``decode_variant``) and plans (``lanecut``, ``ctacut``) against the first, each
    planned for its own grid and tile, alternating rounds."""
    from bench import inputs

    for cid in case_ids:
        inp = _decode_input(cid)
        runs = []
        for name in variants:
            try:
                if name in WORK_VARIANTS:
                    w, run = planned_decode(inp, work=WORK_VARIANTS[name])
                else:
                    w, run = planned_decode(inp, config=decode_variant(name))
                run()  # (compiles the configuration's kernel)
            except Exception as exc:  # noqa: BLE001 (a configuration that does not build is reported, not fatal)
                print(f"{cid} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            runs.append((name, w, run))
        _compare(cid, _case_bytes(inp), runs, rounds)
        del runs
        inputs.free()


def decode_evict(case_ids: list[str], rounds: int = 2) -> None:
    """The decode kernel with its K/V copies forced L2 evict-first against forced evict-normal (the policy picks one
    by the step's K/V bytes, ``decode.policy.kv_evict_first``), alternating in each round; the L2 flushed by a write
    (the docs/benchmarks.md method: the L2 is full of dirty lines) and by a write then a read (clean lines)."""
    from bench import inputs
    from bench.timing import CudaTimer
    from cuinfer.decode.policy import kv_evict_first
    from cuinfer.runtime.device import device_info

    timers = {"dirty": CudaTimer(), "clean": CudaTimer(clean_flush=True)}
    l2 = device_info().l2_bytes
    for cid in case_ids:
        inp = _decode_input(cid)
        nbytes = _case_bytes(inp)
        runs = {
            "evict-first" if forced else "evict-normal": planned_decode(inp, evict_first=forced)[1]
            for forced in (True, False)
        }
        pick = "evict-first" if kv_evict_first(nbytes, l2) else "evict-normal"
        for r in range(rounds):
            for name, fn in runs.items():
                for mode, timer in timers.items():
                    t = timer.time(fn, iters=30, warmup=3)
                    print(f"{cid} round {r} {name:12s}{' (policy)' if name == pick else '         '} flush {mode}: "
                          f"{t.us:7.1f} us {nbytes / t.median_s / 1e12:5.3f} TB/s", flush=True)  # fmt: skip
        inputs.free()


def decode_trace(case_ids: list[str], variants: list[str], rounds: int = 2, defines: tuple[str, ...] = ()) -> None:
    """Where a small decode step's time goes: the tensor-core kernel built with -DCUINFER_DECODE_TRACE (per CTA: global
    timer at entry / exit, SM clock at entry, after the prologue's loads and copies, first tile landed, last epilogue
    start, exit), for the variants of ``dtrace_variant``, timed in alternating rounds; plus the floors of the same
    timer: a near-empty kernel and torch.sum over a buffer of each case's K/V bytes."""
    from bench import inputs
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    timer, clean = CudaTimer(), CudaTimer(clean_flush=True)
    tbuf = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
    tb = TraceBuffer(tbuf.data_ptr())
    t = timer.time(lambda: torch.cuda._sleep(1), iters=30, warmup=3)
    print(f"floor: near-empty kernel {t.us:.2f} us", flush=True)
    for cid in case_ids:
        inp = _decode_input(cid)
        nbytes = _case_bytes(inp)
        flat = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        t = timer.time(lambda flat=flat: flat.sum(), iters=30, warmup=3)
        print(f"{cid} floor: torch.sum over {nbytes / 1e6:.0f} MB {t.us:.1f} us {nbytes / t.median_s / 1e12:.3f} TB/s")
        del flat
        runs = {}
        for name in variants:
            w, run = planned_decode(inp, trace=tb, **dtrace_variant(name, defines))
            run()  # (compiles the trace build and prepares the launch)
            runs[name] = (w, run)
        _dtrace_rounds(cid, runs, rounds, timer, clean, tbuf, nbytes)
        del runs
        inputs.free()


def trace_stamps(fn, tbuf, timer, n: int, runs: int) -> list:
    """The per-CTA stamps of ``runs`` runs of the trace build ``fn`` (``n`` CTAs, 16 words each in ``tbuf``), each
    after ``timer``'s L2 flush."""
    torch = timer._torch
    stamps = []
    for _ in range(runs):
        tbuf.zero_()
        timer.flush_l2()
        timer.head_start()
        fn()
        torch.cuda.synchronize()
        stamps.append(tbuf[: 16 * n].view(n, 16).cpu().numpy().copy())
    return stamps


def _dtrace_rounds(cid, runs, rounds, timer, clean, tbuf, nbytes) -> None:
    """``rounds`` rounds of every variant of ``runs``: timing by the benchmark method (``timer``), then phase stamps of
    five runs after the benchmark flush and five after ``clean``'s write-then-read flush."""
    for r in range(rounds):
        for name, (w, fn) in runs.items():
            tm = timer.time(fn, iters=30, warmup=3)
            n = w._plan.work.num_ctas
            for flush, tmr in (("dirty", timer), ("clean", clean)):
                stamps = trace_stamps(fn, tbuf, tmr, n, 5)
                head = f"{tm.us:6.1f} us {nbytes / tm.median_s / 1e12:.3f} TB/s" if flush == "dirty" else " " * 22
                print(f"{cid} r{r} {name:8s} {head} | {flush} {_dphases(stamps)}", flush=True)
                print(f"{cid} r{r} {name:8s} {' ' * 22} | {flush} {_dends(stamps)}", flush=True)


DPHASES = ("entry", "range", "items", "pages", "issue", "wait0", "loop", "epi", "exit", "span", "loopmax", "ghz")


def decode_phase_medians(stamps: list) -> dict:
    """The phases of ``dtrace`` stamps (one ``[CTAs, kDecodeTraceWords]`` array per run), medians over the runs (us):
    entry spread; the prologue's work range, items, first page indices and copy issue; first tile wait, loop, last
    epilogue (and merge), each the median over the CTAs that ran an item; exit spread; span (first entry to last
    exit); the longest loop; and the SM clock (cycles per ns) from each CTA's clock against its global timer."""
    rows = []
    for t in stamps:
        g0, c1, c2, c3, c4, c5, g6, _, c8, c9, c10 = (t[:, i].astype(np.float64) for i in range(11))
        ok = (c5 > c1) & (g6 > g0)
        ghz = np.median((c5 - c1)[ok] / (g6 - g0)[ok])  # cycles per ns
        has = ok & (c3 > 0) & (c4 > c3) & (c8 > 0)
        ph = [np.diff(np.stack([c1, c8, c9, c10, c2, c3, c4, c5]), axis=0)[i][has] / ghz / 1e3 for i in range(7)]
        rows.append([
            (g0[ok].max() - g0[ok].min()) / 1e3, *(np.median(x) for x in ph), (g6[ok].max() - g6[ok].min()) / 1e3,
            (g6[ok].max() - g0[ok].min()) / 1e3, np.max(ph[5]), ghz,
        ])  # fmt: skip
    return dict(zip(DPHASES, np.median(np.array(rows), axis=0).tolist(), strict=True))


def _dends(stamps: list) -> str:
    """The spread of the CTAs' exits (global timer, us after the first entry; CTAs that ran an item), medians over
    the runs, and the idle share: the mean time a CTA waits after its exit for the last one, over the step."""
    qs = []
    for t in stamps:
        g0, g6, c3 = t[:, 0].astype(np.float64), t[:, 6].astype(np.float64), t[:, 3]
        ok = (g6 > g0) & (c3 > 0)
        ends = (g6[ok] - g0[ok].min()) / 1e3
        qs.append([*np.percentile(ends, [0, 10, 50, 90, 100]), float(np.mean(ends.max() - ends) / ends.max())])
    q = np.median(np.array(qs), axis=0)
    return "ends min {:.1f}, p10 {:.1f}, p50 {:.1f}, p90 {:.1f}, max {:.1f} us (idle share {:.3f})".format(*q)


def _dphases(stamps: list) -> str:
    m = decode_phase_medians(stamps)
    return ", ".join(f"{nm} {m[nm]:.2f}" for nm in DPHASES[:-1]) + f" ({m['ghz']:.2f} GHz)"


def _small_decode_cases() -> tuple:
    """Small batches of long requests beside D1-D4 (the small-batch plan's domain), for ``dtrace``."""
    from bench.cases import DecodeCase, Lengths, Target

    none = Target("us", 0.0, "-")
    return (
        DecodeCase("S1", Lengths("uniform", 8, lo=2000, hi=8000), 101, none, "-"),
        DecodeCase("S2", Lengths("uniform", 24, lo=2000, hi=2600), 102, none, "-"),
        DecodeCase("S3", Lengths("uniform", 3, lo=8000, hi=32000), 103, none, "-"),
    )


SMALL_DECODE_CASES = _small_decode_cases()


# ---- command line --------------------------------------------------------------------------------------------------


def _env_list(name: str, default: str, sep: str = ",") -> list[str]:
    return [x for x in os.environ.get(name, default).split(sep) if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.tune_sched", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[4:]))  # fmt: skip
    ap.add_argument("experiments", nargs="*", metavar="EXPERIMENT",
                    help=f"one or more of {', '.join(EXPERIMENTS)} (default: prefill decode)")  # fmt: skip
    ap.add_argument("--cases", help="case ids of dtrace, dab, dcfg, pool, prefill ($CUINFER_TUNE_CASES)")
    ap.add_argument("--rounds", type=int, help="alternating rounds ($CUINFER_TUNE_ROUNDS)")
    ap.add_argument("--dtrace", default=os.environ.get("CUINFER_DTRACE", "base,nosplit,s2,s4"),
                    help="dtrace variants: base, nosplit, s2, s4, ab ($CUINFER_DTRACE)")  # fmt: skip
    ap.add_argument("--defines", default=os.environ.get("CUINFER_DAB_DEFINES", ""),
                    help="-D options of the A/B build of dab and dtrace's ab, as --defines='-DNAME[=value] ...' "
                    "($CUINFER_DAB_DEFINES)")  # fmt: skip
    ap.add_argument(
        "--dcfg",
        default=os.environ.get("CUINFER_DCFG", "default;2,2,3;2,1,3"),
        help='decode configurations, "default;wkv,wd,stages[,cap];lanecut;ctacut" ($CUINFER_DCFG)',
    )
    ap.add_argument("--shares", default=os.environ.get("CUINFER_POOL_SHARES", "0,0.02,0.04,0.08"),
                    help="shared-tail shares of pool ($CUINFER_POOL_SHARES)")  # fmt: skip
    ap.add_argument("--assign", default=os.environ.get("CUINFER_TUNE_ASSIGN", "default,list,lpt"),
                    help="assignments of prefill: default, list, lpt, lptfit ($CUINFER_TUNE_ASSIGN)")  # fmt: skip
    args = ap.parse_args(argv)
    args.experiments = args.experiments or ["prefill", "decode"]
    unknown = [e for e in args.experiments if e not in EXPERIMENTS]
    if unknown:
        ap.error(f"unknown experiment(s) {', '.join(unknown)}; one or more of {', '.join(EXPERIMENTS)}")
    args.defines = tuple(args.defines.split())
    if ("dab" in args.experiments or "ab" in args.dtrace.split(",")) and not args.defines:
        ap.error("dab and the dtrace variant ab need --defines (or $CUINFER_DAB_DEFINES), e.g. -DCUINFER_MY_SWITCH")
    for name in args.dtrace.split(","):
        if name not in DTRACE_VARIANTS:
            ap.error(f"--dtrace: unknown variant {name!r}; one of {', '.join(DTRACE_VARIANTS)}")
    for name in args.assign.split(","):
        if name not in ASSIGNMENTS:
            ap.error(f"--assign: unknown assignment {name!r}; one of {', '.join(ASSIGNMENTS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    def cases(default: str) -> list[str]:
        return args.cases.split(",") if args.cases else _env_list("CUINFER_TUNE_CASES", default)

    def rounds(default: int) -> int:
        return args.rounds or int(os.environ.get("CUINFER_TUNE_ROUNDS", default))

    run = set(args.experiments)
    if "trace" in run:
        trace(["P1", "P2", "P3", "P6"], os.environ.get("OUT"))
    if "cut" in run:
        decode_cut(["D5", "D6", "D7", "D8", "D1"])
    if "decode" in run:
        decode(["D1", "D2", "D3", "D4"])
    if "dtrace" in run:
        decode_trace(cases("D1,D2,D3,D4,D5"), args.dtrace.split(","), rounds(2), args.defines)
    if "dab" in run:
        decode_ab(cases("D1,D2,D3,D4,D5,D6,D7,D8,D9"), args.defines, rounds(3))
    if "dcfg" in run:
        decode_configs(cases("D1,D2,D3,D4,D5,D6,D7,D8,D9"), args.dcfg.split(";"), rounds(3))
    if "evict" in run:
        decode_evict(cases("D1,D2,D3,D4,D5,D6,D7,D8,D9"), rounds(2))
    if "pool" in run:
        pool(cases("P1,P2,P3,P4,P5,P6"), [float(x) for x in args.shares.split(",")], rounds(3))
    if "prefill" in run:
        prefill(cases("P1,P2,P3,P4,P5,P6"), args.assign.split(","))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
