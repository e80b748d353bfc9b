"""Tuning sweep for merge_states (unroll x min blocks per SM) on the M1 shape; prints GB/s per variant (lab code: it
picked the constants of cuinfer/merge/specs.py; not a standard suite).

python -m bench.lab.tune_merge [--variants 4x1,4x4,8x2]   (GPU machine)

Each variant is the shipped merge module with its ``merge_states`` instance at another unroll and launch bound
(``VARIANTS``), launched with 1, 4 and 16 waves of CTAs; fp16 states, L2 flushed before every timed run.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from cuinfer.merge.specs import THREADS, MergeStatesParams, merge_spec

# (unroll, min blocks per SM)
VARIANTS = ((4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 3), (2, 4))
ROWS, STATES, HEADS, HEAD_DIM = 16384, 8, 32, 128


def variant_spec(unroll: int, min_blocks: int, head_dim: int = HEAD_DIM):
    """``(spec, name_expr)`` of the fp16 ``merge_states`` instance at this unroll and launch bound."""
    expr = f"cuinfer::merge_states<half, {head_dim}, {THREADS}, {unroll}, {min_blocks}>"
    spec = dataclasses.replace(merge_spec("float16", head_dim), name=f"lab-tune/{unroll}/{min_blocks}",
                               name_exprs=(expr,))  # fmt: skip
    return spec, expr


def states_params(o: int, lse: int, out: int, out_lse: int, rows: int, states: int, heads: int, d: int):
    """The ``MergeStatesParams`` of contiguous ``o [rows, states, heads, d]`` / ``lse [rows, states, heads]`` merged
    into ``out [rows, heads, d]`` / ``out_lse [rows, heads]`` (device pointers)."""
    return MergeStatesParams.pack(
        o_in=o, lse_in=lse, o=out, lse=out_lse, num_rows=rows, num_heads=heads, num_states=states,
        o_in_s0=states * heads * d, o_in_s1=heads * d, o_in_s2=d,
        lse_in_s0=states * heads, lse_in_s1=heads, lse_in_s2=1,
        o_s0=heads * d, o_s1=d, lse_s0=heads, lse_s1=1,
    )  # fmt: skip


def main(variants=VARIANTS) -> None:
    import cupy as cp

    from cuinfer.jit import get_kernel

    rows, states, heads, d = ROWS, STATES, HEADS, HEAD_DIM
    rng = np.random.default_rng(0)
    o = cp.asarray(rng.standard_normal((rows, states, heads, d), dtype=np.float32)).astype(cp.float16)
    lse = cp.asarray(rng.standard_normal((rows, states, heads), dtype=np.float32))
    out = cp.empty((rows, heads, d), cp.float16)
    out_lse = cp.empty((rows, heads), cp.float32)
    flush = cp.empty(512 << 20, cp.uint8)
    nbytes = o.nbytes + lse.nbytes + out.nbytes + out_lse.nbytes
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    p = states_params(o.data.ptr, lse.data.ptr, out.data.ptr, out_lse.data.ptr, rows, states, heads, d)
    for unroll, minb in variants:
        spec, expr = variant_spec(unroll, minb, d)
        k = get_kernel(spec, expr)
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.tune_merge", description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(f"{u}x{m}" for u, m in VARIANTS),
                    help="unroll x min blocks per SM, comma-separated (default: all of VARIANTS)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        args.variants = tuple(tuple(int(x) for x in v.split("x")) for v in args.variants.split(","))
    except ValueError:
        ap.error(f"--variants: give UNROLLxMINBLOCKS,... (e.g. 4x4,8x2), not {args.variants!r}")
    if any(len(v) != 2 for v in args.variants):
        ap.error("--variants: give UNROLLxMINBLOCKS,... (e.g. 4x4,8x2)")
    return args


if __name__ == "__main__":
    main(parse_args().variants)
