"""Tuning sweep for batch decode: the split size per standard case, with plan statistics (GPU machine; lab code: it
picked the split policy's constants; not a standard suite).

python -m bench.lab.tune_decode [D1 D4 D5 D8 ...] [--splits auto,none,256,512,...]

Each case is planned with the policy's split (``auto``), no split (``none``) and every fixed split size given
(``fixed_split_size=`` of plan()), and timed by the docs/benchmarks.md method.
"""

from __future__ import annotations

import argparse

import numpy as np

SPLITS = "auto,none,256,512,1024,2048,4096"


def plan_stats(work) -> str:
    """CTAs, items, chunk, merged rows, the balance of the CTAs' KV tokens (+64 per item) and the assignment mode."""
    loads = np.zeros(work.num_ctas)
    cta = np.repeat(np.arange(work.num_ctas), np.diff(work.work_indptr[: work.num_ctas + 1]))
    np.add.at(loads, cta, work.item_kv_end[: cta.shape[0]] - work.item_kv_start[: cta.shape[0]] + 64)
    return (f"ctas {work.num_ctas} items {work.n_items} chunk {work.chunk_size} merge {work.n_merge} "
            f"balance {loads.mean() / max(loads.max(), 1):.3f} mode {work.assign_mode}")  # fmt: skip


def split_size(text: str) -> int | None:
    """``fixed_split_size`` of a --splits entry: ``auto`` None (the policy), ``none`` 2**20 (no split), else tokens."""
    if text == "auto":
        return None
    return 1 << 20 if text == "none" else int(text)


def main(case_ids: list[str], splits: list[int | None]) -> None:
    from bench import cases, inputs
    from bench.lab.harness import planned_decode
    from bench.timing import CudaTimer

    timer = CudaTimer()
    by_id = {c.id: c for c in cases.DECODE_CASES}
    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        case = inp.case
        nbytes = cases.decode_bytes(case.lengths.draw(case.seed), case.shape, case.kv_dtype)
        for split in splits:
            try:
                w, run = planned_decode(inp, use_tensor_cores=True, fixed_split_size=split)
                t = timer.time(run, iters=25, warmup=3)
                print(f"{cid} split {str(split):8s} {t.us:7.1f} us (min {t.min_s * 1e6:6.1f}) "
                      f"{nbytes / t.median_s / 1e9:6.0f} GB/s  {plan_stats(w._plan.work)}", flush=True)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 (a split the plan refuses is reported, not fatal)
                print(f"{cid} split {split}: {type(exc).__name__}: {str(exc)[:150]}", flush=True)
        inputs.free()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench.cases import DECODE_CASES

    ap = argparse.ArgumentParser(prog="python -m bench.lab.tune_decode", description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=["D1", "D2", "D4", "D5", "D8"], help="decode case ids")
    ap.add_argument("--splits", default=SPLITS, help=f"split sizes: auto, none or tokens (default {SPLITS})")
    args = ap.parse_args(argv)
    known = {c.id for c in DECODE_CASES}
    bad = [c for c in args.cases if c not in known]
    if bad:
        ap.error(f"unknown decode case(s) {', '.join(bad)}; one of {', '.join(sorted(known))}")
    try:
        args.splits = [split_size(x) for x in args.splits.split(",")]
    except ValueError:
        ap.error(f"--splits: auto, none or a number of tokens, not {args.splits!r}")
    return args


if __name__ == "__main__":
    a = parse_args()
    main(a.cases, a.splits)
