"""Run one standard case's kernels a few times, for a profiler attached from outside (GPU machine):

ncu --kernel-name regex:batch_decode --launch-skip 3 --launch-count 1 --set full python3 -m bench.lab.ncu_case D7
ncu --kernel-name regex:BatchPrefill --launch-skip 3 --launch-count 1 --set full python3 -m bench.lab.ncu_case P2 fi

The optional second argument ``fi`` runs FlashInfer's kernel for the case instead (decode: BatchDecode with tensor
cores; prefill: the fa2 backend), so both sides of a ratio can be profiled the same way. ``$CUINFER_NCU_GROUPS``
(1 or 2) forces cuinfer's prefill CTAs per block (paired blocks) in place of the policy's choice.
"""

from __future__ import annotations

import os
import sys


def main(case_id: str, peer: str = "", runs: int = 5) -> None:
    import torch

    from bench import cases, inputs
    from bench.decode import prepare_cuinfer as prepare_decode
    from bench.decode import prepare_fi_decode
    from bench.prefill import prepare_cuinfer as prepare_prefill
    from bench.prefill import prepare_fi

    decode = {c.id: c for c in cases.DECODE_CASES}
    prefill = {c.id: c for c in cases.PREFILL_CASES}
    fi = peer == "fi"
    groups = os.environ.get("CUINFER_NCU_GROUPS")
    if groups:
        import cuinfer.prefill.policy as policy

        policy.block_groups = lambda *args, **kwargs: int(groups)
    if case_id in decode:
        inp = inputs.decode_inputs(decode[case_id])
        prep = prepare_fi_decode(inp, True) if fi else prepare_decode(inp, None)
    elif case_id in prefill:
        inp = inputs.prefill_inputs(prefill[case_id])
        prep = prepare_fi(inp, "fa2") if fi else prepare_prefill(inp, "fa2")
    else:
        raise SystemExit(f"unknown case {case_id!r}; one of {sorted(decode) + sorted(prefill)}")
    for _ in range(runs):
        prep.run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "D7", sys.argv[2] if len(sys.argv) > 2 else "")
