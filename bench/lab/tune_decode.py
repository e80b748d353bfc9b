"""Tuning sweep for batch decode (GPU machine): split size per standard case, with plan statistics.

python -m bench.lab.tune_decode [D1 D4 D5 D8 ...]. Picks the split policy's constants; not a standard suite.
"""

from __future__ import annotations

import functools
import sys

import numpy as np


def _stats(w) -> str:
    work = w._plan.work
    loads = np.zeros(work.num_ctas)
    starts, ends = work_items(work)
    np.add.at(loads, np.repeat(np.arange(work.num_ctas), np.diff(work.work_indptr)), ends - starts + 64)
    return (f"ctas {work.num_ctas} items {work.n_items} chunk {work.chunk_size} merge {len(work.merge_dst_head)} "
            f"balance {loads.mean() / max(loads.max(), 1):.3f} mode {work.assign_mode}")  # fmt: skip


def work_items(work):
    return np.asarray(work.item_kv_start), np.asarray(work.item_kv_end)


def main(case_ids: list[str]) -> None:
    import cuinfer
    from bench import cases, inputs
    from bench.timing import CudaTimer

    timer = CudaTimer()
    by_id = {c.id: c for c in cases.DECODE_CASES}
    for cid in case_ids:
        inp = inputs.decode_inputs(by_id[cid])
        s, kv = inp.case.shape, inp.kv
        nbytes = cases.decode_bytes(inp.case.lengths.draw(inp.case.seed), s, inp.case.kv_dtype)
        for split in (None, 1 << 20, 256, 512, 1024, 2048, 4096):
            w = cuinfer.BatchDecode(use_tensor_cores=True)
            try:
                w.plan(kv.table.kv_indptr, kv.table.kv_indices, kv.table.kv_last_page_len,
                       num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                       page_size=s.page_size, q_dtype=s.dtype, fixed_split_size=split)  # fmt: skip
                t = timer.time(functools.partial(w.run, inp.q, kv.cache), iters=25, warmup=3)
                print(f"{cid} split {str(split):8s} {t.us:7.1f} us (min {t.min_s * 1e6:6.1f}) "
                      f"{nbytes / t.median_s / 1e9:6.0f} GB/s  {_stats(w)}", flush=True)  # fmt: skip
            except Exception as exc:  # noqa: BLE001
                print(f"{cid} split {split}: {type(exc).__name__}: {str(exc)[:150]}", flush=True)
        inputs.free()


if __name__ == "__main__":
    main(sys.argv[1:] or ["D1", "D2", "D4", "D5", "D8"])
