"""Host time of the public plan() on docs/benchmarks.md's plan cases (decode batch 128: D6, D8, D9; paged prefill
batch 64).

Each case times ``BatchDecode.plan`` / ``BatchPrefill.plan`` without a GPU (validation, options, tile policy, grid,
planner) plus the packing of plan and page table into a NumPy stand-in for the pinned buffer, and prints the median. CI
machines are shared, so the assertion is only a generous bound (5x docs/benchmarks.md's target: a 10x regression fails);
``python -m bench.plan_host`` measures properly (more calls, trials, percentiles).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench.plan_host import PUBLIC_CASES, calibrate, lengths, public_step

SLACK = 5.0


@pytest.mark.parametrize(
    "name, kind, largs, target", [pytest.param(*c, id=c[0].split()[0]) for c in PUBLIC_CASES]
)  # fmt: skip
def test_public_plan_time(name, kind, largs, target, capsys):
    step, w = public_step(kind, lengths(*largs), largs[3])
    for _ in range(50):
        step()
    ts = np.empty(300, dtype=np.int64)
    for i in range(ts.shape[0]):
        t0 = time.perf_counter_ns()
        step()
        ts[i] = time.perf_counter_ns() - t0
    median = float(np.median(ts)) / 1000.0
    with capsys.disabled():
        print(f"\n{name}: plan() + pack median {median:.1f} us (target {target:.0f} us; host NumPy call "
              f"{calibrate(500):.2f} us, quiet ~1.1)", end="")  # fmt: skip
    assert median <= SLACK * target, (
        f"{name}: plan() + pack takes {median:.0f} us, over {SLACK:.0f}x the {target:.0f} us target: a regression "
        "(profile with python -m bench.plan_host and cProfile)"
    )
    assert w._plan.work.n_items > 0
