"""Lab: where ``backend="auto"`` should stop picking the Hopper prefill kernel. Batches of appends (B requests of L new
query tokens over 2048 cached keys each, ragged causal bf16, 32 / 8 heads, d128) timed on the FA2-class kernel and on
the sm90 kernel in alternation, twice (bench method: L2 flushed, medians; the lower of the two
medians shown); the sm90 kernel's 128-row items are filled to
``sm90.row_fill`` (L / 128 rounded up), which ``sm90.AUTO_MIN_ROW_FILL`` thresholds.

    python -m bench.lab.sm90_auto_crossover [--batch 64] [--lens 16,32,64,96,128,192,256,512]      (GPU machine)
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab.sm90_auto_crossover", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--kv", type=int, default=2048)
    p.add_argument("--lens", default="16,32,64,96,112,128,192,256,512")
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args(argv)
    import cuinfer
    from bench.timing import CudaTimer, cuda_torch
    from cuinfer.prefill import sm90

    torch = cuda_torch()
    timer = CudaTimer()
    hq, hkv, d, b = 32, 8, 128, args.batch
    print(f"{'L':>5s} {'fill':>5s} {'fa2 us':>9s} {'sm90 us':>9s} {'fa2/sm90':>8s}  (batch {b}, kv {args.kv})")
    for L in (int(x) for x in args.lens.split(",")):
        qo = np.arange(b + 1, dtype=np.int32) * L
        kvi = np.arange(b + 1, dtype=np.int32) * args.kv
        q = torch.randn(int(qo[-1]), hq, d, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(int(kvi[-1]), hkv, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn_like(k)
        us = {}
        for rep in range(2):
            for backend in ("fa2", "sm90") if rep == 0 else ("sm90", "fa2"):
                w = cuinfer.BatchPrefill(paged=False, backend=backend)
                w.plan(qo, kvi, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, causal=True, q_dtype="bfloat16")
                t = timer.time(lambda w=w, q=q, k=k, v=v: w.run(q, k, v), iters=args.iters, warmup=5)
                us.setdefault(backend, []).append(t.us)
        fa2, s90 = min(us["fa2"]), min(us["sm90"])
        print(f"{L:5d} {sm90.row_fill(qo):5.2f} {fa2:9.1f} {s90:9.1f} {fa2 / s90:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
