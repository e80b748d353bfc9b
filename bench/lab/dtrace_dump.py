"""Lab: the raw per-CTA stamps of the decode trace build (tune_sched dtrace's kernel) for a few runs of each case,
with the plan's per-CTA work, saved for offline analysis (which CTAs exit early, on which SMs, with what work).

python -m bench.lab.dtrace_dump OUT.npz [CASE ...]   (GPU machine; default D10)
python -m bench.lab.dtrace_dump --analyse IN.npz [T]   (anywhere: end times by KV tiles of T tokens (default 128, the
                                                        fp8 tiles; 64 for 16-bit) and items per CTA, the loop time
                                                        per tile, whether a CTA's SM repeats across runs)
"""

from __future__ import annotations

import sys

import numpy as np


def main(out: str, case_ids: list[str]) -> None:
    from bench import inputs
    from bench.lab.harness import TraceBuffer, planned_decode
    from bench.lab.tune_sched import _decode_input, dtrace_variant, trace_stamps
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
        saved[f"{cid}_stamps"] = np.stack(trace_stamps(fn, tbuf, timer, n, 8))
        saved[f"{cid}_work_indptr"] = np.asarray(work.work_indptr)
        for f in ("item_kv_start", "item_kv_end", "item_req", "item_kv_head", "item_partial", "item_merge"):
            saved[f"{cid}_{f}"] = np.asarray(getattr(work, f))
        print(f"{cid}: {n} CTAs, {work.n_items} items, saved", flush=True)
        inputs.free()
    np.savez(out, **saved)


def analyse(path: str, tile: int = 128) -> None:
    z = np.load(path)
    for cid in sorted({k.rsplit("_stamps", 1)[0] for k in z.files if k.endswith("_stamps")}):
        ip, s, e = z[f"{cid}_work_indptr"], z[f"{cid}_item_kv_start"], z[f"{cid}_item_kv_end"]
        n = ip.shape[0] - 1
        tiles = np.array([int(np.sum(-(-(e[ip[k] : ip[k + 1]] - s[ip[k] : ip[k + 1]]) // tile))) for k in range(n)])
        items = np.diff(ip)
        st = z[f"{cid}_stamps"].astype(np.float64)  # [runs, CTAs, words]: trace.cuh's decode words
        g0, g6, sm = st[:, :, 0], st[:, :, 6], st[:, :, 7].astype(np.int64)
        c1, c3, c4, c5 = st[:, :, 1], st[:, :, 3], st[:, :, 4], st[:, :, 5]
        ends = np.median((g6 - g0.min(axis=1, keepdims=True)) / 1e3, axis=0)  # us after the first entry
        q = np.percentile(ends, [0, 10, 50, 90, 100])
        print(f"{cid}: CTA ends (median over {st.shape[0]} runs) min {q[0]:.1f}, p10 {q[1]:.1f}, p50 {q[2]:.1f}, "
              f"p90 {q[3]:.1f}, max {q[4]:.1f} us")  # fmt: skip
        for name, key in (("tiles", tiles), ("items", items)):
            for v in np.unique(key):
                m = key == v
                print(f"  {name} {v}: {m.sum()} CTAs, median end {np.median(ends[m]):.1f}, max {ends[m].max():.1f}")
        ghz = np.median((c5 - c1) / (g6 - g0))
        per_tile = np.median((c4 - c3) / ghz / 1e3, axis=0) / tiles
        p = np.percentile(per_tile, [0, 50, 100])
        print(f"  loop time per KV tile: min {p[0]:.3f}, median {p[1]:.3f}, max {p[2]:.3f} us")
        print(f"  CTAs on the same SM in every run: {(sm == sm[0]).all(axis=0).mean():.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "--analyse":
        analyse(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 128)
    else:
        main(sys.argv[1], sys.argv[2:] or ["D10"])
