"""Lab: does an fp8 decode stream faster when a CTA reads two KV heads' rows together (256 B) instead of one (128 B)?

python -m bench.lab.fp8_headpair_probe [ROUNDS]   (GPU machine)

D10's NHD cache ``[pages, 2, 16, 8, 128]`` e4m3 puts one KV head's row of a token in 128 bytes, 1 KB from the next
token's. The same bytes viewed as ``[pages, 2, 16, 4, 256]`` are pairs of heads: 256-byte rows, the shape bf16 D6's
kernel reads. A decode over the pair view with each query zero-padded to 256 dims (head 2j's rows [q, 0], head
2j+1's [0, q]) and the matching half of each output row is exactly D10's attention (zeros add nothing to q·k; the
softmax is over the same keys). It runs today's kernels unchanged (head dim 256, group 8), so timing it beside D10
asks the question without writing a kernel. Rows: D10 as is, D10 over the pair view, and bf16 D6, each by the
docs/benchmarks.md method (dirty flush) and after a clean flush, ROUNDS alternating rounds.
"""

from __future__ import annotations

import math
import sys

import numpy as np


def main(rounds: int) -> None:
    import torch

    import cuinfer
    from bench.cases import DECODE_CASES
    from bench.inputs import decode_inputs
    from bench.timing import CudaTimer

    by_id = {c.id: c for c in DECODE_CASES}
    d10 = decode_inputs(by_id["D10"])
    s, kv = d10.case.shape, d10.kv
    b, hq, d = d10.q.shape
    hkv = s.num_kv_heads
    g = hq // hkv
    sm_scale = 1.0 / math.sqrt(d)

    def decoder(q, cache, heads_kv, dim, kv_dtype):
        w = cuinfer.BatchDecode(kv_layout="NHD")
        w.plan(kv.table.kv_indptr, kv.table.kv_indices, kv.table.kv_last_page_len, num_qo_heads=q.shape[1],
               num_kv_heads=heads_kv, head_dim=dim, page_size=s.page_size, q_dtype=s.dtype, kv_dtype=kv_dtype,
               sm_scale=sm_scale)  # fmt: skip
        return w, (lambda: w.run(q, cache))

    # the pair view: q' [b, hkv/2, 2, g, 2d] block-diagonal, the cache's bytes as [pages, 2, 16, hkv/2, 2d]
    qp = torch.zeros((b, hkv // 2, 2, g, 2 * d), dtype=d10.q.dtype, device="cuda")
    q5 = d10.q.view(b, hkv // 2, 2, g, d)
    qp[:, :, 0, :, :d] = q5[:, :, 0]
    qp[:, :, 1, :, d:] = q5[:, :, 1]
    qp = qp.view(b, hq, 2 * d)
    cache_p = kv.cache.view(kv.cache.shape[0], 2, s.page_size, hkv // 2, 2 * d)

    w_a, run_a = decoder(d10.q, kv.cache, hkv, d, "float8_e4m3fn")
    w_b, run_b = decoder(qp, cache_p, hkv // 2, 2 * d, "float8_e4m3fn")
    o_a = run_a().float()
    ob = run_b().float().view(b, hkv // 2, 2, g, 2 * d)
    o_b = torch.stack((ob[:, :, 0, :, :d], ob[:, :, 1, :, d:]), dim=2).reshape(b, hq, d)
    err = (o_a - o_b).abs().max().item()
    print(f"pair view against D10: max |o| difference {err:.3e} (o max {o_a.abs().max().item():.3f})")
    for name, w in (("D10", w_a), ("pair", w_b)):
        work = w._plan.work
        print(f"{name}: {work.num_ctas} CTAs, {work.n_items} items")

    d6 = decode_inputs(by_id["D6"])
    _, run_6 = decoder(d6.q, d6.kv.cache, hkv, d, None)

    rows = {"D10": run_a, "D10 pair view": run_b, "D6 bf16": run_6}
    res: dict[tuple[str, str], list[float]] = {}
    for flush in ("dirty", "clean"):
        timer = CudaTimer(clean_flush=flush == "clean")
        for r in range(rounds):
            for name, fn in rows.items():
                us = timer.time(fn, iters=30, warmup=5).us
                res.setdefault((name, flush), []).append(us)
                print(f"round {r} {flush} {name}: {us:.2f} us", flush=True)
        del timer
        torch.cuda.empty_cache()
    print("\nmedians over rounds")
    for flush in ("dirty", "clean"):
        t10, tp, t6 = (float(np.median(res[(n, flush)])) for n in rows)
        print(
            f"{flush}: D10 {t10:.2f} us ({t6 / t10:.3f}x D6), pair view {tp:.2f} us ({t6 / tp:.3f}x D6, "
            f"{t10 / tp:.3f}x D10), D6 {t6:.2f} us"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
