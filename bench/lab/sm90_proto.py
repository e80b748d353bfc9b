"""Lab: the Hopper prefill prototype (bench/lab/sm90/prefill_proto.cu: wgmma, a TMA or cp.async producer warpgroup,
two consumer warpgroups, variant chains) against the float64 reference, cuinfer's FA2-class kernel and FlashInfer's
FA3 path.

    python -m bench.lab.sm90_proto --sass                # no GPU: registers, spills, opcode counts (HGMMA, LDGSTS)
    python -m bench.lab.sm90_proto --check               # GPU: small cases against the float64 reference
    python -m bench.lab.sm90_proto --bench [--peers]     # GPU: P1-P3 shapes (causal ragged, bf16, 32/8 heads, d128)

Timings follow docs/benchmarks.md: L2 flushed before each launch, fresh random inputs, medians; TFLOP/s over the
attended (causal) pairs, 4 * d FLOPs per pair.
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "sm90", "prefill_proto.cu")
KERNEL = "sm90_prefill_proto"
D = 128
BLOCK_M = 128


def smem_bytes(stages: int) -> int:
    return BLOCK_M * D * 2 + 2 * stages * 128 * D * 2 + 1024 + 8 * (2 + 4 * stages) + 48  # (+ the unit slot)


def compile_cubin(
    dtype: str = "bf16",
    stages: int = 2,
    arch: str = "sm_90a",
    defines: tuple[str, ...] = (),
    chain: tuple[str, ...] = ("causal",),
    rendered=None,
) -> tuple[bytes, str]:
    """The prototype's cubin for the variant chain ``chain`` (piece names, see ``PIECES``): the rendered chain
    (``VariantParams``, ``Variant``) starts the translation unit, as in the product kernels."""
    from cuinfer.jit.compiler import nvrtc_options
    from cuinfer.jit.toolchain import nvrtc_module

    nv = nvrtc_module()
    with open(SOURCE, encoding="utf-8") as fh:
        src = (rendered or rendered_chain(chain)).preamble() + '#line 1 "prefill_proto.cu"\n' + fh.read()
    t = "__nv_bfloat16" if dtype == "bf16" else "half"
    opts = nvrtc_options(arch) + [f"-DPROTO_T={t}", f"-DPROTO_STAGES={stages}", *defines]
    _, prog = nv.nvrtcCreateProgram(src.encode(), b"prefill_proto.cu", 0, [], [])
    (res,) = nv.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
    _, size = nv.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nv.nvrtcGetProgramLog(prog, log)
    log = log.rstrip(b"\0 ").decode(errors="replace")
    if res != nv.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"prefill_proto.cu does not compile:\n{log}")
    if "C7513" in log:  # every wgmma waits for the one before: the timing would say nothing of the design
        raise RuntimeError(f"ptxas serialised the wgmma instructions ({' '.join(defines)} {chain}):\n{log}")
    _, n = nv.nvrtcGetCUBINSize(prog)
    cubin = b" " * n
    nv.nvrtcGetCUBIN(prog, cubin)
    nv.nvrtcDestroyProgram(prog)
    return bytes(cubin), log


def _soft_cap_approx():
    """FlashInfer's soft cap, ``cap·tanh.approx(x / cap)`` (one MUFU op, relative error 2^-11), as a user variant."""
    from cuinfer.variants.spec import Param, Variant

    return Variant(
        name="soft_cap_approx",
        logits="params.cap * fmath::tanh_approx(x * params.inv_cap)",
        params=(Param("cap", "f32"), Param("inv_cap", "f32")),
    )


# Variant pieces a build may name (``name`` or ``name:value``): the built-ins of cuinfer.variants and one user variant
PIECES = ("causal", "soft_cap", "soft_cap_approx", "alibi", "window")


def rendered_chain(chain: tuple[str, ...]):
    from cuinfer.variants.registry import lookup
    from cuinfer.variants.render import render

    pieces = []
    for token in chain:
        name = token.partition(":")[0]
        if name not in PIECES:
            raise ValueError(f"unknown variant piece {name!r}; known: {', '.join(PIECES)}")
        pieces.append(_soft_cap_approx() if name == "soft_cap_approx" else lookup(name))
    return render(tuple(pieces))


