"""Scheduling and per-item cost experiments (GPU machine). Not a standard suite.

python -m bench.lab.tune_sched [trace] [cut] [decode] [prefill]

trace    P1/P2/P3/P6 with the prefill kernel built with -DCUINFER_TRACE: thread 0 of each CTA stamps every item's
         start and end (%globaltimer) and the SM clock at its phases, written where mask_indptr points. Prints the
         per-item cost fit (fixed + per KV tile), the phases of an item, the CTAs' end spread and busy fraction, for
         the planner's assignment and for LPT; saves $OUT/trace.npz.
cut      D5-D8 and D1: the default plan, an A/B build whose decode epilogue stages all 16 mma rows
         (-DCUINFER_DECODE_EPI_ALL_ROWS; the default stages only the group's real rows), and the forced lane cut
         (split for exact balance).
evict    D1-D9: the decode kernel's K/V copies forced L2 evict-first against forced evict-normal (the policy picks
         by the step's K/V bytes), flushed by a write and by a write then a read.
dtrace   D1-D5 (CUINFER_TUNE_CASES) with the decode kernel built with -DCUINFER_DECODE_TRACE: per CTA the globaltimer at
         entry / exit and the SM clock at each phase (work range, items, first pages, copies issued, first tile, loop,
         last epilogue), medians over the CTAs of five runs under a dirty and a clean L2, for the A/B builds of
         DTRACE_VARIANTS (CUINFER_DTRACE), timed by the PERF.md method in alternating rounds; plus the floors of the
         same timer (near-empty kernel, torch.sum over the case's bytes).
dab      D1-D9 (CUINFER_TUNE_CASES): the default decode kernel against an A/B build with CUINFER_DAB_DEFINES (e.g.
         "-DCUINFER_DECODE_MERGE_FENCE"), same plans, alternating rounds.
dcfg     D1-D9 (CUINFER_TUNE_CASES): decode configurations CUINFER_DCFG ("default;wkv,wd,stages[,cap[,chunk]];..."):
         tile, stages, CTAs per SM cap and item chunk, each planned for its own grid, alternating rounds; "lanecut":
         the default kernel with every batch planned by the lane cut (small batches too); "ctacut": a cut of the
         units' tiles into equal stretches per CTA (cta_cut_plan).
decode   D1-D4 split / unsplit, L2 flushed by a write (the PERF.md method, which leaves the L2 full of dirty lines
         that the timed kernel must write back) and by a write then a read (clean lines).
pool     P1-P6 (CUINFER_TUNE_CASES) planned with each shared-tail share of CUINFER_POOL_SHARES (planner.assign
         POOL_SHARE: the smallest items holding that share of the cost are taken by the CTAs one at a time as they
         finish) and FlashInfer's fa2 when importable, timed in alternating rounds (CUINFER_TUNE_ROUNDS).
prefill  P1-P6 with the planner's assignment against heap list schedules (items in reverse natural order: each
         (request, KV head) pair's tiles run together, for L2 reuse; and LPT), and P2/P5 with half the heads.

Findings (H200, 2026-11-29): a prefill item costs ~3.4 us + ~3.0 us per 64-key tile (the fixed part is mostly the
half-used diagonal tile); the planner's static assignment leaves the CTAs' ends spread by +-2-4 % on P3/P6 (cost
model error and co-resident CTAs); the L2 working set does not matter (list schedules and half the heads were not
faster). Decode: staging only the real rows in the epilogue gained 0.2-0.9 % on D5-D8 and 2.5 % on D1; with the
merge inside the kernel the forced lane cut beats the whole-request assignment of D5-D7 by 0.3-0.6 % (it lost
1-1.5 % with the separate merge kernel), not enough to pay its plan() time; equal items on 256 instead of 264 CTAs
measured within noise, and so did copying each item's q with its first tile's cp.async group instead of loading
it at the item start (+-0.3 %, not kept). The D1/D4 L2 flush by a write costs the next kernel ~5/12 us of
write-back. Evict-first K/V copies (fourth session, `evict`): dirty flush D1 29.1 / 32.0 us (evict-first / normal),
D4 49.7 / 53.0, but D5 276 / 260 and D8 178 / 171; clean flush within ~1.5 % either way: decode.policy keeps
evict-first for steps of at most 4 L2 sizes of K/V.
Item phases (fifth session, `trace` with SM-clock stamps, before the staged epilogue): a P3 item (10.8 KV tiles) spent
0.45 us in the table and prologue, 0.34 us waiting for its first tile, 30.6 us in the loop (3.13 us per tile against
2.89 on P2: more diagonal tiles), 2.16 us in the epilogue (1.77 with the MUFU 1/d and log2) and 0.74 us issuing the
next item's copies; P2 items the same outside the loop. The epilogue was the largest fixed cost: see tune_prefill.
Prefill assignment (sixth session, `prefill` with CUINFER_TUNE_ASSIGN=default,lptfit,lpt): LPT by the traced item cost
(1.9 + 2.92 us per tile) predicts P3 606 us against the snake's 618 us, but measured 605.6 / 606.5 against 602.6 /
604.8 us, and P6 615.4 / 610.7 against 608.7 / 606.9: the CTAs' end spread is run-time variation, not the cost model.
Decode phases (sixth session, `dtrace`, D1 under the PERF.md flush): launch 3.0 us (a near-empty kernel 2.85), work
range 0.69, items 0.60 (0.83 before the plan prefetch), first pages 1.10, copies issued 0.82, first tile 3.22, loop
14.84 (slowest CTA 16.6), last epilogue with the split merge 2.24 (2.36 with per-thread fences; unsplit items 0.73).
With a clean L2 the first tile takes 2.04 and the loop 13.39 us: 4.35 TB/s of streaming against 3.7. Not kept: 2
stages (3 CTAs per SM) and 4 stages (1 CTA per SM), no split, the first item's q prefetched.
Thread-index bound (eighth session, `dab`): `__builtin_assume(threadIdx.x < kThreads)` in both decode kernels cut
their SASS by ~30 % (tensor-core kernel 4104 -> 2864 instructions, 205 -> 190 registers) but ran D5-D8 0.7-2 % slower
(D6 261.8 / 266.6, D7 266.2 / 271.5 us; D1-D4, D9 within +-1.4 %), bit-identical outputs: not kept. (The prefill
kernel's thread index modulo its group size, which is kept, gained 3-4 % on P4-P6; the same assume on top of it
changed P1-P6 by 0..-0.8 %.)
Ninth session (`dcfg`, `dtrace` exit spread, and two kernel changes not kept): 32-token tensor-core tiles at 3-4
CTAs per SM (warps 2 x 2 or 2 x 1, 3-4 stages, 32-item chunks) and 2 stages at 2 CTAs per SM ran D5-D9 3-14 % and
D2-D4 4-23 % slower than the default (64-token tiles, 3 stages, 2 CTAs per SM; D1 2 % faster with 2 x 1 warps at 4
CTAs per SM): the default stays. The CTAs' exits spread over a whole item on D5-D7 (D7: first CTA out at 218 us,
median 250, last 259; idle share 5.6 %, D5 9.8 %), but a shared tail the CTAs take with an atomic (the last units
cut into 4- or 8-tile pieces, merged in the kernel; commit 69df95d, reverted) ran D5-D7 0.9-4 % slower and D1-D4
12-93 % slower: while the CTAs left stream, the memory system is still saturated, so the static plan's tail costs
far less than its idle share, and each take (atomic, item load, two barriers) stalls the producer. A parallel split
merge (lse weights by warps, pieces spread over the threads in slices) ran D1-D4 1-3 % slower than the loop per
output chunk (it adds barriers; the loop's L2 loads were already in flight together).
Small-batch plans (sixth session, `dtrace` variant `tileplan`): the equal pieces of DecodePlanner._aligned against
the tile pipeline's chunks, D2 26.3 / 26.2 against 29.7 / 29.8 us, S1 57.0 / 57.1 against 59.7 / 59.6, S2 75.4 /
75.2 against 77.1 / 76.3, D1 and D4 the same pieces; the lanes' CTAs numbered head-major (an A/B of lanes.expand, not
kept) were 1.3-1.6 % slower on D2, D8 and D9.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import sys

import numpy as np


def _list_schedule(costs_items: np.ndarray, order: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Items ``order`` (in that order) to the least-loaded CTA; returns CTA-major item ids, indptr, balance."""
    heap = [(0.0, c) for c in range(p)]
    owner = np.empty(order.shape[0], dtype=np.int64)
    for i in order.tolist():
        load, c = heapq.heappop(heap)
        owner[i] = c
        heapq.heappush(heap, (load + float(costs_items[i]), c))
    from bench.lab.tune_prefill import cta_major

    loads = np.bincount(owner, weights=costs_items, minlength=p)
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0])
    items, indptr = cta_major(owner, rank, p)
    return items, indptr, float(loads.mean() / loads.max())


