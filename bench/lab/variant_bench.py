"""Lab: the attention variants against plain attention (and FlashInfer's, when installed), by the bench method.

    python -m bench.lab.variant_bench [--peers fa2,fa3] [--iters 30]      (GPU machine)

Prefill, P1-P3 shapes (ragged, causal, 32 / 8 heads, d128, bf16; --cases): causal, soft cap 30, ALiBi, sliding window
1024, in-kernel RoPE; TFLOP/s count attended (query, key) pairs only (window: ~1025 keys per row). Decode, D6 shape
(128 x 2048, page 16): plain, in-kernel RoPE (`rope_llama`), and a separate rotation of the whole K cache (torch
elementwise ops) followed by plain decode. Times: CUDA events, L2 flushed before every run, medians
(bench/timing.py); every row is measured in this process.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def _pairs_causal(lens: np.ndarray, window: int = -1) -> int:
    """Attended (query, key) pairs of causal self-attention over requests of these lengths (window: keys within
    ``window`` before the query, the query's own key included)."""
    total = 0
    for n in lens:
        rows = np.arange(int(n))
        lo = np.zeros(int(n), dtype=np.int64) if window < 0 else np.maximum(rows - window, 0)
        total += int((rows - lo + 1).sum())
    return total


VARIANTS = {
    "causal": {},
    "soft cap 30": {"logits_soft_cap": 30.0},
    "soft cap 30 (accurate)": {"variant": "soft_cap_accurate", "variant_params": {"soft_cap_accurate": {"cap": 30.0}}},
    "alibi": {"pos_encoding": "alibi"},
    "window 1024": {"window_left": 1024},
    "rope (in kernel)": {"pos_encoding": "rope_llama"},
}


def _lab_variants() -> dict:
    """Lab-only variants (--lab), each against the built-in soft cap (``cap * tanh.approx(x / cap)`` with
    ``logits_scale``): the same formula unscaled (its multiplies by 1 / cap and cap per logit in the snippet); the
    scaled tanh from MUFU.EX2 with the reciprocal by two Newton steps on the FMA pipe (``1 - 2 r``, ``r ~ 1 / (1 +
    2^(2 x log2 e))``, ~2e-4 relative: two EX2 per logit with the softmax's, no MUFU.TANH) or by MUFU.RCP (three MUFU
    ops); and a probe of the least any soft cap through MUFU costs: the plain logits plus 0 x one MUFU.TANH each
    (``x + 0.f * tanh.approx(x)``: the product is kept, as 0 x inf is NaN; the results are the plain ones)."""
    import importlib

    import cuinfer

    # registered and counted with the built-in soft cap among the chains that keep the plain 128 x 64 tiles (a user
    # variant's policy tiles are narrower): this compares the logits code alone
    render = importlib.import_module("cuinfer.variants.render")
    names = ("lab_soft_cap_approx", "lab_cap_ex2_newton", "lab_cap_ex2_rcp", "lab_one_mufu")
    render.WIDE_LOGITS = (*render.WIDE_LOGITS, *names)
    cap = (cuinfer.Param("cap", "f32"),)
    approx = cuinfer.register_variant(
        cuinfer.Variant(
            name="lab_soft_cap_approx",
            logits="params.cap * fmath::tanh_approx(x * params.inv_cap)",
            params=(cuinfer.Param("cap", "f32"), cuinfer.Param("inv_cap", "f32")),
        )
    )
    newton = cuinfer.register_variant(
        cuinfer.Variant(
            name="lab_cap_ex2_newton",
            logits="""const float d = fminf(1.f + fmath::ex2(x * 2.8853900817779268f), 67108864.f);
float r = __int_as_float(0x7EF311C3 - __float_as_int(d));
r = r * fmaf(-d, r, 2.f);
r = r * fmaf(-d, r, 2.f);
return fmaf(-2.f, r, 1.f);""",
            logits_scale="cap",
            params=cap,
        )
    )
    rcp = cuinfer.register_variant(
        cuinfer.Variant(
            name="lab_cap_ex2_rcp",
            logits="fmaf(-2.f, fmath::rcp(1.f + fmath::ex2(x * 2.8853900817779268f)), 1.f)",
            logits_scale="cap",
            params=cap,
        )
    )
    one_mufu = cuinfer.register_variant(
        cuinfer.Variant(name="lab_one_mufu", logits="fmaf(0.f, fmath::tanh_approx(x), x)")
    )
    return {
        "one MUFU per logit (probe)": {"variant": one_mufu},
        "soft cap 30 (tanh.approx unscaled)": {
            "variant": approx,
            "variant_params": {"lab_soft_cap_approx": {"cap": 30.0, "inv_cap": 1 / 30.0}},
        },
        "soft cap 30 (ex2 + Newton)": {"variant": newton, "variant_params": {"lab_cap_ex2_newton": {"cap": 30.0}}},
        "soft cap 30 (ex2 + rcp)": {"variant": rcp, "variant_params": {"lab_cap_ex2_rcp": {"cap": 30.0}}},
    }


def _fi_kwargs(opts: dict) -> dict:
    kw = {}
    if "logits_soft_cap" in opts:
        kw["logits_soft_cap"] = opts["logits_soft_cap"]
    if "window_left" in opts:
        kw["window_left"] = opts["window_left"]
    if opts.get("pos_encoding") == "alibi":
        kw["pos_encoding_mode"] = "ALIBI"
    return kw


def prefill_rows(
    timer, torch, iters: int, peers: list[str], case_ids: list[str], variants: dict | None = None,
    backends: tuple[str, ...] = ("auto",),
) -> list[tuple]:  # fmt: skip
    """Ragged causal prefill on the P1-P3 shapes of bench/cases.py (lengths drawn with the case's seed), every
    variant of VARIANTS on cuinfer (each of ``backends``) and, for those FlashInfer has, on each peer backend."""
    import cuinfer
    from bench.cases import PREFILL_CASES

    hq, hkv, d = 32, 8, 128
    rows = []
    for case in [c for c in PREFILL_CASES if c.id in case_ids]:
        lens = case.lengths.draw(case.seed)
        n = int(lens.sum())
        indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        g = torch.Generator(device="cuda").manual_seed(case.seed)
        q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda", generator=g)
        k = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
        v = torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda", generator=g)
        label = f"prefill {case.id}"
        for backend, (name, opts) in ((b, kv) for b in backends for kv in (variants or VARIANTS).items()):
            impl = "cuinfer" if backend == "auto" else f"cuinfer-{backend}"
            w = cuinfer.BatchPrefill(paged=False, backend=backend)
            try:
                w.plan(indptr, indptr, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, causal=True,
                       q_dtype="bfloat16", **opts)  # fmt: skip
            except (ValueError, NotImplementedError) as ex:  # (a backend that does not run the variant: a row)
                rows.append((label, name, impl, float("nan"), float("nan"), str(ex)[:60]))
                continue
            t = timer.time(lambda w=w, q=q, k=k, v=v: w.run(q, k, v), iters=iters, warmup=5)
            pairs = _pairs_causal(lens, opts.get("window_left", -1))
            tiles = "sm90" if backend == "sm90" else f"q{w._plan.config.tile_q}k{w._plan.config.tile_kv}"
            rows.append((label, name, impl, t.us, 4 * hq * d * pairs / t.median_s / 1e12, tiles))
            print(rows[-1], flush=True)
        for backend in peers:
            try:
                import flashinfer
            except ImportError:
                break
            for name, opts in (variants or VARIANTS).items():
                if name.startswith("rope") or "variant" in opts:
                    continue
                ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
                fi = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
                try:
                    qi = torch.tensor(indptr, device="cuda")
                    fi.plan(qi, qi, hq, hkv, d, causal=True, q_data_type=torch.bfloat16, **_fi_kwargs(opts))
                    t = timer.time(lambda fi=fi, q=q, k=k, v=v: fi.run(q, k, v), iters=iters, warmup=5)
                except Exception as ex:  # noqa: BLE001 - a peer that cannot run a variant is a row, not a crash
                    rows.append((label, name, f"flashinfer-{backend}", float("nan"), float("nan"), str(ex)[:60]))
                    print(rows[-1], flush=True)
                    continue
                pairs = _pairs_causal(lens, opts.get("window_left", -1))
                tflops = 4 * hq * d * pairs / t.median_s / 1e12
                rows.append((label, name, f"flashinfer-{backend}", t.us, tflops, ""))
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

    # the same with cuinfer's RoPE kernel over a K cache held apart from V ([pages * page, heads, dim] rows at their
    # positions); apply_rope_pos_ids rotates a q too: one head per row (1/8 of K's bytes more read and written)
    k_sep, v_sep = cache[:, 0].contiguous(), cache[:, 1].contiguous()
    k_rows = k_sep.view(num_pages * ps, hkv, d)
    q_rows = torch.zeros(num_pages * ps, 1, d, dtype=torch.bfloat16, device="cuda")
    pos_ids = pos.reshape(-1).to(torch.int32)

    def separate_cuinfer():
        _, k_rot = cuinfer.apply_rope_pos_ids(q_rows, k_rows, pos_ids)
        return plain.run(q, (k_rot.view(num_pages, ps, hkv, d), v_sep))

    cases = (
        ("plain", lambda: plain.run(q, cache)),
        ("rope (in kernel)", lambda: rope.run(q, cache)),
        ("rope (torch pass + plain)", separate),
        ("rope (cuinfer apply_rope pass + plain)", separate_cuinfer),
    )
    for name, fn in cases:  # fmt: skip
        t = timer.time(fn, iters=iters, warmup=5)
        rows.append(("decode D6", name, "cuinfer", t.us, kv_bytes / t.median_s / 1e9, "GB/s of KV"))
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lab.variant_bench", description=__doc__.splitlines()[0])
    p.add_argument("--peers", default="", help="FlashInfer prefill backends to run too, e.g. fa2,fa3")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--cases", default="P1,P2,P3", help="prefill cases of bench/cases.py (ragged, causal)")
    p.add_argument("--variants", default="", help="names of VARIANTS (and, with --lab, the lab variants) to run")
    p.add_argument("--lab", action="store_true", help="add the lab variants (_lab_variants)")
    p.add_argument("--no-decode", action="store_true", help="prefill rows only")
    p.add_argument("--no-prefill", action="store_true", help="decode rows only")
    p.add_argument("--backends", default="auto", help="cuinfer prefill backends, e.g. fa2,sm90")
    args = p.parse_args(argv)
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    timer = CudaTimer()
    variants = dict(VARIANTS, **(_lab_variants() if args.lab else {}))
    if args.variants:
        variants = {k: variants[k] for k in args.variants.split(",")}
    peers = [b for b in args.peers.split(",") if b]
    backends = tuple(b for b in args.backends.split(",") if b)
    cases = [] if args.no_prefill else args.cases.split(",")
    rows = prefill_rows(timer, torch, args.iters, peers, cases, variants, backends)
    if not args.no_decode:
        rows += decode_rows(timer, torch, args.iters)
    print(f"\n{'case':12s} {'variant':28s} {'impl':18s} {'us':>10s} {'rate':>9s}  note")
    for case, name, impl, us, rate, note in rows:
        print(f"{case:12s} {name:28s} {impl:18s} {us:10.1f} {rate:9.1f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
