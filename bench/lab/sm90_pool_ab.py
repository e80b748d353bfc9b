"""Lab: how the Hopper prefill plan deals its items, same-run A/B on the P1-P3 shapes (ragged causal bf16, 32 / 8
heads, d128): the share left to the shared tail (cuinfer.prefill.sm90.POOL_SHARE) with a sorted deal, and the
planner's default deal (linear cut where items are small: SORTED_DEAL False, tagged "lin"); each configuration timed
twice in alternation (bench method: L2 flushed, medians).

    python -m bench.lab.sm90_pool_ab [--shares lin,0.04,0.5,0.95] [--cases P1,P2,P3]      (GPU machine)
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab.sm90_pool_ab", description=__doc__.splitlines()[0])
    p.add_argument("--shares", default="lin,0.04,0.5,0.95")
    p.add_argument("--cases", default="P1,P2,P3")
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args(argv)
    from bench.lab.variant_bench import prefill_rows
    from bench.timing import CudaTimer, cuda_torch
    from cuinfer.prefill import sm90

    torch = cuda_torch()
    timer = CudaTimer()
    rows = []
    for rep in range(2):
        for share in args.shares.split(","):
            sm90.SORTED_DEAL = share != "lin"
            sm90.POOL_SHARE = 0.04 if share == "lin" else float(share)
            for case, _, _, us, rate, _ in prefill_rows(
                timer, torch, args.iters, [], args.cases.split(","), {"causal": {}}, ("sm90",)
            ):
                rows.append((case, share, rep, us, rate))
    print(f"\n{'case':12s} {'deal':>10s} {'rep':>4s} {'us':>9s} {'TFLOP/s':>8s}")
    for case, share, rep, us, rate in sorted(rows):
        print(f"{case:12s} {share:>10s} {rep:4d} {us:9.1f} {rate:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
