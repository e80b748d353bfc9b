"""Micro-benchmark of the host plan path, no GPU needed: ``python -m bench.plan_host``.

Two tables. *planner*: KV lengths from ``kv_indptr`` / ``kv_last_page_len`` (decode; prefill also takes ``qo_indptr``),
``plan_work``, and ``pack`` into an int32 buffer whose layout was fixed up front from ``capacity_bound`` (CUDA-graph
mode), with the assignment mode, chunk size and balance achieved. *public plan()*: the whole public call
``BatchDecode.plan`` / ``BatchPrefill.plan`` (validation, options, tile policy, grid, planner) plus the packing of plan
and page table into a NumPy stand-in for the pinned buffer, for docs/benchmarks.md's plan targets, and for decode also a
serving loop (every length one token longer per step: the decode plan's cached structure is rebuilt when a cut crosses a
request edge). Medians, 10th and 90th percentiles of single calls (``time.perf_counter_ns``) after warm-up.

Shapes: Llama-3.1-8B (32 query heads, 8 KV heads: group 4), page size 16, ``num_ctas`` = 132 SMs x 2. Lengths and
page tables are the standard cases' (``bench.cases.Lengths``, ``bench.cases.page_table``, same seeds).

Targets (docs/benchmarks.md): decode batch 128 <= 50 us median, prefill batch 64 <= 80 us. The host is shared and small,
so run-to-run noise of 1.5-2x is normal here; ``--trials`` repeats each case and keeps the best median.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from cuinfer.planner.cost import DEFAULT_COST, CostModel
from cuinfer.planner.layout import PlanLayout, capacity_bound, pack
from cuinfer.planner.tiles import kv_lens_from_pages, qo_lens_from_indptr
from cuinfer.planner.work import plan_work

from bench.cases import Lengths
from bench.cases import page_table as paged_table

NUM_QO_HEADS, NUM_KV_HEADS, PAGE = 32, 8, 16


def lengths(dist: str, batch: int, mean: int, seed: int, lo: int = 0, hi: int = 0) -> np.ndarray:
    """The lengths of ``bench.cases.Lengths(dist, batch, mean, lo, hi)`` drawn with ``seed``."""
    return Lengths(dist, batch, mean, lo, hi).draw(seed)


# (name, kind, lengths args) -- decode batch 1/16/128/256 and the prefill batch of 64
CASES = (
    ("D4 decode 1 x 32768", "decode", ("const", 1, 32768, 4)),
    ("D1 decode 16 x 1024", "decode", ("const", 16, 1024, 1)),
    ("D3 decode 16 zipf 1024", "decode", ("zipf", 16, 1024, 3)),
    ("D6 decode 128 x 2048", "decode", ("const", 128, 2048, 6)),
    ("D8 decode 128 onelong 1024", "decode", ("onelong", 128, 1024, 8)),
    ("D9 decode 128 zipf 2048", "decode", ("zipf", 128, 2048, 9)),
    ("decode 128 uniform[512,4096]", "decode", ("uniform", 128, 0, 11, 512, 4096)),
    ("D7 decode 256 x 1024", "decode", ("const", 256, 1024, 7)),
    ("P64 prefill 64 uniform[512,2048]", "prefill", ("uniform", 64, 0, 301, 512, 2048)),
)


def _case_inputs(kind: str, lens: np.ndarray):
    pages = -(-lens // PAGE)
    kv_indptr = np.zeros(lens.shape[0] + 1, dtype=np.int32)
    kv_indptr[1:] = np.cumsum(pages)
    last = (lens - (pages - 1) * PAGE).astype(np.int32)
    qo_indptr = None
    if kind == "prefill":
        qo_indptr = np.zeros(lens.shape[0] + 1, dtype=np.int32)
        qo_indptr[1:] = np.cumsum(lens)
    return kv_indptr, last, qo_indptr


def run_case(kind: str, lens: np.ndarray, *, num_ctas: int, reps: int, trials: int) -> dict:
    g = NUM_QO_HEADS // NUM_KV_HEADS
    kv_indptr, last, qo_indptr = _case_inputs(kind, lens)
    decode = kind == "decode"
    tile_rows = 16 if decode else 128
    kw = dict(num_kv_heads=NUM_KV_HEADS, group_size=g, tile_rows=tile_rows, num_ctas=num_ctas, kv_granule=PAGE)
    if decode:
        cap = capacity_bound(lens.shape[0], lens.shape[0], NUM_KV_HEADS, g, tile_rows, num_ctas)
    else:
        cap = capacity_bound(lens.shape[0], int(lens.sum()), NUM_KV_HEADS, g, tile_rows, num_ctas)
    layout = PlanLayout.for_capacity(cap.max_items, cap.max_ctas, cap.max_merge, cap.max_merge_src)
    buf = layout.empty()

    def step():
        kv = kv_lens_from_pages(kv_indptr, last, PAGE)
        qo = None if decode else qo_lens_from_indptr(qo_indptr)
        plan = plan_work(qo, kv, causal=not decode, **kw)
        pack(plan, layout, buf)
        return plan

    plan = step()
    best = time_calls(step, reps, trials)
    balance, eff = plan_balance(plan, lens if not decode else None, g, tile_rows)
    return dict(
        median=best[0], p10=best[1], p90=best[2], mode=plan.assign_mode, chunk=plan.chunk_size,
        items=plan.n_items, merge=plan.n_merge, balance=balance, efficiency=eff,
    )  # fmt: skip


def item_costs(plan, qo_lens, group_size: int, tile_rows: int, cost: CostModel = DEFAULT_COST) -> np.ndarray:
    """Each item's cost under the cost model (CTA-major, float64): its rows, KV tokens, fixed cost and, when split,
    the partial rows it writes (``qo_lens`` None: decode, one query token per request)."""
    rows = _item_rows(plan, qo_lens, group_size, tile_rows)
    kv = plan.item_kv_end.astype(np.float64) - plan.item_kv_start
    split = plan.item_partial >= 0
    return cost.alpha * rows + cost.gamma + cost.beta * kv + cost.partial_row * rows * split


def plan_balance(plan, qo_lens, group_size: int, tile_rows: int, cost: CostModel = DEFAULT_COST):
    """``(balance, efficiency)`` of a plan under the cost model: balance = mean / max CTA load; efficiency = the
    unsplit work spread evenly over the CTAs (the ideal) / (max load + the merge's fixed cost if anything is split)."""
    rows = _item_rows(plan, qo_lens, group_size, tile_rows)
    kv = plan.item_kv_end.astype(np.float64) - plan.item_kv_start
    split = plan.item_partial >= 0
    base = cost.alpha * rows + cost.gamma
    costs = item_costs(plan, qo_lens, group_size, tile_rows, cost)
    cta = np.repeat(np.arange(plan.num_ctas), np.diff(plan.work_indptr))
    loads = np.bincount(cta, weights=costs, minlength=plan.num_ctas)
    ideal = float(costs[~split].sum() + cost.beta * kv[split].sum())
    if split.any():  # each split (tile, head) pays its rows and gamma once when unsplit
        key = np.stack([plan.item_req[split], plan.item_qo_tile[split], plan.item_kv_head[split]], axis=1)
        first = np.unique(key, axis=0, return_index=True)[1]
        ideal += float(base[split][first].sum())
    worst = float(loads.max()) + (cost.split_fixed if split.any() else 0.0)
    return float(loads.mean() / loads.max()), ideal / plan.num_ctas / worst


def _item_rows(plan, qo_lens, g: int, br: int) -> np.ndarray:
    if qo_lens is None:
        return np.full(plan.n_items, g, dtype=np.float64)
    req, tile = plan.item_req, plan.item_qo_tile
    total = np.asarray(qo_lens)[req] * g
    return np.minimum(br, total - tile * br).astype(np.float64)


def calibrate(reps: int = 3000) -> float:
    """Median time (us) of one small NumPy call on this host (``np.add.reduce`` of 128 floats): the unit the plan
    path is made of. A quiet 2.1 GHz core of the development VM does it in ~1.1 us; scale the results by it."""
    x = np.arange(128, dtype=np.float64)
    ts = np.empty(reps, dtype=np.int64)
    for i in range(reps):
        t0 = time.perf_counter_ns()
        np.add.reduce(x)
        ts[i] = time.perf_counter_ns() - t0
    return float(np.median(ts)) / 1000.0


# --- the public plan(): what docs/benchmarks.md's plan targets measure ----------------------------------------------

# (name, kind, lengths args, target us): bench/cases.py PLAN_CASES
PUBLIC_CASES = (
    ("plan-D6 decode 128 x 2048", "decode", ("const", 128, 2048, 6), 50.0),
    ("plan-D8 decode 128 onelong 1024", "decode", ("onelong", 128, 1024, 8), 50.0),
    ("plan-D9 decode 128 zipf 2048", "decode", ("zipf", 128, 2048, 9), 50.0),
    ("plan-P64 prefill 64 uniform[512,2048]", "prefill", ("uniform", 64, 0, 301, 512, 2048), 80.0),
)


def page_table(lens: np.ndarray, seed: int):
    """``(kv_indptr, kv_indices, kv_last_page_len)`` int32 of ``lens`` (page 16), as ``bench.cases.page_table``."""
    t = paged_table(lens, PAGE, seed)
    return t.kv_indptr, t.kv_indices, t.kv_last_page_len


def public_step(kind: str, lens: np.ndarray, seed: int, *, steps: int = 1):
    """``(step, wrapper)``: ``step()`` runs the public ``BatchDecode.plan`` / ``BatchPrefill.plan`` (paged, causal,
    Llama-3.1-8B heads, bf16; the host part: without a GPU nothing is uploaded) and packs the plan into a NumPy int32
    buffer standing in for the pinned plan buffer (``_pack_host``: the same packing plan() does on a GPU).
    ``steps > 1`` cycles through that many consecutive batches, every length one token longer than the last (a
    serving loop, where the decode plan's cached structure is sometimes rebuilt)."""
    from cuinfer.decode import BatchDecode  # (imported here: the planner table runs without the runtime)
    from cuinfer.prefill import BatchPrefill

    heads = dict(num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=128, page_size=PAGE)
    tables = [page_table(lens + i, seed) for i in range(steps)]
    qo = [np.concatenate([[0], np.cumsum(lens + i)]).astype(np.int32) for i in range(steps)]
    if kind == "decode":
        w = BatchDecode()
        calls = [lambda t=t: w.plan(*t, **heads, q_dtype="bfloat16") for t in tables]
    else:
        w = BatchPrefill(paged=True)
        calls = [
            lambda t=t, q=q: w.plan(q, *t, **heads, causal=True, q_dtype="bfloat16")
            for t, q in zip(tables, qo, strict=True)
        ]
    calls[0]()
    box = [w._pack_host()]
    turn = [0]

    def step():
        calls[turn[0]]()
        turn[0] = (turn[0] + 1) % steps
        box[0] = w._pack_host(box[0])

    return step, w


def time_calls(fn, reps: int, trials: int) -> np.ndarray:
    """``(median, p10, p90)`` in us of single calls, the trial with the best median."""
    for _ in range(min(200, reps)):
        fn()
    best = None
    for _ in range(trials):
        ts = np.empty(reps, dtype=np.int64)
        for i in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            ts[i] = time.perf_counter_ns() - t0
        us = np.percentile(ts, [50, 10, 90]) / 1000.0
        if best is None or us[0] < best[0]:
            best = us
    return best


def run_public(reps: int, trials: int) -> list:
    """Rows ``(name, (median, p10, p90) of plan()+pack, median of plan() alone, target, mode, items)``."""
    rows = []
    for name, kind, largs, target in PUBLIC_CASES:
        lens = lengths(*largs)
        variants = [(name, 1)] + ([(name.split()[0] + " serving, +1 token/step", 64)] if kind == "decode" else [])
        for label, steps in variants:
            step, w = public_step(kind, lens, largs[3], steps=steps)
            both = time_calls(step, reps, trials)
            work = w._plan.work
            plan_only = time_calls(lambda w=w: w.plan(w._plan.kv_indptr, w._plan.kv_indices, w._plan.kv_last_page_len,
                                                      num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS,
                                                      head_dim=128, page_size=PAGE, q_dtype="bfloat16"),
                                   reps, 1)[0] if kind == "decode" and steps == 1 else float("nan")  # fmt: skip
            rows.append((label, both, plan_only, target, work.assign_mode, work.n_items))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.plan_host", description=__doc__.splitlines()[0])
    ap.add_argument("--ctas", type=int, default=264, help="persistent CTAs (default 264 = 132 SMs x 2)")
    ap.add_argument("--reps", type=int, default=2000, help="timed single calls per trial (default 2000)")
    ap.add_argument("--trials", type=int, default=3, help="trials per case; the best median is kept (default 3)")
    ap.add_argument("--only", choices=("planner", "public"), help="run one of the two tables")
    args = ap.parse_args(argv)
    print(f"host: one small NumPy call = {calibrate():.2f} us (a quiet core of the development VM: ~1.1 us)")
    if args.only != "public":
        print(f"\nplanner: kv lengths from pages + plan_work + pack; {args.ctas} CTAs, page 16; median of {args.reps} "
              f"calls, best of {args.trials} trials")  # fmt: skip
        head = f"{'case':34s} {'median':>8s} {'p10':>7s} {'p90':>7s}  {'mode':8s} {'chunk':>6s} {'items':>6s} "
        print(head + f"{'merge':>6s} {'balance':>8s} {'effic.':>7s}")
        for name, kind, largs in CASES:
            lens = lengths(*largs)
            r = run_case(kind, lens, num_ctas=args.ctas, reps=args.reps, trials=args.trials)
            print(
                f"{name:34s} {r['median']:6.1f}us {r['p10']:5.1f}us {r['p90']:5.1f}us  {r['mode']:8s} "
                f"{r['chunk']:6d} {r['items']:6d} {r['merge']:6d} {r['balance']:8.3f} {r['efficiency']:7.3f}"
            )
    if args.only != "planner":
        print("\npublic plan(): BatchDecode / BatchPrefill.plan() (host part, no GPU: validation, policy, planner) + "
              "packing into a NumPy stand-in for the pinned buffer; 264 CTAs (H200 grid)")  # fmt: skip
        print(f"{'case':40s} {'median':>8s} {'p10':>7s} {'p90':>7s} {'plan()':>8s} {'target':>7s}  {'mode':8s} "
              f"{'items':>6s}")  # fmt: skip
        for label, both, plan_only, target, mode, items in run_public(max(200, args.reps // 4), args.trials):
            p = f"{plan_only:6.1f}us" if plan_only == plan_only else f"{'-':>8s}"
            print(f"{label:40s} {both[0]:6.1f}us {both[1]:5.1f}us {both[2]:5.1f}us {p} {target:5.0f}us  {mode:8s} "
                  f"{items:6d}")  # fmt: skip


if __name__ == "__main__":
    main()
