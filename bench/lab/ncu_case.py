"""Run one standard case's kernels a few times, for a profiler attached from outside (GPU machine; lab code):

ncu --kernel-name regex:batch_decode --launch-skip 3 --launch-count 1 --set full python3 -m bench.lab.ncu_case D7
ncu --kernel-name regex:batch_prefill --launch-skip 3 --launch-count 1 --set full python3 -m bench.lab.ncu_case P2 fi

The optional second argument ``fi`` runs FlashInfer's kernel for the case instead (decode: BatchDecode with tensor
cores; prefill: the fa2 backend), so both sides of a ratio can be profiled the same way. ``--groups 1|2`` (or
$CUINFER_NCU_GROUPS) plans cuinfer's prefill with that many CTAs per block (paired blocks) on the policy's tiles,
through plan(tile_sizes=...).
"""

from __future__ import annotations

import argparse
import os


def forced_groups(config, groups: int) -> tuple[int, int, int, int]:
    """``tile_sizes`` of plan() that keep a prefill plan's tiles (``config``: its ``TileConfig``) and force
    ``groups`` CTAs per block."""
    if groups not in (1, 2):
        raise ValueError(f"CTAs per block must be 1 or 2 but is {groups}")
    return (config.tile_q, config.tile_kv, config.stages, groups)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.ncu_case", description=__doc__.splitlines()[0])
    ap.add_argument("case", nargs="?", default="D7", help="a decode or prefill case id (default D7)")
    ap.add_argument("peer", nargs="?", default="", choices=("", "fi"), help="fi: FlashInfer's kernel instead")
    ap.add_argument("--runs", type=int, default=5, help="runs of the case (default 5)")
    env = os.environ.get("CUINFER_NCU_GROUPS")
    ap.add_argument("--groups", type=int, choices=(1, 2), default=int(env) if env else None,
                    help="cuinfer prefill: CTAs per block ($CUINFER_NCU_GROUPS; default: the policy's)")  # fmt: skip
    ap.add_argument("--pos-encoding", default="none", choices=("none", "rope_llama"),
                    help="cuinfer decode: plan with this pos_encoding (fused RoPE)")  # fmt: skip
    ap.add_argument("--backend", choices=("auto", "fa2", "sm90"), default=None,
                    help="cuinfer prefill: the prefill suite's plan on this backend")  # fmt: skip
    ap.add_argument("--soft-cap", type=float, default=0.0,
                    help="cuinfer prefill with --backend: plan with logits_soft_cap (0: none)")  # fmt: skip
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from bench import cases, inputs
    from bench.decode import prepare_cuinfer as prepare_decode
    from bench.decode import prepare_fi_decode
    from bench.lab.harness import planned_prefill
    from bench.prefill import prepare_fi
    from bench.timing import cuda_torch

    torch = cuda_torch()
    decode = {c.id: c for c in cases.DECODE_CASES}
    prefill = {c.id: c for c in cases.PREFILL_CASES}
    fi = args.peer == "fi"
    if args.case in decode:
        inp = inputs.decode_inputs(decode[args.case])
        run = (prepare_fi_decode(inp, True) if fi else prepare_decode(inp, None, args.pos_encoding)).run
    elif args.case in prefill:
        inp = inputs.prefill_inputs(prefill[args.case])
        if fi:
            run = prepare_fi(inp, "fa2").run
        elif args.backend is not None:
            from bench.prefill import prepare_cuinfer as prepare_prefill

            options = {"logits_soft_cap": args.soft_cap} if args.soft_cap else None
            run = prepare_prefill(inp, args.backend, options).run
        else:
            w, run = planned_prefill(inp)
            if args.groups is not None:
                w, run = planned_prefill(inp, tile_sizes=forced_groups(w._plan.config, args.groups))
    else:
        raise SystemExit(f"unknown case {args.case!r}; one of {sorted(decode) + sorted(prefill)}")
    for _ in range(args.runs):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
