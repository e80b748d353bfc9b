"""Lab: why D10 timed 145.8 µs in fp8_headpair_probe but 148.5 µs in the decode suite on the same day (2026-12-04).

python -m bench.lab.d10_setup_probe   (GPU machine)

Times cuinfer's D10 (and D6 beside it) by the suite's own path (bench.decode.prepare_cuinfer, CudaTimer, 30 runs
after 5) under the setups the two scripts differ in, one at a time: the flush buffer allocated before or after the
inputs, fresh input allocations, a second timer (a new flush buffer), and right after the suite's roofline
(copy and matmul). Each line carries the SM and memory clocks nvidia-smi read just before it.
"""

from __future__ import annotations

import subprocess
import time

import numpy as np


def clocks() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return out.stdout.strip()
    except Exception as ex:  # (a probe: the clocks are context, not the result)
        return f"no nvidia-smi ({ex})"


def main() -> None:
    import torch

    from bench.cases import DECODE_CASES
    from bench.decode import prepare_cuinfer
    from bench.inputs import decode_inputs
    from bench.timing import CudaTimer, measure_roofline

    by_id = {c.id: c for c in DECODE_CASES}
    t_start = time.time()

    def timed(label: str, timer, prepared, reps: int = 3) -> None:
        c = clocks()
        us = [timer.time(prepared.run, iters=30, warmup=5).us for _ in range(reps)]
        print(f"{time.time() - t_start:6.1f} s  {label:<44} {np.median(us):7.2f} us  {us}  [{c}]", flush=True)

    timer = CudaTimer()  # as the suite: the flush buffer first
    d10 = decode_inputs(by_id["D10"])
    p10 = prepare_cuinfer(d10, None)
    timed("D10, timer before inputs (suite order)", timer, p10)
    d6 = decode_inputs(by_id["D6"])
    p6 = prepare_cuinfer(d6, None)
    timed("D6", timer, p6)
    timed("D10 again", timer, p10)
    timer2 = CudaTimer()  # a second flush buffer, allocated after the inputs (the headpair probe's order)
    timed("D10, flush buffer after inputs", timer2, p10)
    timed("D6, flush buffer after inputs", timer2, p6)
    del timer2
    del p10, d10
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    d10 = decode_inputs(by_id["D10"])
    p10 = prepare_cuinfer(d10, None)
    timed("D10, inputs allocated again", timer, p10)
    measure_roofline(timer)
    timed("D10 right after the roofline", timer, p10)
    time.sleep(10)
    timed("D10 after 10 s idle", timer, p10)
    timed("D6 after 10 s idle", timer, p6)
    # the headpair probe's exact order in a fresh set: inputs first, then a timer
    del p10, d10, p6, d6, timer
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    d10 = decode_inputs(by_id["D10"])
    p10 = prepare_cuinfer(d10, None)
    d6 = decode_inputs(by_id["D6"])
    p6 = prepare_cuinfer(d6, None)
    timer = CudaTimer()
    for r in range(3):
        timed(f"headpair order round {r}: D10", timer, p10, reps=1)
        timed(f"headpair order round {r}: D6", timer, p6, reps=1)


if __name__ == "__main__":
    main()
