"""Cycle probe of the Hopper prefill kernel (GPU machine; lab code): runs standard prefill cases on a build with
-DCUINFER_SM90_PROBE (kernel_src/debug/sm90_probe.cuh) and prints, per warpgroup role, where thread 0's cycles went
(mean over CTAs of the last run, as a share of the warpgroup's total). Unlike the harness's tools it swaps one name of
cuinfer for the run, ``cuinfer.prefill.sm90.sm90_spec`` (the spec the Hopper launch compiles): ``LabPrefill`` launches
the FA2-class kernel only.

python3 -m bench.lab.sm90_probe P4 P4-e4m3
python3 -m bench.lab.sm90_probe P4-e4m3 --defines=-DCUINFER_SM90_PROBE_NO_CONVERT   # a bound probe (wrong results)
python3 -m bench.lab.sm90_probe P1 P2 --variants causal "soft cap 30" alibi    # variant_bench's variants, in turn
"""

from __future__ import annotations

import argparse

# (fp8 TMA staging: slots 1-3 and 7 are a converter's, 3 its staging waits, 7 its float16 stage waits; 4 / 6 the
# issuing warp's K / V boxes with their slots' empty waits)
PRODUCER = ("total", "K stage", "V stage", "staging waits", "fp8 K copies", "q_empty wait", "fp8 V copies", "fp8 empty")
CONSUMER = ("total", "k_full wait", "v_full wait", "turn waits", "q_full wait", "softmax", "QK retire", "PV retire")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.sm90_probe", description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="prefill case ids, e.g. P4 P4-e4m3")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--defines", nargs="*", default=[],
                    help="more -D options as --defines=-DX: sm90_probe.cuh's bound probes")  # fmt: skip
    ap.add_argument("--variants", nargs="*", default=["causal"], metavar="NAME",
                    help="variant_bench's built-in variants to plan each case with (default: causal only: the case as "
                         "bench/cases.py states it)")  # fmt: skip
    args = ap.parse_args(argv)
    from bench.lab.variant_bench import VARIANTS

    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    return args


def probe_spec(spec, defines=()):
    """``spec`` as a probe build (``lab-probe/...``): -DCUINFER_SM90_PROBE and ``defines``."""
    from bench.lab.harness import ab_spec

    return ab_spec(spec, ["-DCUINFER_SM90_PROBE", *defines], tag="probe")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    import cupy

    from bench import cases, inputs
    from bench.prefill import prepare_cuinfer
    from cuinfer.jit.launch import load_module
    from cuinfer.prefill import sm90

    shipped = sm90.sm90_spec
    probe_specs = {}

    def spec_of(key):
        spec = probe_specs.get(key)
        if spec is None:
            spec = probe_specs[key] = probe_spec(shipped(key), args.defines)
        return spec

    sm90.sm90_spec = spec_of  # (lab: Sm90Launch looks the spec up by this name)
    from bench.lab.variant_bench import VARIANTS

    by_id = {c.id: c for c in cases.PREFILL_CASES}
    for cid, variant in ((c, v) for c in args.cases for v in args.variants):
        probe_specs.clear()
        inp = inputs.prefill_inputs(by_id[cid])
        prep = prepare_cuinfer(inp, "sm90", VARIANTS[variant])
        for _ in range(args.runs):
            prep.run()
        cupy.cuda.runtime.deviceSynchronize()
        (spec,) = probe_specs.values()
        _, module = load_module(spec)
        ptr = module.get_global_var("cuinfer_sm90_probe")
        mem = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(int(ptr), 4096 * 24 * 8, module), 0)
        raw = cupy.ndarray((4096 * 24,), dtype=cupy.uint64, memptr=mem).get().reshape(4096, 3, 8).astype(float)
        raw = raw[raw[:, 0, 0] > 0]  # (the CTAs of the grid)
        n = len(raw)
        print(f"{cid} {variant}: {n} CTAs, mean cycles per CTA (share of the warpgroup's total)")
        for wg, names in ((0, PRODUCER), (1, CONSUMER), (2, CONSUMER)):
            tot = raw[:, wg, 0].mean()
            cells = [f"{names[k]} {raw[:, wg, k].mean():,.0f} ({raw[:, wg, k].mean() / tot:.1%})" for k in range(8)
                     if names[k] != "-"]  # fmt: skip
            print(f"  {'producer' if wg == 0 else f'consumer {wg - 1}'}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
