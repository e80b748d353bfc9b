"""Lab: the attention variants against plain attention (and FlashInfer's, when installed), by the bench method.

    python -m bench.lab.variant_bench [--peers fa2,fa3] [--iters 30]      (GPU machine)

Prefill, P1 shape (ragged 1 x 8192, causal, 32 / 8 heads, d128, bf16): causal, soft cap 30, ALiBi, sliding window
1024, in-kernel RoPE; TFLOP/s count attended (query, key) pairs only (window: ~1025 keys per row). Decode, D6 shape
(128 x 2048, page 16): plain, in-kernel RoPE (`rope_llama`), and a separate rotation of the whole K cache (torch
elementwise ops) followed by plain decode. Times: CUDA events, L2 flushed before every run, medians
(bench/timing.py); every row is measured in this process.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def _pairs_causal(n: int, window: int = -1) -> int:
    rows = np.arange(n)
    lo = np.zeros(n, dtype=np.int64) if window < 0 else np.maximum(rows - window, 0)
    return int((rows - lo + 1).sum())


def prefill_rows(timer, torch, iters: int, peers: list[str]) -> list[tuple]:
    import cuinfer

    n, hq, hkv, d = 8192, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda", generator=g)
    k = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    v = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    qo = kv = np.array([0, n], dtype=np.int32)
    variants = {
        "causal": {},
        "soft cap 30": {"logits_soft_cap": 30.0},
        "alibi": {"pos_encoding": "alibi"},
        "window 1024": {"window_left": 1024},
        "rope (in kernel)": {"pos_encoding": "rope_llama"},
    }
    rows = []
    for name, opts in variants.items():
        w = cuinfer.BatchPrefill(paged=False)
        w.plan(qo, kv, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, causal=True, q_dtype="bfloat16", **opts)
        t = timer.time(lambda w=w: w.run(q, k, v), iters=iters, warmup=5)
        pairs = _pairs_causal(n, opts.get("window_left", -1))
        tflops = 4 * hq * d * pairs / t.median_s / 1e12
        rows.append(("prefill P1", name, "cuinfer", t.us, tflops, f"q{w._plan.config.tile_q}k{w._plan.config.tile_kv}"))
        print(rows[-1], flush=True)
    for backend in peers:
        try:
            import flashinfer
        except ImportError:
            break
        for name, opts in variants.items():
            if name.startswith("rope"):
                continue
            ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            fi = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
            kw = dict(causal=True, q_data_type=torch.bfloat16)
            if "logits_soft_cap" in opts:
                kw["logits_soft_cap"] = opts["logits_soft_cap"]
            if "window_left" in opts:
                kw["window_left"] = opts["window_left"]
            if opts.get("pos_encoding") == "alibi":
                kw["pos_encoding_mode"] = "ALIBI"
            try:
                qi = torch.tensor(qo, device="cuda")
                fi.plan(qi, qi, hq, hkv, d, **kw)
                t = timer.time(lambda fi=fi: fi.run(q, k, v), iters=iters, warmup=5)
            except Exception as ex:  # noqa: BLE001 - a peer that cannot run a variant is a row, not a crash
                rows.append(("prefill P1", name, f"flashinfer-{backend}", float("nan"), float("nan"), str(ex)[:60]))
                print(rows[-1], flush=True)
                continue
            pairs = _pairs_causal(n, opts.get("window_left", -1))
            rows.append(("prefill P1", name, f"flashinfer-{backend}", t.us, 4 * hq * d * pairs / t.median_s / 1e12, ""))
            print(rows[-1], flush=True)
    return rows


def decode_rows(timer, torch, iters: int) -> list[tuple]:
    import cuinfer

    b, n, ps, hq, hkv, d = 128, 2048, 16, 32, 8, 128
    pages = n // ps
    num_pages = b * pages
    rng = np.random.default_rng(0)
    indptr = (np.arange(b + 1) * pages).astype(np.int32)
    indices = rng.permutation(num_pages).astype(np.int32)
    last = np.full(b, ps, dtype=np.int32)
    g = torch.Generator(device="cuda").manual_seed(1)
    cache = torch.randn(num_pages, 2, ps, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
    q = torch.randn(b, hq, d, dtype=torch.bfloat16, device="cuda", generator=g)
    kv_bytes = b * n * hkv * d * 2 * 2
    rows = []
    plain = cuinfer.BatchDecode()
    plain.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16")
    rope = cuinfer.BatchDecode()
    rope.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, q_dtype="bfloat16",
              pos_encoding="rope_llama")  # fmt: skip
    # a separate pass: rotate every cached key at its position (torch elementwise), then plain decode
    pos = torch.empty(num_pages, ps, device="cuda", dtype=torch.float32)
    page_of = torch.tensor(indices, device="cuda", dtype=torch.int64)
    seq = torch.arange(pages * ps, device="cuda", dtype=torch.float32).reshape(pages, ps)
    pos[page_of.reshape(b, pages)] = seq.expand(b, pages, ps)
    inv = 1e4 ** (-torch.arange(0, d // 2, device="cuda", dtype=torch.float32) * 2 / d)
    ang = pos[..., None] * inv  # [pages, ps, d/2]
    cos, sin = torch.cos(ang)[:, :, None, :], torch.sin(ang)[:, :, None, :]
    kr = torch.empty_like(cache)

    def separate():
        k = cache[:, 0].float()
        k1, k2 = k[..., : d // 2], k[..., d // 2 :]
        kr[:, 0, ..., : d // 2] = (k1 * cos - k2 * sin).to(torch.bfloat16)
        kr[:, 0, ..., d // 2 :] = (k2 * cos + k1 * sin).to(torch.bfloat16)
        kr[:, 1] = cache[:, 1]
        return plain.run(q, kr)

    for name, fn in (("plain", lambda: plain.run(q, cache)), ("rope (in kernel)", lambda: rope.run(q, cache)),
                     ("rope (torch pass + plain)", separate)):  # fmt: skip
        t = timer.time(fn, iters=iters, warmup=5)
        rows.append(("decode D6", name, "cuinfer", t.us, kv_bytes / t.median_s / 1e9, "GB/s of KV"))
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab.variant_bench", description=__doc__.splitlines()[0])
    p.add_argument("--peers", default="", help="FlashInfer prefill backends to run too, e.g. fa2,fa3")
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args(argv)
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    timer = CudaTimer()
    rows = prefill_rows(timer, torch, args.iters, [b for b in args.peers.split(",") if b])
    rows += decode_rows(timer, torch, args.iters)
    print(f"\n{'case':12s} {'variant':28s} {'impl':18s} {'us':>10s} {'rate':>9s}  note")
    for case, name, impl, us, rate, note in rows:
        print(f"{case:12s} {name:28s} {impl:18s} {us:10.1f} {rate:9.1f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
