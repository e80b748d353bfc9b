"""Where decode and prefill time goes (GPU machine; lab code): host time of run() / plan() under cProfile, and
per-kernel GPU time from the torch profiler (CUPTI sees the kernels CuPy launches too).

python -m bench.lab.profile_decode [D1 P2 ...]   (decode and prefill case ids; default D1 D6 D8)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import numpy as np


def main(case_ids: list[str]) -> None:
    import torch

    from bench import cases, inputs
    from bench.decode import prepare_cuinfer
    from bench.prefill import prepare_cuinfer as prepare_prefill

    decode = {c.id: c for c in cases.DECODE_CASES}
    prefill = {c.id: c for c in cases.PREFILL_CASES}
    for cid in case_ids:
        for tc in (None,):  # (the decode policy's kernel)
            if cid in prefill:
                inp = inputs.prefill_inputs(prefill[cid])
                prep = prepare_prefill(inp, "fa2")
            else:
                inp = inputs.decode_inputs(decode[cid])
                prep = prepare_cuinfer(inp, tc)
            for _ in range(5):
                prep.run()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200):
                prep.run()
            host_run = (time.perf_counter() - t) / 200
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(50):
                prep.plan()
            host_plan = (time.perf_counter() - t) / 50
            print(
                f"== {cid} tc={tc}: host run() {host_run * 1e6:.1f} us (enqueue rate), plan() {host_plan * 1e6:.1f} us"
            )
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(100):
                prep.run()
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
            print("\n".join(s.getvalue().splitlines()[6:24]))
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(50):
                prep.plan()
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
            print("\n".join(s.getvalue().splitlines()[6:22]))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                for _ in range(20):
                    prep.run()
                torch.cuda.synchronize()
            rows = [(e.key, e.count, e.device_time_total / max(e.count, 1)) for e in p.key_averages()]
            for key, count, avg in sorted(rows, key=lambda r: -r[2])[:6]:
                print(f"   gpu {avg:9.1f} us x{count:3d}  {key[:100]}")
        inputs.free()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from bench import cases

    ap = argparse.ArgumentParser(prog="python -m bench.lab.profile_decode", description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=["D1", "D6", "D8"], help="decode or prefill case ids")
    args = ap.parse_args(argv)
    known = {c.id for c in cases.DECODE_CASES + cases.PREFILL_CASES}
    bad = [c for c in args.cases if c not in known]
    if bad:
        ap.error(f"unknown case(s) {', '.join(bad)}; decode or prefill case ids")
    return args


if __name__ == "__main__":
    np.set_printoptions(linewidth=150)
    main(parse_args().cases)
