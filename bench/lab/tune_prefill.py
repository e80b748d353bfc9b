"""Tuning sweep for the FA2-class prefill kernel on P1-P6: configurations x cases -> TFLOP/s, in one GPU call.

python -m bench.lab.tune_prefill            cuinfer configurations (table), outputs checked against the first
python -m bench.lab.tune_prefill --fi       FlashInfer fa2 on the same cases (waits for --fi-warm's JIT, up to a limit)
python -m bench.lab.tune_prefill --fi-warm  JIT-compile FlashInfer's fa2 prefill modules (run it in the background)

A configuration is a kernel variant and forced ``tile_sizes=(query tile, kv tile, stages)``. Variants: ``new`` (the
kernel of this checkout), ``noxi`` / ``noskip`` (the same with the cross-item pipeline / the causal slice skipping
compiled out: ``-DCUINFER_PREFILL_NO_CROSS_ITEM`` / ``_NO_SLICE_SKIP``), ``eager`` (an exact running max instead of the
lazy reference max: ``-DCUINFER_PREFILL_EAGER_RESCALE``), ``maxed`` (every tile takes its row max, no max-free
tiles: ``-DCUINFER_PREFILL_NO_MAX_FREE``) and ``base``: a saved copy of an earlier
kernel, ``.peers/prefill_base.cu`` (skipped when absent). Every module is compiled up front in parallel processes
into the disk cache. Timing is PERF.md's: CUDA events, L2 flushed (512 MB write) before every timed run, median of
``ROUNDS x ITERS`` runs taken round-robin over the configurations (drift hits them alike). Not a standard suite: it
picks the tile policy and checks kernel changes.

Last run (H200, 2026-11-29; base = the kernel before the cross-item pipeline; TFLOP/s, noise ~ +-3 %):

                     P1     P2     P3     P4     P5     P6
    base q128k64s2      343    344    273    337    305    205
    new q128k64s2       345    349    293    328    313    225
    noxi q128k64s2      340    344    274    322    303    200
    noskip q128k64s2    343    350    297    328    308    209
    new q128k32s2       285    286    250    271    257    189
    new q128k32s3       284    285    240    268    256    188
    new q128k32s4       282    277    240    272    250    184

Outputs of new / noxi / noskip were bit-identical to base on every case. The cross-item pipeline is the gain on the
many-item cases (P3 +7 %, P6 +12 % over noxi); 32-key tiles lose ~17 % whatever the depth: the policy's 128 x 64 x 2
stays. (FlashInfer's fa2 JIT did not finish inside that call's budget: start --fi-warm earlier or give it ~2 min.)

Epilogue and issue-order experiments (H200, 2026-11-29, a later session; TFLOP/s, 40 timed runs per cell; variants
built from macros that were removed afterwards):

                               P1     P2     P3     P4     P5     P6
    kernel before              325    349    286    330    319    265
    16-B stores + late next    334    355    303    336    323    277   <- kept (the kernel of this checkout)
    + late K/V-ahead copies    311    333    284    331    316    272   (copies after Q.K / after P.V: slower)
    no o stores at all *       374    356    321      -    331    289   (* wrong output: the stores' cost, P3 ~10 %)
    row sums by MMA (ones)       -    334    281      -      -    260   (FlashInfer's trick: slower here)
    2 of 8 exp columns on FMA    -    328    276      -      -    258   (MUFU is not the limit: XU pipe ~20 %)

One barrier per KV tile (K and V of the tile ahead copied together after the first barrier; a second one only on an
item's last tile, before the next item's Q copy) measured 373 / 359 / 308 / 338 / 328 / 278 against 373 / 358 / 308 /
339 / 327 / 278 for the kernel kept: neutral, and it spilled, so the two-barrier loop stays.

"late next" issues the next item's Q and first K/V tile after the epilogue instead of during the last P.V: those 32
cp.async per thread queued in the memory pipe ahead of that P.V's ldmatrix reads and the o stores. Nsight Compute on
P2 (same call): cuinfer 2.09 ms, tensor pipe 55 %, FlashInfer fa2 1.98 ms, 64 %; both 255 registers, 2 CTAs/SM.
Softmax experiments (H200, 2026-11-29, fourth session; TFLOP/s, 4 rounds; FlashInfer fa2 from --fi in one of the
calls: 356 / 370 / 322 / 325 / 333 / 274):

                               P1     P2     P3     P4     P5     P6
    exact running max          364    352    302    333    324    275   (eager, before max-free tiles existed)
    lazy reference max         373    364    311    344    335    285
    lazy, every tile's max     376    366    314    345    336    285   (maxed, next call)
    + max-free tiles           389    378    321    352    341    288   <- kept (same call as maxed)
    + next copies before epi   387    378    320    348    339    287   (nextepi: not kept)
    planner win4 / win2        388    378    319    349    337    266   (locality windows: no gain, P6 balance)

A pairwise-tree row sum (floats do not reassociate, so the running sum is a chain of 16 dependent adds) measured
367 / 361 / 312 / 352 / 341 / 289 against 375 / 366 / 315 / 353 / 342 / 289 for the running sum, on another machine
(FlashInfer 354 / 369 / 321 / 323 / 333 / 274 there): not kept. Between machines the same kernel moved up to 4 %
(P1 375-389) while FlashInfer's P1 stayed at 353-356.

Before the fourth session, variants ran the default kernel: run() looked kernels up in cuinfer.prefill_launch, which
only cuinfer.prefill was patched for (use_spec now patches both; the eager/new rows of the first call were identical).

Copy registers and epilogue (H200, 2026-11-29, fifth session; TFLOP/s, 4 rounds; each block one call, "base" the
kernel before the block's change; the variants of the rejected rows were removed afterwards):

                               P1     P2     P3     P4     P5     P6
    base                       367    360    312    350    339    287
    bounds before barriers     385    374    321    360    347    293   <- kept (+ no dummy copy address)
    sel (dummy address back)   380    369    319    352    341    284   (paged spills 8 B)
    one GEMM copy (og)         347    339    294    318    310    268   (guarded Q.K / P.V code only: -9 %)
    next K/V in the last
      iteration's free slots   378    369    317    352    341    288   (e1: Q after the epilogue)
      + Q after the V barrier  379    370    319    357    345    289   (e2; paged spills 16 B)
    8 warps x 16 rows, 2/SM    314    305    269    285    277    243   (128 registers, spills)
    8 warps x 16 rows, 1/SM    250    230    212    230    214    197
    base                       384    374    323    360    348    295
    MUFU rcp / lg2 epilogue    385    376    326    360    348    297   <- kept
    base                       383    376    326    360    348    297
    staged epilogue (stmatrix) 401    391    336    364    355    303   <- kept (shf: the transpose, = base)
    base                       398    387    332    358    349    300
    CTA item range in smem     383    374    326    364    353    302   (ragged -2..-4 %, paged +1..+2 %: not kept)

Nsight Compute (P3) before the first change: ~2.3 % of the samples were moves of copy addresses and a bounds read
waiting for copies still queued (register pairs reused while the LSU had not read them), ~0.9 % smem reads right
after the barriers. The phase stamps of `bench.lab.tune_sched trace` then showed the epilogue at 2.16 us of a P3 item's
~34 us (1.77 us with the MUFU forms); the staged epilogue took ~900 instructions out of the kernel. 32-bit strides
in the copy addresses (one IMAD.WIDE per product) saved 32 instructions on the ragged kernel and added 40 on the
paged one: not measured.

Paired blocks (H200, 2026-11-30, eighth session; the tiles' fourth entry forces the CTAs per block, "new:128,64,2,2";
the lock variants were A/B macros removed afterwards):

                               P1     P2     P3     P4     P5     P6
    kernel before              384    379    333    354    346    300
    thread index % block size  388    383    335    368    359    308   <- kept (every build)
    paired (2 CTAs per block)  402    395    342    333    327    285   <- kept for the ragged 128 x 64 tiles
    paired + tensor-core lock  229    226    207    210    206    180   (per GEMM phase; held P.V -> Q.K^T: 263 ...)
    q64k64: one / paired       298/285 279/270 254/244 258/246 239/235 223/214

$CUINFER_TUNE_CONFIGS ("new:128,64,2;noxi:128,64,2") and $CUINFER_TUNE_ROUNDS pick configurations and rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from bench import inputs
from bench.cases import PREFILL_CASES, prefill_flops

BASE_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".peers", "prefill_base.cu")
VARIANT_FLAGS = {
    "new": (),
    "noxi": ("-DCUINFER_PREFILL_NO_CROSS_ITEM",),
    "noskip": ("-DCUINFER_PREFILL_NO_SLICE_SKIP",),
    "eager": ("-DCUINFER_PREFILL_EAGER_RESCALE",),
    "maxed": ("-DCUINFER_PREFILL_NO_MAX_FREE",),
    "shf": ("-DCUINFER_PREFILL_SHUFFLE_EPI",),
    "sel": ("-DCUINFER_PREFILL_ADDR_SELECT",),
    "base": (),
}
# (variant, (query tile, kv tile, stages)); the first is the reference the others' outputs are compared with.
CONFIGS = (
    ("base", (128, 64, 2)),
    ("new", (128, 64, 2)),
    ("noxi", (128, 64, 2)),
    ("noskip", (128, 64, 2)),
    ("new", (128, 32, 2)),
    ("new", (128, 32, 3)),
    ("new", (128, 32, 4)),
)
ROUNDS, ITERS, WARMUP = int(os.environ.get("CUINFER_TUNE_ROUNDS", "3")), 8, 2
ARCH = os.environ.get("CUINFER_TUNE_ARCH", "sm_90a")
FI_MARKER = "/tmp/cuinfer-tune-fi-warm.done"


def _name(variant: str, tiles: tuple) -> str:
    return f"{variant} q{tiles[0]}k{tiles[1]}s{tiles[2]}" + (f"g{tiles[3]}" if len(tiles) > 3 else "")


def spec_for(key, variant: str):
    """The KernelSpec of ``key`` for a variant (a distinct name, so the caches keep them apart)."""
    from cuinfer.prefill.specs import prefill_spec

    spec = prefill_spec(key)
    if variant == "new" or variant.startswith("win"):  # win<k>: a planner variant of the kernel of this checkout
        return spec
    extra = dict(source=BASE_SOURCE) if variant == "base" else dict(extra_options=VARIANT_FLAGS[variant])
    return dataclasses.replace(spec, name=f"tune-{variant}/{spec.name}", **extra)


def _keys(variant: str, tiles: tuple):
    from cuinfer.prefill.specs import MASK_CAUSAL, PrefillKernelKey
    from cuinfer.prefill.tiles import tile_config

    cfg = tile_config(tiles[0], tiles[1], 128, *tiles[2:])
    return [PrefillKernelKey("bfloat16", "bfloat16", 128, 128, cfg, paged, MASK_CAUSAL, False, False)
            for paged in (False, True)]  # fmt: skip


def _compile(job) -> tuple[bool, str]:
    from cuinfer.jit import get_compiled

    variant, tiles = job
    out = []
    try:
        for key in _keys(variant, tiles):
            mod = get_compiled(spec_for(key, variant), ARCH)
            r = next(iter(mod.resources.values()))
            out.append(
                f"{'paged' if key.paged else 'ragged'} {r.registers} regs, spills {r.spill_stores}/{r.spill_loads}"
            )
    except Exception as ex:  # noqa: BLE001 - a configuration that does not build is dropped, with the reason
        return False, f"{_name(variant, tiles)}: FAILED {str(ex)[:2000]}"
    return True, f"{_name(variant, tiles)}: " + "; ".join(out)


def configs() -> list[tuple[str, tuple]]:
    """CONFIGS, or those named in $CUINFER_TUNE_CONFIGS ("new:128,64,2;rs:128,64,2")."""
    env = os.environ.get("CUINFER_TUNE_CONFIGS")
    cfgs = CONFIGS
    if env:
        cfgs = tuple((v, tuple(int(x) for x in t.split(","))) for v, t in (c.split(":") for c in env.split(";")))
    return [c for c in cfgs if c[0] != "base" or os.path.exists(BASE_SOURCE)]


def precompile(cfgs) -> list:
    """Build every configuration into the disk cache in parallel processes; returns those that built."""
    t0 = time.perf_counter()
    ok = []
    with ProcessPoolExecutor(max_workers=min(len(cfgs), os.cpu_count() or 4), mp_context=get_context("spawn")) as ex:
        for cfg, (built, line) in zip(cfgs, ex.map(_compile, cfgs), strict=True):
            print("  " + line)
            if built:
                ok.append(cfg)
    print(f"compiled {len(cfgs)} configurations in {time.perf_counter() - t0:.1f} s", flush=True)
    return ok


def use_spec(spec_of) -> None:
    """Make BatchPrefill build its kernels with ``spec_of(key)``: plan() (occupancy) looks kernels up in
    cuinfer.prefill.wrapper, run() in cuinfer.prefill.launch (patching only the first ran the default kernel in every
    configuration: A/B rows of identical kernels)."""
    import cuinfer.prefill.launch as pl
    import cuinfer.prefill.wrapper as cp

    cp.prefill_spec = pl.prefill_spec = spec_of


def cta_major(owner, rank, p: int):
    """``(items, work_indptr)`` of a schedule: item ``i`` runs on CTA ``owner[i]`` as its ``rank[i]``-th-ranked item;
    the items CTA-major, each CTA's in rank order (the form the persistent kernels read)."""
    import numpy as np

    items = np.lexsort((rank, owner))
    indptr = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=p), out=indptr[1:])
    return items, indptr