def chain_values(chain: tuple[str, ...], num_qo_heads: int) -> dict:
    """``{piece: {param: value}}`` of the chain's scalar parameters (cuinfer.variants.builtins' ``values``)."""
    from cuinfer.variants.builtins import alibi, soft_cap, window

    out = {}
    for token in chain:
        name, _, val = token.partition(":")
        if name == "soft_cap":
            out[name] = soft_cap.values(float(val))
        elif name == "soft_cap_approx":
            out[name] = {"cap": float(val), "inv_cap": 1.0 / float(val)}
        elif name == "alibi":
            out[name] = alibi.values(num_qo_heads)
        elif name == "window":
            out[name] = window.values(int(val))
    return out


def key_bounds(chain: tuple[str, ...]) -> tuple[bool, int]:
    """(causal, window_left or -1) of a chain: what the host's work estimate and the FLOP count need."""
    causal, window = False, -1
    for token in chain:
        name, _, val = token.partition(":")
        if name == "causal":
            causal = True
        elif name == "window":
            window = int(val)
    return causal, window


Build = tuple[tuple[str, ...], tuple[str, ...]]  # (defines, variant chain): parse_build


def parse_build(spec: str) -> Build:
    """``tok+tok+...`` -> (defines, chain): ``-DNAME=VALUE`` defines, ``GRID_UNITS`` (a CTA per work unit), variant
    pieces (``causal``, ``soft_cap:30``, ``soft_cap_approx:30``, ``alibi``, ``window:1024``; ``noncausal``: none of
    them). No piece and no ``noncausal``: ``causal``."""
    defines, chain = [], []
    for tok in (t for t in spec.split("+") if t):
        if tok.startswith("-D") or tok == "GRID_UNITS":
            defines.append(tok)
        elif tok != "noncausal":
            chain.append(tok)
    if not chain and "noncausal" not in spec.split("+"):
        chain = ["causal"]
    return tuple(defines), tuple(chain)


def sass_report(dtype: str, stages: int, build: Build = ((), ("causal",))) -> None:
    """ptxas's resource lines and the opcode counts of one build (no GPU)."""
    from cuinfer.jit.sass import disassemble

    cubin, log = compile_cubin(dtype, stages, defines=build[0], chain=build[1])
    print(log.strip())
    ops = collections.Counter(op.split(".")[0] for insns in disassemble(cubin).values() for op in insns)
    print(", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])))


class Proto:
    """The compiled prototype on the current GPU (CuPy)."""

    def __init__(
        self, dtype: str = "bf16", stages: int = 2, defines: tuple[str, ...] = (), chain: tuple[str, ...] = ("causal",)
    ) -> None:
        import cupy as cp

        self.defines, self.chain = defines, chain
        self.rendered = rendered_chain(chain)
        self.one_cta_per_unit = "GRID_UNITS" in defines  # (host option: a CTA per work unit, not per SM)
        self.tma = "-DPROTO_TMA=0" not in defines
        self.dynamic = "-DPROTO_DYNAMIC=1" in defines
        if self.dynamic and not self.tma:
            raise ValueError("PROTO_DYNAMIC needs the TMA producer (one thread fetches the units)")
        for d in defines:
            if d.startswith("-DPROTO_STAGES="):
                stages = int(d.split("=")[1])
        keep = tuple(d for d in defines if d != "GRID_UNITS" and not d.startswith("-DPROTO_STAGES="))
        cubin, _ = compile_cubin(dtype, stages, defines=keep, chain=chain, rendered=self.rendered)
        self._dir = tempfile.mkdtemp()
        path = os.path.join(self._dir, "proto.cubin")
        with open(path, "wb") as fh:
            fh.write(cubin)
        self.mod = cp.RawModule(path=path)
        self.fn = self.mod.get_function(KERNEL)
        self.smem = smem_bytes(stages)
        self.fn.max_dynamic_shared_size_bytes = self.smem

    def launcher(self, q, k, v, o, lse, qo_lens, kv_lens, sm_scale: float):
        """A no-argument launch of the prototype on these arrays: one persistent CTA per SM over the (request, q
        block) work items, heaviest first (keys attended), the q heads of an item side by side."""
        import cupy as cp

        qo_lens, kv_lens = np.asarray(qo_lens, np.int64), np.asarray(kv_lens, np.int64)
        causal = key_bounds(self.chain)[0]  # (the work estimate: keys up to the diagonal)
        items, work = [], []
        for r, (ql, kl) in enumerate(zip(qo_lens, kv_lens, strict=True)):
            for b in range((int(ql) + BLOCK_M - 1) // BLOCK_M):
                last = min((b + 1) * BLOCK_M, int(ql)) - 1
                keys = max(0, min(int(kl), last + int(kl - ql) + 1)) if causal else int(kl)
                items.append((r, b))
                work.append(keys)
        order = np.argsort(-np.asarray(work), kind="stable")
        items_d = cp.asarray(np.asarray(items, np.int32)[order].reshape(-1))
        qi = cp.asarray(np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32))
        ki = cp.asarray(np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32))
        hq, hk = q.shape[1], k.shape[1]
        assert 8 * hk * D < 2**31 and 8 * hq * D < 2**31
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        grid = (len(items) * hq if self.one_cta_per_unit else min(sms, len(items) * hq),)
        scale_log2 = np.float32(sm_scale * np.log2(np.e))
        maps = [tensor_map(x) if self.tma else _no_map() for x in (q, k, v)]
        vp = self.rendered.pack(chain_values(self.chain, hq))
        sched = cp.zeros(1, cp.int32)  # (PROTO_DYNAMIC: units handed out after the first gridDim.x)
        args = (q, k, v, o, lse, qi, ki, items_d, sched, cp.int32(len(items)), cp.int32(hq), cp.int32(hk), scale_log2,
                vp, *maps)  # fmt: skip

        def launch():
            if self.dynamic:
                sched.fill(0)
            self.fn(grid, (384,), args, shared_mem=self.smem)

        return launch


