"""Run one standard case's cuinfer kernels a few times, for a profiler attached from outside (GPU machine):

ncu --kernel-name regex:batch_decode --launch-skip 3 --launch-count 1 --set full python3 -m bench.ncu_case D7
"""

from __future__ import annotations

import sys


def main(case_id: str, runs: int = 5) -> None:
    import torch

    from bench import cases, inputs
    from bench.decode import prepare_cuinfer as prepare_decode
    from bench.prefill import prepare_cuinfer as prepare_prefill

    decode = {c.id: c for c in cases.DECODE_CASES}
    prefill = {c.id: c for c in cases.PREFILL_CASES}
    if case_id in decode:
        prep = prepare_decode(inputs.decode_inputs(decode[case_id]), None)
    elif case_id in prefill:
        prep = prepare_prefill(inputs.prefill_inputs(prefill[case_id]), "fa2")
    else:
        raise SystemExit(f"unknown case {case_id!r}; one of {sorted(decode) + sorted(prefill)}")
    for _ in range(runs):
        prep.run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "D7")
