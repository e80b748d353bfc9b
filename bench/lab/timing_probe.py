"""Lab: one decode case timed under variants of the bench method, to see what the method itself adds (GPU machine).

    python -m bench.lab.timing_probe D10 D6

Rows: the docs/benchmarks.md method (L2 flushed by a 512 MB write, ~1 ms head start); a clean flush (the write, then
a read: the L2 holds clean lines); no flush; back-to-back runs in one event pair (mean). Medians of 30 runs.
"""

from __future__ import annotations

import sys


def main(case_ids: list[str]) -> None:
    from bench import cases, inputs
    from bench.decode import prepare_cuinfer
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    dirty, clean = CudaTimer(), CudaTimer(clean_flush=True)
    by_id = {c.id: c for c in cases.DECODE_CASES}
    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        run = prepare_cuinfer(inp, True).run
        rows = {
            "method (dirty flush)": dirty.time(run, iters=30, warmup=3).us,
            "clean flush": clean.time(run, iters=30, warmup=3).us,
            "no flush": dirty.time(run, iters=30, warmup=3, flush=False).us,
        }
        n = 20
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dirty.flush_l2()
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        rows[f"{n} back to back (mean)"] = start.elapsed_time(end) * 1e3 / n
        for name, us in rows.items():
            print(f"{cid:8s} {name:28s} {us:8.1f} us", flush=True)
        inputs.free()


if __name__ == "__main__":
    main(sys.argv[1:] or ["D10", "D6"])