def _no_map() -> np.void:
    """The by-value TmaDesc argument of a cp.async build (never read)."""
    from cuinfer.prefill.sm90 import TMA_DESC

    return np.zeros((), TMA_DESC)[()]


def tensor_map(x) -> np.void:
    """TMA map of a [tokens, heads, 128] 16-bit CuPy tensor (contiguous), as the product kernel builds it
    (cuinfer.prefill.sm90.tensor_map: 128 x 1 x 64 boxes, 128-byte swizzle)."""
    from cuinfer.prefill.sm90 import tensor_map as product_map

    tokens, heads, d = x.shape
    assert d == D and x.dtype.itemsize == 2
    dtype = "float16" if x.dtype == np.float16 else "bfloat16"
    return product_map(int(x.data.ptr), dtype, tokens, heads, heads * d, d)


def attended_pairs(lens, causal: bool, window: int) -> int:
    """(query, key) pairs attended by requests with qo = kv lengths ``lens``."""
    total = 0
    for n in (int(x) for x in lens):
        i = np.arange(n, dtype=np.int64)
        keys = (i + 1) if causal else np.full(n, n, np.int64)
        if window >= 0:
            keys = np.minimum(keys, window + 1)
        total += int(keys.sum())
    return total


def reference(q, k, v, qo_lens, kv_lens, sm_scale, chain: tuple[str, ...] = ()):
    """float64 attention per request, o and base-2 lse, with the variant chain's pieces applied in order (written
    here from their definitions: bottom-right causal, soft cap ``cap·tanh(x / cap)``, ALiBi ``x + slope_h (j -
    qpos)``, window ``j >= qpos - window_left``)."""
    from cuinfer.reference.positional import alibi_slopes

    hq, hk = q.shape[1], k.shape[1]
    grp = hq // hk
    slopes = alibi_slopes(hq)
    o = np.zeros(q.shape, np.float64)
    lse = np.zeros((q.shape[0], hq), np.float64)
    qs = ks = 0
    for ql, kl in zip(qo_lens, kv_lens, strict=True):
        for h in range(hq):
            qq = q[qs : qs + ql, h].astype(np.float64)
            kk = k[ks : ks + kl, h // grp].astype(np.float64)
            vv = v[ks : ks + kl, h // grp].astype(np.float64)
            s = qq @ kk.T * sm_scale
            rows = np.arange(ql)[:, None] + (kl - ql)
            cols = np.arange(kl)[None, :]
            keep = np.ones(s.shape, bool)
            for token in chain:
                name, _, val = token.partition(":")
                if name == "alibi":
                    s = s + slopes[h] * (cols - rows)
                elif name in ("soft_cap", "soft_cap_approx"):
                    s = float(val) * np.tanh(s / float(val))
                elif name == "causal":
                    keep &= cols <= rows
                elif name == "window":
                    keep &= cols >= rows - int(val)
            s = np.where(keep, s, -np.inf)
            mx = s.max(axis=1, keepdims=True)
            empty = ~np.isfinite(mx[:, 0])  # rows that see no key: o = 0, lse = -inf
            mx[empty] = 0
            p = np.exp(s - mx)
            den = p.sum(axis=1, keepdims=True)
            o[qs : qs + ql, h] = np.where(empty[:, None], 0, (p / np.where(empty[:, None], 1, den)) @ vv)
            with np.errstate(divide="ignore"):
                lse[qs : qs + ql, h] = np.where(empty, -np.inf, (mx[:, 0] + np.log(den[:, 0])) / np.log(2))
        qs += ql
        ks += kl
    return o, lse


def check(dtype: str, build: Build) -> bool:
    """The build (defines, variant chain) against the float64 reference on shapes that cover GQA groups 1 / 4 / 8,
    q < kv, q > kv (rows that see no key under causal), mixed requests, and tiles a window starts in."""
    import cupy as cp
    import ml_dtypes

    defines, chain = build
    npdt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    proto = Proto(dtype, defines=defines, chain=chain)
    print(f"check {dtype} {' '.join(defines) or '(defaults)'} {'+'.join(chain) or 'noncausal'}", flush=True)
    rng = np.random.default_rng(7)
    ok = True
    cases = [
        ("1x128", [128], [128], 8, 8),
        ("1x300 gqa4", [300], [300], 8, 2),
        ("2 reqs q<kv", [77, 200], [333, 450], 4, 1),
        ("3 reqs gqa8", [129, 1, 255], [129, 513, 100], 8, 1),
        ("1x1000", [1000], [1000], 4, 4),
        ("q>kv (causal: rows without keys)", [300], [100], 4, 2),
        ("4 reqs mixed", [513, 64, 1, 700], [513, 1000, 9, 700], 8, 2),
        ("1x2000 (window tiles)", [2000], [2000], 2, 1),
    ]
    for name, ql, kl, hq, hk in cases:
        nq, nk = sum(ql), sum(kl)
        q = rng.standard_normal((nq, hq, D)).astype(npdt)
        k = rng.standard_normal((nk, hk, D)).astype(npdt)
        v = rng.standard_normal((nk, hk, D)).astype(npdt)
        sm_scale = 1 / np.sqrt(D)
        ro, rl = reference(q, k, v, ql, kl, sm_scale, chain)
        dq, dk, dv = (cp.asarray(x.view(np.uint16)) for x in (q, k, v))
        do = cp.full((nq, hq, D), 0x7FC0, dtype=cp.uint16)  # NaN: an unwritten element fails
        dl = cp.full((nq, hq), np.nan, dtype=cp.float32)
        proto.launcher(dq, dk, dv, do, dl, ql, kl, sm_scale)()
        cp.cuda.Device().synchronize()
        o = cp.asnumpy(do).view(npdt).astype(np.float64)
        lse = cp.asnumpy(dl).astype(np.float64)
        err_o = np.max(np.abs(o - ro)) if np.isfinite(o).all() else np.inf
        same_inf = (np.isinf(lse) == np.isinf(rl)).all() and not np.isnan(lse).any()
        fin = np.isfinite(rl)
        err_l = np.max(np.abs(lse[fin] - rl[fin]), initial=0.0) if same_inf else np.inf
        tol = 2e-2 if dtype == "bf16" else 4e-3
        good = err_o < tol and err_l < 1e-3
        ok &= good
        verdict = "ok  " if good else "FAIL"
        print(f"{verdict} {name:34s} max|o - ref| {err_o:.2e}  max|lse - ref| {err_l:.2e}", flush=True)
    return ok


def bench(cases: list[str], iters: int, peers: bool, builds: dict[str, Build]) -> None:
    """P-case shapes (ragged, causal, Llama-8B heads): the prototype, cuinfer's FA2-class kernel and (``peers``)
    FlashInfer's fa3 backend on the same inputs, timed in this process; the prototype's output against cuinfer's."""
    import cupy as cp

    from bench import inputs
    from bench.cases import prefill_flops, select
    from bench.prefill import prepare_cuinfer, prepare_fi
    from bench.timing import CudaTimer

    timer = CudaTimer()  # (imports torch first: after NVRTC and CuPy have loaded, its import failed in one run)
    protos = {name: Proto("bf16", defines=d, chain=c) for name, (d, c) in builds.items()}
    for case in select("prefill", cases):
        if case.layout != "ragged":
            print(f"{case.id}: paged (the prototype reads ragged K/V only)", flush=True)
            continue
        inp = inputs.prefill_inputs(case)
        s = case.shape
        flops = prefill_flops(inp.lens, inp.lens, s, case.causal)  # (plain causal: the peers' rows)
        q, k, v = (cp.asarray(x.view(torch_u16())) for x in (inp.q, inp.k, inp.v))
        o = cp.full(q.shape, 0x7FC0, dtype=cp.uint16)
        lse = cp.empty((q.shape[0], s.num_qo_heads), cp.float32)
        runs = {name: p.launcher(q, k, v, o, lse, inp.lens, inp.lens, s.head_dim**-0.5) for name, p in protos.items()}
        rows, var_flops = {}, {}
        for name, run in runs.items():
            rows[name] = timer.time(run, iters=iters, warmup=3)
            pairs = attended_pairs(inp.lens, *key_bounds(protos[name].chain))
            var_flops[name] = 4 * s.head_dim * s.num_qo_heads * pairs
        fa2 = prepare_cuinfer(inp, "fa2")
        rows["cuinfer fa2"] = timer.time(fa2.run, iters=iters, warmup=3)
        ref = cp.asarray(fa2.run()).view(cp.uint16)
        if peers:
            try:
                fi = prepare_fi(inp, "fa3")
                rows["flashinfer fa3"] = timer.time(fi.run, iters=iters, warmup=3)
            except Exception as ex:  # noqa: BLE001 - report and go on
                print(f"{case.id}: flashinfer fa3 failed: {type(ex).__name__}: {ex}", flush=True)
        diffs = []
        for name, run in runs.items():
            if protos[name].chain != ("causal",):  # (the FA2-class row is plain causal)
                continue
            o.fill(0x7FC0)
            run()
            cp.cuda.Device().synchronize()
            diffs.append(float(cp.max(cp.abs(bf16_to_f32(o) - bf16_to_f32(ref)))))
        diff = max(diffs, default=float("nan"))
        base = rows["cuinfer fa2"].us
        for name, t in rows.items():
            f = var_flops.get(name, flops)
            print(f"{case.id:4s} {name:15s} {t.us:9.1f} us  {f / t.us / 1e6:7.1f} TFLOP/s  "
                  f"{base / t.us:5.2f}x fa2 (time)", flush=True)  # fmt: skip
        print(f"{case.id:4s} max|proto - fa2| = {diff:.3e} (NaN: an unwritten element)", flush=True)
        inputs.free()


def torch_u16():
    import torch

    return torch.uint16 if hasattr(torch, "uint16") else torch.int16


def bf16_to_f32(x):
    import cupy as cp

    return (x.astype(cp.uint32) << 16).view(cp.float32)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sass", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--peers", action="store_true")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--cases", default="P1,P2,P3")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument(
        "--variants",
        default="proto=",
        help="name=TOKEN[+TOKEN] builds compared in one run, comma-separated; tokens: -DNAME=VALUE defines (e.g. "
        "seq=-DPROTO_OVERLAP=0), GRID_UNITS (a CTA per work unit instead of one persistent CTA per SM), the pieces "
        "of a variant chain in order: causal, soft_cap:30, soft_cap_approx:30, alibi, window:1024 (no piece: causal; "
        "noncausal: none; name causal when naming other pieces: causal+soft_cap:30)",
    )
    args = ap.parse_args()
    builds = {}
    for item in args.variants.split(","):
        name, _, spec = item.partition("=")
        builds[name] = parse_build(spec)
    if args.sass:
        for build in builds.values():
            sass_report(args.dtype, args.stages, build)
    if args.check:
        ok = all([check(args.dtype, b) for b in builds.values()])
        if not ok:
            raise SystemExit(1)
    if args.bench:
        bench(args.cases.split(","), args.iters, args.peers, builds)
