"""Tuning sweep for merge_states (unroll x min blocks per SM) on the M1 shape; prints GB/s per variant.

python -m bench.lab.tune_merge   (GPU machine). Not part of the standard suites: it picks constants for merge/specs.py.
"""

from __future__ import annotations

import dataclasses

import cupy as cp
import numpy as np

from cuinfer.jit import get_kernel
from cuinfer.merge.specs import THREADS, MergeStatesParams, merge_spec


def main() -> None:
    rows, states, heads, d = 16384, 8, 32, 128
    rng = np.random.default_rng(0)
    o = cp.asarray(rng.standard_normal((rows, states, heads, d), dtype=np.float32)).astype(cp.float16)
    lse = cp.asarray(rng.standard_normal((rows, states, heads), dtype=np.float32))
    out = cp.empty((rows, heads, d), cp.float16)
    out_lse = cp.empty((rows, heads), cp.float32)
    flush = cp.empty(512 << 20, cp.uint8)
    nbytes = o.nbytes + lse.nbytes + out.nbytes + out_lse.nbytes
    base = merge_spec("float16", d)
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    for unroll, minb in ((4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 3), (2, 4)):
        expr = f"cuinfer::merge_states<half, {d}, {THREADS}, {unroll}, {minb}>"
        spec = dataclasses.replace(base, name=f"tune/{unroll}/{minb}", name_exprs=(expr,))
        k = get_kernel(spec, expr)
        p = MergeStatesParams.pack(
            o_in=o.data.ptr, lse_in=lse.data.ptr, o=out.data.ptr, lse=out_lse.data.ptr,
            num_rows=rows, num_heads=heads, num_states=states,
            o_in_s0=states * heads * d, o_in_s1=heads * d, o_in_s2=d,
            lse_in_s0=states * heads, lse_in_s1=heads, lse_in_s2=1,
            o_s0=heads * d, o_s1=d, lse_s0=heads, lse_s1=1,
        )  # fmt: skip
        rpb = THREADS // (d // 8)
        occ = k.max_active_blocks(THREADS)
        for waves in (1, 4, 16):
            grid = min(-(-rows * heads // rpb), waves * occ * sms)
            ts = []
            for _ in range(25):
                flush.fill(1)
                s, e = cp.cuda.Event(), cp.cuda.Event()
                s.record()
                k.launch(grid, THREADS, (p,), stream=cp.cuda.get_current_stream().ptr)
                e.record()
                e.synchronize()
                ts.append(cp.cuda.get_elapsed_time(s, e) * 1e-3)
            t = float(np.median(ts[5:]))
            r = k.resources
            print(f"unroll {unroll} minblocks {minb} regs {r.registers} occ {occ} grid {grid:6d}: "
                  f"{t * 1e6:7.1f} us {nbytes / t / 1e9:7.0f} GB/s")  # fmt: skip


if __name__ == "__main__":
    main()