def _window_assign(k: int):
    """Planner variant ``win<k>``: items in locality order (head major, then request and query tile), cut into
    windows of k rounds of P items; each window's items, largest first, are dealt in a snake over the CTAs sorted
    by their load so far. The KV working set of a round is a few (request, head) pairs, as in FlashInfer's grid."""
    import numpy as np
    from cuinfer.planner.assign import Assignment

    def fn(costs, num_heads, num_ctas, stats=None, prefix=None):
        g, h, p = costs.shape[0], int(num_heads), int(num_ctas)
        n = g * h
        item = np.arange(n)
        head, grp = np.divmod(item, g)
        ic = np.asarray(costs, dtype=np.float64).take(grp)
        o = np.lexsort((-ic, item // (k * p)))
        head, grp, ic = head.take(o), grp.take(o), ic.take(o)
        loads = np.zeros(p)
        cta = np.empty(n, dtype=np.int64)
        for s0 in range(0, n, k * p):
            m = min(k * p, n - s0)
            q, i = np.divmod(np.arange(m), p)
            c = np.argsort(loads, kind="stable").take(np.where(q % 2 == 0, i, p - 1 - i))
            cta[s0 : s0 + m] = c
            loads += np.bincount(c, weights=ic[s0 : s0 + m], minlength=p)
        seq, indptr = cta_major(cta, np.arange(n), p)
        return Assignment(indptr, grp.take(seq), head.take(seq), f"win{k}")

    return fn


def _cuinfer_runner(inp, variant: str, tiles: tuple):
    import cuinfer.planner.work as pw

    import cuinfer.prefill.wrapper as cp

    case, s = inp.case, inp.case.shape
    assign = pw.assign_items
    if variant.startswith("win"):
        pw.assign_items = _window_assign(int(variant[3:]))
        variant = "new"

    def spec_of(key):
        return spec_for(key, variant)

    use_spec(spec_of)
    kw = dict(num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, causal=case.causal,
              q_dtype=s.dtype, kv_dtype=s.dtype, tile_sizes=tiles)  # fmt: skip
    w = cp.BatchPrefill(paged=case.layout == "paged", kv_layout=s.kv_layout)
    if case.layout == "paged":
        t = inp.kv.table
        w.plan(inp.qo_indptr, t.kv_indptr, t.kv_indices, t.kv_last_page_len, page_size=s.page_size, **kw)

        def run():
            use_spec(spec_of)
            return w.run(inp.q, inp.kv.cache)
    else:
        w.plan(inp.qo_indptr, inp.qo_indptr, **kw)

        def run():
            use_spec(spec_of)
            return w.run(inp.q, inp.k, inp.v)

    pw.assign_items = assign
    work = w._plan.work
    info = f"{work.num_ctas} CTAs, {work.n_items} items ({work.assign_mode}), {work.n_merge} merged rows"
    return run, info


def _time_round_robin(timer, runs: list, rounds: int, iters: int) -> list[list[float]]:
    torch = timer._torch
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for i, fn in enumerate(runs):
            samples[i] += list(_samples(timer, torch, fn, iters))
    return samples


def _samples(timer, torch, fn, iters: int):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    for _ in range(iters):
        timer.flush_l2()
        timer.head_start()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        yield start.elapsed_time(end) * 1e-3


def tune(case_ids: list[str] | None) -> None:
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    print(f"{torch.cuda.get_device_name(0)}; configurations: {', '.join(_name(*c) for c in configs())}", flush=True)
    cfgs = precompile(configs())
    names = [_name(v, t) for v, t in cfgs]
    timer = CudaTimer()
    table: dict[str, dict[str, float]] = {n: {} for n in names}
    for case in PREFILL_CASES:
        if case_ids and case.id not in case_ids:
            continue
        inp = inputs.prefill_inputs(case)
        flops = prefill_flops(inp.lens, inp.lens, case.shape, case.causal)
        runs, ref = [], None
        for (variant, tiles), name in zip(cfgs, names, strict=True):
            run, info = _cuinfer_runner(inp, variant, tiles)
            out = run().float()
            torch.cuda.synchronize()
            if ref is None:
                ref = out
                check = "reference"
            else:
                diff = (out - ref).abs()
                check = f"max |diff| {diff.max().item():.2e} (mean {diff.mean().item():.1e})"
                if not torch.isfinite(out).all() or diff.max().item() > 0.05:
                    check += "  <-- MISMATCH"
            print(f"  {case.id} {name}: {info}; {check}", flush=True)
            runs.append(run)
        samples = _time_round_robin(timer, runs, ROUNDS, ITERS)
        for name, ts in zip(names, samples, strict=True):
            table[name][case.id] = flops / statistics.median(ts) / 1e12
        best = max(names, key=lambda n: table[n][case.id])
        print(f"{case.id}: " + ", ".join(f"{n} {table[n][case.id]:.0f}" for n in names) + f"  (best {best})",
              flush=True)  # fmt: skip
        del runs, ref
        inputs.free()
    ids = [c.id for c in PREFILL_CASES if not case_ids or c.id in case_ids]
    width = max(len(n) for n in names)
    print("\nTFLOP/s (median, L2 flushed)")
    print(" " * width + "".join(f"{i:>7}" for i in ids))
    for n in names:
        print(n.ljust(width) + "".join(f"{table[n].get(i, float('nan')):7.0f}" for i in ids))


def _fi_prepared(inp):
    from bench.prefill import prepare_fi

    return prepare_fi(inp, "fa2")


def fi_warm() -> None:
    """JIT-compile FlashInfer's fa2 modules (ragged and paged) on a tiny batch; then drop the marker file."""
    from bench.cases import Lengths

    t0 = time.perf_counter()
    for layout in ("ragged", "paged"):
        case = next(c for c in PREFILL_CASES if c.layout == layout)
        tiny = dataclasses.replace(case, id="warm", lengths=Lengths("const", 2, 200))
        _fi_prepared(inputs.prefill_inputs(tiny)).run()
        print(f"FlashInfer fa2 {layout} ready after {time.perf_counter() - t0:.0f} s", flush=True)
    with open(FI_MARKER, "w") as fh:
        fh.write("ok\n")


def fi(case_ids: list[str] | None, wait_s: float) -> None:
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    deadline = time.monotonic() + wait_s
    while not os.path.exists(FI_MARKER) and time.monotonic() < deadline:
        time.sleep(1.0)
    if not os.path.exists(FI_MARKER):
        print(f"FlashInfer JIT not ready after {wait_s:.0f} s: no FI rows", flush=True)
        return
    timer = CudaTimer()
    for case in PREFILL_CASES:
        if case_ids and case.id not in case_ids:
            continue
        inp = inputs.prefill_inputs(case)
        flops = prefill_flops(inp.lens, inp.lens, case.shape, case.causal)
        prep = _fi_prepared(inp)
        ts = _time_round_robin(timer, [prep.run], ROUNDS, ITERS)[0]
        print(f"{case.id}: FI fa2 {flops / statistics.median(ts) / 1e12:.0f} TFLOP/s", flush=True)
        del prep
        torch.cuda.synchronize()
        inputs.free()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fi", action="store_true", help="time FlashInfer fa2 instead of the cuinfer configurations")
    ap.add_argument("--fi-warm", action="store_true", help="only JIT-compile FlashInfer's fa2 modules")
    ap.add_argument("--fi-wait", type=float, default=60.0, help="seconds --fi waits for --fi-warm (default 60)")
    ap.add_argument("--cases", default=None, help="comma-separated case ids (default: P1-P6)")
    args = ap.parse_args(argv)
    ids = None if args.cases is None else [c.strip().upper() for c in args.cases.split(",")]
    if args.fi_warm:
        fi_warm()
    elif args.fi:
        fi(ids, args.fi_wait)
    else:
        tune(ids)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
