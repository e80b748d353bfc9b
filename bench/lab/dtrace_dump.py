"""Lab: the raw per-CTA stamps of the decode trace build (tune_sched dtrace's kernel) for a few runs of each case,
with the plan's per-CTA work, saved for offline analysis (which CTAs exit early, on which SMs, with what work).

python -m bench.lab.dtrace_dump OUT.npz [CASE ...]   (GPU machine; default D10)
"""

from __future__ import annotations

import sys

import numpy as np


def main(out: str, case_ids: list[str]) -> None:
    from bench import inputs
    from bench.lab.harness import TraceBuffer, planned_decode
    from bench.lab.tune_sched import _decode_input, dtrace_variant
    from bench.timing import CudaTimer, cuda_torch

    torch = cuda_torch()
    timer = CudaTimer()
    tbuf = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
    tb = TraceBuffer(tbuf.data_ptr())
    saved = {}
    for cid in case_ids:
        inp = _decode_input(cid)
        w, fn = planned_decode(inp, trace=tb, **dtrace_variant("base"))
        fn()
        work = w._plan.work
        n = work.num_ctas
        runs = []
        for _ in range(8):
            tbuf.zero_()
            timer.flush_l2()
            timer.head_start()
            fn()
            torch.cuda.synchronize()
            runs.append(tbuf[: 16 * n].view(n, 16).cpu().numpy().copy())
        saved[f"{cid}_stamps"] = np.stack(runs)
        saved[f"{cid}_work_indptr"] = np.asarray(work.work_indptr)
        for f in ("item_kv_start", "item_kv_end", "item_req", "item_kv_head", "item_partial", "item_merge"):
            saved[f"{cid}_{f}"] = np.asarray(getattr(work, f))
        print(f"{cid}: {n} CTAs, {work.n_items} items, saved", flush=True)
        inputs.free()
    np.savez(out, **saved)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["D10"])