def _patched_assign(kind: str):
    from cuinfer.planner import assign

    def fn(costs, num_heads, num_ctas, stats=None, prefix=None, pool_share=0.0):
        g, h, p = costs.shape[0], int(num_heads), int(num_ctas)
        n = g * h
        c_items = np.tile(np.asarray(costs, dtype=np.float64), h)  # natural item i: group i % g, head i // g
        if kind == "list":
            order = np.arange(n)[::-1].copy()
        elif kind == "lptfit":  # LPT by the traced item cost (1.9 + 2.92 us per KV tile) from the model costs
            c_items = 1.9 + 2.92 * np.ceil(np.maximum(c_items - 192.0, 0.0) / 64.0)
            order = np.argsort(-c_items, kind="stable")
        else:  # lpt
            order = np.argsort(-c_items, kind="stable")
        items, indptr, bal = _list_schedule(c_items, order, p)
        fn.balance = bal
        return assign.Assignment(indptr, items % g, items // g, kind)

    return fn


def prefill(case_ids: list[str]) -> None:
    import os

    import cuinfer.planner.work as work
    import torch

    from bench import cases, inputs
    from bench.prefill import prepare_cuinfer
    from bench.timing import CudaTimer

    timer = CudaTimer()
    original = work.assign_items
    todo = [(c, "") for c in cases.PREFILL_CASES if c.id in case_ids]
    for c in cases.PREFILL_CASES:
        if c.id in ("P2", "P5") and c.id in case_ids:
            todo.append((dataclasses.replace(c, shape=dataclasses.replace(c.shape, num_qo_heads=16, num_kv_heads=4)),
                         " half-heads"))  # fmt: skip
    for case, tag in todo:
        inp = inputs.prefill_inputs(case)
        flops = cases.prefill_flops(inp.lens, shape=case.shape)
        for kind in os.environ.get("CUINFER_TUNE_ASSIGN", "default,list,lpt").split(","):
            work.assign_items = original if kind == "default" else _patched_assign(kind)
            try:
                prep = prepare_cuinfer(inp, "fa2")
                t = timer.time(prep.run, iters=20, warmup=3)
                bal = getattr(work.assign_items, "balance", float("nan"))
                print(f"{case.id}{tag} {kind:8s} {t.us:9.1f} us {flops / t.median_s / 1e12:7.1f} TFLOP/s  "
                      f"model balance {bal:.3f}", flush=True)  # fmt: skip
            finally:
                work.assign_items = original
            torch.cuda.synchronize()
        inputs.free()


def pool(case_ids: list[str], shares: list[float], rounds: int) -> None:
    import cuinfer.planner.assign as assign
    import torch

    from bench import cases, inputs, peers
    from bench.prefill import prepare_cuinfer, prepare_fi
    from bench.timing import CudaTimer

    timer = CudaTimer()
    saved = assign.POOL_SHARE
    for case in cases.PREFILL_CASES:
        if case.id not in case_ids:
            continue
        inp = inputs.prefill_inputs(case)
        flops = cases.prefill_flops(inp.lens, shape=case.shape)
        runs = {}
        try:
            for share in shares:
                assign.POOL_SHARE = share
                runs[f"pool {share:.3f}"] = prepare_cuinfer(inp, "fa2").run
        finally:
            assign.POOL_SHARE = saved
        try:
            peers.flashinfer()
            runs["flashinfer fa2"] = prepare_fi(inp, "fa2").run
        except Exception as e:  # noqa: BLE001 (no peer pack: cuinfer rows only)
            print(f"{case.id}: no FlashInfer ({type(e).__name__}: {e})", flush=True)
        times = {k: [] for k in runs}
        for _ in range(rounds):
            for k, run in runs.items():
                times[k].append(timer.time(run, iters=20, warmup=3).us)
        fi = float(np.median(times["flashinfer fa2"])) if "flashinfer fa2" in times else float("nan")
        for k, ts in times.items():
            us = float(np.median(ts))
            print(f"{case.id} {k:16s} {us:9.1f} us {flops / us / 1e6:7.1f} TFLOP/s  vs FI {fi / us:6.3f}x  "
                  f"rounds {' '.join(f'{t:.1f}' for t in ts)}", flush=True)  # fmt: skip
        torch.cuda.synchronize()
        inputs.free()


def decode(case_ids: list[str]) -> None:
    from bench import cases, inputs
    from bench.timing import CudaTimer

    timers = {"dirty": CudaTimer(), "clean": CudaTimer(clean_flush=True)}
    by_id = {c.id: c for c in cases.DECODE_CASES}
    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        s, kv = inp.case.shape, inp.kv
        nbytes = cases.decode_bytes(inp.case.lengths.draw(inp.case.seed), s, inp.case.kv_dtype)
        for split in (None, 1 << 20):
            w = _decode_wrapper(inp, use_tensor_cores=True, fixed_split_size=split)
            for mode, timer in timers.items():
                t = timer.time(functools.partial(w.run, inp.q, kv.cache), iters=25, warmup=3)
                print(f"{cid} split {str(split):8s} flush {mode}: {t.us:7.1f} us {nbytes / t.median_s / 1e9:6.0f} "
                      f"GB/s items {w._plan.work.n_items}", flush=True)  # fmt: skip
        inputs.free()


def decode_cut(case_ids: list[str]) -> None:
    """The default decode plan and kernel against an A/B kernel build and the forced lane cut (exact balance)."""
    import cuinfer.planner.decode_plan as dp
    import torch

    import cuinfer.decode.launch as dec
    from bench import cases, inputs
    from bench.timing import CudaTimer

    timer = CudaTimer()
    by_id = {c.id: c for c in cases.DECODE_CASES}
    consts = (dp.BALANCED_EFFICIENCY, dp.MIN_GAIN)
    spec_of = dec.decode_spec
    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        s, kv = inp.case.shape, inp.kv
        nbytes = cases.decode_bytes(inp.case.lengths.draw(inp.case.seed), s, inp.case.kv_dtype)
        for forced, ab in ((False, ""), (False, "all-rows"), (True, "")):
            dec.decode_spec = spec_of if ab != "all-rows" else _with_define(spec_of, "-DCUINFER_DECODE_EPI_ALL_ROWS")
            dp.BALANCED_EFFICIENCY, dp.MIN_GAIN = (2.0, -1.0) if forced else consts
            try:
                w = _decode_wrapper(inp)
                w.run(inp.q, kv.cache)  # prepares the launch (kernel lookup) while the A/B spec is in place
            finally:
                dp.BALANCED_EFFICIENCY, dp.MIN_GAIN = consts
            t = timer.time(functools.partial(w.run, inp.q, kv.cache), iters=30, warmup=3)
            work = w._plan.work
            tbs = nbytes / t.median_s / 1e12
            print(f"{cid} {'cut' if forced else 'def':3s} {ab:8s} {t.us:7.1f} us {tbs:5.3f} TB/s items "
                  f"{work.n_items} ctas {work.num_ctas} merge {work.n_merge} mode {work.assign_mode}")  # fmt: skip
        dec.decode_spec = spec_of
        torch.cuda.synchronize()
        inputs.free()


def decode_ab(case_ids: list[str], defines: tuple[str, ...], rounds: int = 3) -> None:
    """The default decode kernel against an A/B build with ``defines``, same plans, alternating rounds of 20 timed
    runs each (PERF.md method); prints the median of each build's round medians, TB/s and the ratio."""
    import statistics

    import torch

    import cuinfer.decode.launch as dec
    from bench import cases, inputs
    from bench.timing import CudaTimer

    timer = CudaTimer()
    by_id = {c.id: c for c in cases.DECODE_CASES}
    spec_of = dec.decode_spec
    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        s, kv = inp.case.shape, inp.kv
        nbytes = cases.decode_bytes(inp.case.lengths.draw(inp.case.seed), s, inp.case.kv_dtype)
        runs = []
        for ab in (False, True):
            dec.decode_spec = _with_define(spec_of, *defines) if ab else spec_of
            try:
                w = _decode_wrapper(inp)
                out = w.run(inp.q, kv.cache)  # prepares the launch (kernel lookup) while the A/B spec is in place
            finally:
                dec.decode_spec = spec_of
            runs.append((w, out.float()))
        diff = (runs[0][1] - runs[1][1]).abs().max().item()
        meds: list[list[float]] = [[], []]
        for _ in range(rounds):
            for i, (w, _o) in enumerate(runs):
                meds[i].append(timer.time(functools.partial(w.run, inp.q, kv.cache), iters=20, warmup=2).us)
        a, b = (statistics.median(m) for m in meds)
        print(f"{cid}: default {a:7.2f} us ({nbytes / a / 1e3:5.0f} GB/s), {' '.join(defines)} {b:7.2f} us "
              f"({nbytes / b / 1e3:5.0f} GB/s), ratio {a / b:.3f}, max |diff| {diff:.1e}", flush=True)  # fmt: skip
        del runs
        torch.cuda.synchronize()
        inputs.free()


def _decode_variant(spec: str):
    """A decode configuration from ``"warps_kv,warps_d,stages[,ctas_per_sm_cap[,item_chunk]]"`` (the tensor-core
    kernel at the Llama shape): a ``DecodeConfig`` subclass whose ``min_blocks`` (the CTAs per SM the kernel is
    compiled and the grid sized for) honours the cap and whose shared memory counts the item chunk, or None for
    ``"default"``."""
    from cuinfer.decode import policy as pol

    if spec == "default":
        return None
    wkv, wd, stages, *rest = (int(x) for x in spec.split(","))
    cap = rest[0] if rest else 0
    chunk = rest[1] if len(rest) > 1 else pol.ITEM_CHUNK

    class Variant(pol.DecodeConfig):
        item_chunk = chunk

        @property
        def smem_bytes(self) -> int:
            return super().smem_bytes - (pol.ITEM_CHUNK - chunk) * pol.ITEM_INFO_BYTES

        @property
        def min_blocks(self) -> int:
            m = super().min_blocks
            return min(m, cap) if cap else m

    base = pol.decode_config(4, 128, use_tensor_cores=True)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields.update(threads=32 * wkv * wd, tile_kv=16 * wkv, stages=stages, warps_kv=wkv, warps_d=wd)
    return Variant(**fields)


def _forced_lane_cut(self, kv, kv_min=None, kv_max=None):
    """``DecodePlanner.plan`` that always takes the lane cut (stream-K over lanes, ``_cut``), small batches too (the
    ``lanecut`` variant of ``dcfg``; no window)."""
    b, hi = kv.shape[0], int(kv.max())
    prefix = self._prefix(kv, b, hi)
    length = prefix.item(-1) + b * self.o
    lane_len = max((length + self.extra) / self.width, self.min_lane)
    return self._cut(kv, 0, prefix, lane_len, length, hi)


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


def decode_configs(case_ids: list[str], variants: list[str], rounds: int = 3) -> None:
    """Decode kernel configurations (``_decode_variant``: tile, stages, CTAs per SM, item chunk) against the default,
    each planned for its own grid and tile, alternating rounds of 20 timed runs (PERF.md method); prints each
    configuration's median of round medians, TB/s, its ratio to the first and the largest output difference."""
    import statistics

    import cuinfer.planner.decode_plan as dp
    import torch

    import cuinfer.decode.launch as dec
    import cuinfer.decode.plan as dmod
    from bench import cases, inputs
    from bench.timing import CudaTimer

    timer = CudaTimer()
    by_id = {c.id: c for c in cases.DECODE_CASES}
    spec_of, config_of, plan_of = dec.decode_spec, dmod.decode_config, dp.DecodePlanner.plan

    def spec_with_chunk(key):
        chunk = getattr(key.config, "item_chunk", None)
        return spec_of(key) if chunk is None else _with_define(spec_of, f"-DCUINFER_DECODE_ITEM_CHUNK={chunk}")(key)

    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        s, kv = inp.case.shape, inp.kv
        nbytes = cases.decode_bytes(inp.case.lengths.draw(inp.case.seed), s, inp.case.kv_dtype)
        runs = []
        for name in variants:
            cfg = None if name in ("lanecut", "ctacut") else _decode_variant(name)
            if cfg is not None:
                dmod.decode_config = lambda *a, cfg=cfg, **k: cfg
            if name == "lanecut":
                dp.DecodePlanner.plan = _forced_lane_cut
            if name == "ctacut":
                dp.DecodePlanner.plan = lambda pl, kv, *a: cta_cut_plan(
                    np.asarray(kv, np.int64), pl.h, pl.g, pl.p, pl.gr
                )
            dec.decode_spec = spec_with_chunk
            try:
                w = _decode_wrapper(inp)
                out = w.run(inp.q, kv.cache)  # prepares the launch while the variant is in place
                grid = w._plan.work.num_ctas
            except Exception as exc:  # noqa: BLE001 (a configuration that does not build is reported, not fatal)
                print(f"{cid} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            finally:
                dmod.decode_config, dec.decode_spec, dp.DecodePlanner.plan = config_of, spec_of, plan_of
            runs.append((name, grid, w, out.float()))
        meds: list[list[float]] = [[] for _ in runs]
        for _ in range(rounds):
            for i, (_n, _g, w, _o) in enumerate(runs):
                meds[i].append(timer.time(functools.partial(w.run, inp.q, kv.cache), iters=20, warmup=2).us)
        first = statistics.median(meds[0])
        for (name, grid, _w, out), m in zip(runs, meds, strict=True):
            t = statistics.median(m)
            diff = (out - runs[0][3]).abs().max().item()
            print(f"{cid} {name:14s} grid {grid:4d}: {t:7.2f} us ({nbytes / t / 1e3:5.0f} GB/s) ratio {first / t:.3f} "
                  f"rounds {' '.join(f'{x:.1f}' for x in m)} max |diff| {diff:.1e}", flush=True)  # fmt: skip
        del runs
        torch.cuda.synchronize()
        inputs.free()


def decode_evict(case_ids: list[str], rounds: int = 2) -> None:
    """The decode kernel with its K/V copies forced L2 evict-first against forced evict-normal (the policy picks one
    by the step's K/V bytes, decode.policy.kv_evict_first), alternating in each round; L2 flushed by a write (the
    PERF.md method: the L2 is full of dirty lines) and by a write then a read (clean lines)."""
    import torch

    import cuinfer.decode.launch as dec
    from bench import cases, inputs
    from bench.timing import CudaTimer
    from cuinfer.runtime.device import device_info

    timers = {"dirty": CudaTimer(), "clean": CudaTimer(clean_flush=True)}
    by_id = {c.id: c for c in cases.DECODE_CASES}
    policy = dec.kv_evict_first
    l2 = device_info().l2_bytes
    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        s, kv = inp.case.shape, inp.kv
        nbytes = cases.decode_bytes(inp.case.lengths.draw(inp.case.seed), s, inp.case.kv_dtype)
        runs = {}
        for forced in (True, False):
            dec.kv_evict_first = lambda kv_bytes, l2_bytes, forced=forced: forced
            try:
                w = _decode_wrapper(inp)
                w.run(inp.q, kv.cache)  # prepares this plan's launch (the policy is read once per plan)
            finally:
                dec.kv_evict_first = policy
            runs["evict-first" if forced else "evict-normal"] = functools.partial(w.run, inp.q, kv.cache)
        pick = "evict-first" if policy(nbytes, l2) else "evict-normal"
        for r in range(rounds):
            for name, fn in runs.items():
                for mode, timer in timers.items():
                    t = timer.time(fn, iters=30, warmup=3)
                    print(f"{cid} round {r} {name:12s}{' (policy)' if name == pick else '         '} flush {mode}: "
                          f"{t.us:7.1f} us {nbytes / t.median_s / 1e12:5.3f} TB/s", flush=True)  # fmt: skip
        torch.cuda.synchronize()
        inputs.free()


def _decode_wrapper(inp, use_tensor_cores=None, fixed_split_size=None):
    """A BatchDecode planned for a decode case's inputs (its page table and shape)."""
    import cuinfer

    s, t = inp.case.shape, inp.kv.table
    w = cuinfer.BatchDecode(use_tensor_cores=use_tensor_cores)
    w.plan(t.kv_indptr, t.kv_indices, t.kv_last_page_len, num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads,
           head_dim=s.head_dim, page_size=s.page_size, q_dtype=s.dtype, fixed_split_size=fixed_split_size)  # fmt: skip
    return w


def _fresh_plan_caches(lanes_mod, dp) -> None:
    """Drop the planners' cached structures (an A/B variant that changes how they are built plans from scratch)."""
    from cuinfer.planner import decode_structure

    lanes_mod._EXPANDED.clear()
    decode_structure._STRUCTURES.clear()
    dp.decode_planner.cache_clear()


def _small_decode_cases() -> tuple:
    """Small batches of long requests beside D1-D4 (the small-batch plan's domain), for ``dtrace``."""
    from bench.cases import DecodeCase, Lengths, _us

    return (
        DecodeCase("S1", Lengths("uniform", 8, lo=2000, hi=8000), 101, _us(0), "-"),
        DecodeCase("S2", Lengths("uniform", 24, lo=2000, hi=2600), 102, _us(0), "-"),
        DecodeCase("S3", Lengths("uniform", 3, lo=8000, hi=32000), 103, _us(0), "-"),
    )


SMALL_DECODE_CASES = _small_decode_cases()

DTRACE_VARIANTS = {
    "base": (),
    "no-pf": ("-DCUINFER_DECODE_NO_PLAN_PREFETCH",),
    "fence": ("-DCUINFER_DECODE_MERGE_FENCE",),
    "no-qa": ("-DCUINFER_DECODE_NO_Q_AHEAD",),
    "old": ("-DCUINFER_DECODE_NO_PLAN_PREFETCH", "-DCUINFER_DECODE_MERGE_FENCE"),
    "nomath": ("-DCUINFER_DECODE_NOMATH",),
    "nosplit": (),  # the base build, planned with fixed_split_size = 2**20 (no request split)
    "s2": (),  # the base build with 2 pipeline stages (one tile in flight; more CTAs fit per SM)
    "s4": (),  # ... with 4 stages (one CTA per SM)
    "tileplan": (),  # the base build; small batches planned by the tile pipeline (decode_plan.SMALL_BATCH_ALIGNED off)
}


def decode_trace(case_ids: list[str], variants: list[str], rounds: int = 2) -> None:
    """Where a small decode step's time goes: the tensor-core kernel built with -DCUINFER_DECODE_TRACE (per CTA:
    globaltimer at entry / exit, SM clock at entry, after the prologue's copies are issued, first tile landed, last
    epilogue start, exit) for A/B builds (DTRACE_VARIANTS), timed by the PERF.md method in alternating rounds; plus
    the floors of the same timer: a near-empty kernel and torch.sum over a buffer of each case's K/V bytes."""
    import cuinfer.planner.decode_plan as dp
    import cuinfer.planner.lanes as lanes_mod
    import torch

    import cuinfer.decode.launch as dec
    import cuinfer.decode.plan as dmod
    from bench import cases, inputs
    from bench.timing import CudaTimer

    timer, clean = CudaTimer(), CudaTimer(clean_flush=True)
    by_id = {c.id: c for c in cases.DECODE_CASES + SMALL_DECODE_CASES}
    spec_of, real_params, config_of = dec.decode_spec, dec.DecodeParams, dmod.decode_config
    tbuf = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
    t = timer.time(lambda: torch.cuda._sleep(1), iters=30, warmup=3)
    print(f"floor: near-empty kernel {t.us:.2f} us", flush=True)
    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        s, kv = inp.case.shape, inp.kv
        nbytes = cases.decode_bytes(inp.case.lengths.draw(inp.case.seed), s, inp.case.kv_dtype)
        flat = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        t = timer.time(lambda flat=flat: flat.sum(), iters=30, warmup=3)
        print(f"{cid} floor: torch.sum over {nbytes / 1e6:.0f} MB {t.us:.1f} us {nbytes / t.median_s / 1e12:.3f} TB/s")
        del flat
        runs = {}
        # The traced params stay in place while the case runs: run() repacks them whenever a pointer changes (a new
        # output array), and a trace build given the real params would stamp through lse = NULL.
        dec.DecodeParams = _TracedParams(real_params, tbuf.data_ptr, "lse")
        try:
            for name in variants:
                defines = ("-DCUINFER_DECODE_TRACE", *DTRACE_VARIANTS[name])
                dec.decode_spec = lambda key, d=defines: dataclasses.replace(spec_of(key), extra_options=d)
                split = 1 << 20 if name == "nosplit" else None
                stages = {"s2": 2, "s4": 4}.get(name)
                if stages:
                    dmod.decode_config = lambda *a, st=stages, **k: dataclasses.replace(config_of(*a, **k), stages=st)
                dp.SMALL_BATCH_ALIGNED = name != "tileplan"
                _fresh_plan_caches(lanes_mod, dp)
                try:
                    w = _decode_wrapper(inp, use_tensor_cores=True, fixed_split_size=split)
                    w.run(inp.q, kv.cache)  # prepares the launch (kernel, traced params) with the A/B spec in place
                finally:
                    dmod.decode_config = config_of
                    dp.SMALL_BATCH_ALIGNED = True
                    _fresh_plan_caches(lanes_mod, dp)
                runs[name] = (w, functools.partial(w.run, inp.q, kv.cache))
            dec.decode_spec = spec_of
            _dtrace_rounds(cid, runs, rounds, timer, clean, tbuf, nbytes)
        finally:
            dec.decode_spec, dec.DecodeParams = spec_of, real_params
        inputs.free()


def _dtrace_rounds(cid, runs, rounds, timer, clean, tbuf, nbytes) -> None:
    """``rounds`` rounds of every variant of ``runs``: PERF.md timing (``timer``), then phase stamps of five runs after
    the PERF.md flush and five after ``clean``'s write-then-read flush."""
    import torch

    for r in range(rounds):
        for name, (w, fn) in runs.items():
            tm = timer.time(fn, iters=30, warmup=3)
            n = w._plan.work.num_ctas
            for flush, tmr in (("dirty", timer), ("clean", clean)):
                stamps = []
                for _ in range(5):
                    tbuf.zero_()
                    tmr.flush_l2()
                    tmr.head_start()
                    fn()
                    torch.cuda.synchronize()
                    stamps.append(tbuf[: 16 * n].view(n, 16).cpu().numpy().copy())
                head = f"{tm.us:6.1f} us {nbytes / tm.median_s / 1e12:.3f} TB/s" if flush == "dirty" else " " * 22
                print(f"{cid} r{r} {name:8s} {head} | {flush} {_dphases(stamps)}", flush=True)
                print(f"{cid} r{r} {name:8s} {' ' * 22} | {flush} {_dends(stamps)}", flush=True)


DPHASES = ("entry", "range", "items", "pages", "issue", "wait0", "loop", "epi", "exit", "span", "loopmax", "ghz")


def decode_phase_medians(stamps: list) -> dict:
    """The phases of ``dtrace`` stamps (one ``[CTAs, kTraceWords]`` array per run), medians over the runs (us):
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


def _with_define(spec_of, *defines: str):
    """``spec_of`` with its specs built with the extra ``-D`` options ``defines`` (an A/B build)."""
    return lambda key: dataclasses.replace(spec_of(key), extra_options=defines)


class _TracedParams:
    """Stands in for a kernel's parameter struct (PrefillParams, DecodeParams): packs with the trace buffer in place of
    one pointer it does not use in the trace build (mask_indptr, lse)."""

    def __init__(self, real, ptr_of, field: str = "mask_indptr") -> None:
        self._real, self._ptr_of, self._field = real, ptr_of, field

    def pack(self, **kw):
        kw[self._field] = self._ptr_of()
        return self._real.pack(**kw)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _prefill_wrapper(inp):
    import cuinfer

    case, s = inp.case, inp.case.shape
    heads = dict(num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim)
    dt = dict(q_dtype=s.dtype, kv_dtype=s.dtype)
    if case.layout == "paged":
        kv = inp.kv
        w = cuinfer.BatchPrefill(paged=True, kv_layout=s.kv_layout, backend="fa2")
        w.plan(inp.qo_indptr, kv.table.kv_indptr, kv.table.kv_indices, kv.table.kv_last_page_len, **heads,
               page_size=s.page_size, causal=True, **dt)  # fmt: skip
        return w, lambda: w.run(inp.q, kv.cache)
    w = cuinfer.BatchPrefill(paged=False, kv_layout=s.kv_layout, backend="fa2")
    w.plan(inp.qo_indptr, inp.qo_indptr, **heads, causal=True, **dt)
    return w, lambda: w.run(inp.q, inp.k, inp.v)


def trace(case_ids: list[str], out_dir: str | None) -> None:
    """Per-item start/end stamps of the prefill kernel (built with -DCUINFER_TRACE): per-item time against its KV
    tiles (fixed + per-tile cost), the CTAs' idle tail, and the makespan against the mean CTA busy time."""
    import cuinfer.planner.work as work
    import torch

    import cuinfer.prefill.launch as launch_mod
    import cuinfer.prefill.wrapper as prefill_mod
    from bench import cases, inputs
    from bench.lab.tune_prefill import use_spec

    spec_of, real_params = prefill_mod.prefill_spec, launch_mod.PrefillParams
    tbuf = torch.zeros(4 << 20, dtype=torch.int64, device="cuda")
    use_spec(lambda key: dataclasses.replace(spec_of(key), extra_options=("-DCUINFER_TRACE",)))
    launch_mod.PrefillParams = _TracedParams(real_params, tbuf.data_ptr)
    saved = {}
    original = work.assign_items
    try:
        for case in cases.PREFILL_CASES:
            if case.id not in case_ids:
                continue
            inp = inputs.prefill_inputs(case)
            for kind in ("default", "lpt"):
                work.assign_items = original if kind == "default" else _patched_assign(kind)
                w, run = _prefill_wrapper(inp)
                work.assign_items = original
                for _ in range(3):
                    run()
                tbuf.zero_()
                torch.cuda.synchronize()
                run()
                torch.cuda.synchronize()
                wp = w._plan.work
                n = wp.n_items
                t = tbuf[: 12 * n].view(n, 12).cpu().numpy()
                tiles = -(-(wp.item_kv_end.astype(np.int64) - wp.item_kv_start) // w._plan.config.tile_kv)
                tag = f"{case.id}-{kind}"
                saved[tag] = np.concatenate([t, tiles[:, None]], axis=1)
                _report(tag, t, tiles, wp.num_ctas)
            inputs.free()
    finally:
        use_spec(spec_of)
        launch_mod.PrefillParams = real_params
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
    # Phases from thread 0's SM clock (cross-item kernels): start -> loop (table, prologue) -> first tile ready ->
    # loop end -> o stored -> next item's copies issued; cycles to us by the items' own timer / clock ratio.
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


if __name__ == "__main__":
    import os

    args = sys.argv[1:] or ["prefill", "decode"]
    if "trace" in args:
        trace(["P1", "P2", "P3", "P6"], os.environ.get("OUT"))
    if "cut" in args:
        decode_cut(["D5", "D6", "D7", "D8", "D1"])
    if "decode" in args:
        decode(["D1", "D2", "D3", "D4"])
    if "dtrace" in args:
        decode_trace(os.environ.get("CUINFER_TUNE_CASES", "D1,D2,D3,D4,D5").split(","),
                     os.environ.get("CUINFER_DTRACE", ",".join(DTRACE_VARIANTS)).split(","),
                     int(os.environ.get("CUINFER_TUNE_ROUNDS", "2")))  # fmt: skip
    if "dab" in args:
        decode_ab(os.environ.get("CUINFER_TUNE_CASES", "D1,D2,D3,D4,D5,D6,D7,D8,D9").split(","),
                  tuple(os.environ["CUINFER_DAB_DEFINES"].split()),
                  int(os.environ.get("CUINFER_TUNE_ROUNDS", "3")))  # fmt: skip
    if "dcfg" in args:
        decode_configs(os.environ.get("CUINFER_TUNE_CASES", "D1,D2,D3,D4,D5,D6,D7,D8,D9").split(","),
                       os.environ.get("CUINFER_DCFG", "default;2,2,3,0,32;2,1,3,0,32").split(";"),
                       int(os.environ.get("CUINFER_TUNE_ROUNDS", "3")))  # fmt: skip
    if "evict" in args:
        decode_evict(["D1", "D2", "D3", "D4", "D5", "D6", "D7", "D8", "D9"])
    if "pool" in args:
        pool(os.environ.get("CUINFER_TUNE_CASES", "P1,P2,P3,P4,P5,P6").split(","),
             [float(x) for x in os.environ.get("CUINFER_POOL_SHARES", "0,0.02,0.04,0.08").split(",")],
             int(os.environ.get("CUINFER_TUNE_ROUNDS", "3")))  # fmt: skip
    if "prefill" in args:
        prefill(os.environ.get("CUINFER_TUNE_CASES", "P1,P2,P3,P4,P5,P6").split(","))
