"""Lab: does a prefill row's place in the suite change its time? The suite measures backend="auto", then "fa2", then
"sm90"; on P3 / P5 / P6 the auto row (which runs the same sm90 launches: same plan, same parameters) came out 2-7 %
slower than the sm90 row. This times wrappers of the listed backends on one case in alternating order, rounds of the
suite's method (median of 30, L2 flushed), with a second "auto" wrapper made last.

    python -m bench.lab.order_probe [--cases P3,P6] [--rounds 4]
"""

from __future__ import annotations

import argparse

from bench import inputs
from bench.cases import PREFILL_CASES
from bench.prefill import prepare_cuinfer
from bench.timing import CudaTimer

ROWS = (("auto", "auto"), ("fa2", "fa2"), ("sm90", "sm90"), ("auto2", "auto"))  # (row name, backend), made in order


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="P3,P6")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    timer = CudaTimer()
    for cid in args.cases.split(","):
        case = next(c for c in PREFILL_CASES if c.id == cid)
        inp = inputs.prefill_inputs(case)
        rows = {name: prepare_cuinfer(inp, backend) for name, backend in ROWS}
        times: dict[str, list[float]] = {name: [] for name in rows}
        for r in range(args.rounds):
            order = list(rows) if r % 2 == 0 else list(rows)[::-1]
            for name in order:
                times[name].append(timer.time(rows[name].run, iters=30, warmup=5).us)
            print(cid, "round", r, " ".join(f"{n} {times[n][-1]:.1f}" for n in order), flush=True)
        print(cid, "median µs:", " ".join(f"{n} {sorted(t)[len(t) // 2]:.1f}" for n, t in times.items()), flush=True)
        inputs.free()


if __name__ == "__main__":
    main()
