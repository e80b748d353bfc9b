"""The floor of a small decode step: how fast can *any* kernel read a case's K/V bytes by the benchmark method? (Lab.)

python -m bench.lab.stream_floor [--cases D1,D2,D4] [--quick]   (GPU machine; default $CUINFER_FLOOR_CASES, else
                                                                 D1,D2,D4; --quick: evict-normal loads only)
python -m bench.lab.stream_floor plot OUT.png DECODE.json FLOOR.txt [FLOOR.txt ...]   (anywhere: the plot of a record)

A decode step must read every K/V byte once. This probe times plain read kernels over a buffer of each case's bytes
by the docs/benchmarks.md method (CUDA events, L2 flushed by a 512 MB write, median), sweeping what a read kernel can
choose:

* the L2 policy of the loads (``normal``; ``first``: evict-first, so the stream replaces its own lines instead of the
  dirty lines the flush left, see ``decode.policy.kv_evict_first``),
* the bytes in flight per SM (CTAs per SM x 256 threads x 16-byte loads in flight per thread): the in-flight lines
  are the ones that must displace the flush's dirty lines (written back to HBM) before they can land,
* the order (``grid``: all CTAs walk the buffer together, 4 KB apart; ``block``: each CTA a contiguous range, as a
  decode CTA reads its pages).

Each row also runs after a write-then-read flush (clean L2) to separate the write-back from the stream itself. The
best row of a case bounds what the decode kernel can reach under the same method: the kernel reads the same bytes
plus its plan, page table, q and o, and computes on them. Plain CuPy kernels (NVRTC): nothing of cuinfer runs here.
The floors measured so far, and the decode targets set from them: docs/benchmarks.md, "The floor of a decode step".
"""

from __future__ import annotations

import argparse
import itertools
import os

import numpy as np

_SRC = r"""
// The L2 policy of every load (POLICY_FIRST: evict-first, else evict-normal) and one 16-byte load under it.
__device__ __forceinline__ unsigned long long l2_policy() {
  unsigned long long pol;
#if POLICY_FIRST
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#else
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
#endif
  return pol;
}

__device__ __forceinline__ uint4 load_hinted(const uint4* a, unsigned long long pol) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(a), "l"(pol));
  return v;
}

extern "C" __global__ void __launch_bounds__(256) stream_read(const uint4* __restrict__ src, long long n16,
                                                              unsigned* __restrict__ sink) {
  const unsigned long long pol = l2_policy();
  unsigned acc = 0;
#if ORDER_BLOCK
  const long long per = (n16 + gridDim.x - 1) / gridDim.x;
  const long long lo = per * blockIdx.x, hi = min(n16, lo + per);
  long long i = lo + threadIdx.x;
  const long long stride = blockDim.x;
#else
  const long long hi = n16;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
#endif
  for (; i + (UNROLL - 1) * stride < hi; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      v[j] = load_hinted(src + i + j * stride, pol);
    }
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < hi; i += stride) {
    const uint4 v = src[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // (never true for the random data: keeps the loads alive)
}

// A decode step's pattern: pages of 16 tokens x 8 heads x ROW_BYTES (a K or V row of one head: 256 B for 16-bit head
// dim 128, 128 B for fp8) in a random order; CTA c reads a contiguous run of the page list, either one head's slices
// (head c % 8, lanes of 8 CTAs over the same pages: 16 rows per page) or whole pages. A pass of the 256 threads reads
// SLICES = 256 / (16 x CHUNKS) consecutive slices of the run (16-byte chunks per row: CHUNKS); UNROLL passes in flight.
extern "C" __global__ void __launch_bounds__(256) page_read(const uint4* __restrict__ src,
                                                            const int* __restrict__ pages, int n_pages, int whole,
                                                            unsigned* __restrict__ sink) {
  constexpr int CHUNKS = ROW_BYTES / 16, SLICES = 256 / (16 * CHUNKS), PAGE16 = 16 * 8 * CHUNKS;
  const unsigned long long pol = l2_policy();
  const int lanes = whole ? gridDim.x : gridDim.x / 8;
  const int lane = whole ? blockIdx.x : blockIdx.x / 8, head = blockIdx.x % 8;
  const int per = (n_pages + lanes - 1) / lanes;
  const int lo = per * lane, hi = min(n_pages, lo + per);
  const int passes = whole ? 8 : 1;
  const int sub = threadIdx.x / (16 * CHUNKS), tok = threadIdx.x / CHUNKS % 16, chunk = threadIdx.x % CHUNKS;
  unsigned acc = 0;
  const int total = (hi - lo) * passes;  // slices of the run
  for (int u0 = 0; u0 < total; u0 += UNROLL * SLICES) {
    uint4 v[UNROLL];
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const int u = min(u0 + j * SLICES + sub, total - 1);
      const int pg = pages[lo + u / passes];
      const int h = whole ? u % passes : head;
      v[j] = load_hinted(src + (long long)pg * PAGE16 + tok * 8 * CHUNKS + h * CHUNKS + chunk, pol);
    }
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}
"""


def kernel_options(policy: str, unroll: int, order: str, row_bytes: int = 256) -> tuple[str, ...]:
    """The NVRTC options of one read kernel: its L2 policy (``normal`` / ``first``), loads in flight per thread and
    order (``grid`` / ``block``); ``row_bytes``: a page's row of one head (page_read: 256 for 16-bit head dim 128, 128
    for fp8)."""
    if policy not in ("normal", "first") or order not in ("grid", "block") or unroll < 1:
        raise ValueError(f"policy normal|first, order grid|block, unroll >= 1; got {policy!r}, {order!r}, {unroll}")
    if row_bytes not in (128, 256):
        raise ValueError(f"row_bytes is 128 or 256; got {row_bytes}")
    return (f"-DUNROLL={unroll}", f"-DPOLICY_FIRST={int(policy == 'first')}", f"-DORDER_BLOCK={int(order == 'block')}",
            f"-DROW_BYTES={row_bytes}", "-std=c++17")  # fmt: skip


def _kernel(policy: str, unroll: int, order: str, name: str = "stream_read", row_bytes: int = 256):
    import cupy as cp

    return cp.RawKernel(_SRC, name, options=kernel_options(policy, unroll, order, row_bytes))


def main(want: list[str], quick: bool = False) -> None:
    import cupy as cp
    import torch

    from bench import cases
    from bench.timing import CudaTimer

    by_id = {c.id.upper(): c for c in cases.DECODE_CASES}
    dirty, clean = CudaTimer(), CudaTimer(clean_flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)  # (CuPy 14 warns: deprecated)
    sink = cp.zeros(1 << 16, dtype=cp.uint32)
    t = dirty.time(lambda: torch.cuda._sleep(1), iters=30, warmup=3)
    print(f"near-empty kernel {t.us:.2f} us ({sms} SMs)", flush=True)
    for want_id in want:
        case = by_id[want_id]
        cid = case.id
        nbytes = cases.decode_bytes(case.lengths.draw(case.seed), case.shape, case.kv_dtype)
        buf = cp.random.randint(0, 2**31 - 1, size=nbytes // 4, dtype=cp.int32)
        n16 = nbytes // 16
        flat = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        ts = dirty.time(lambda flat=flat: flat.sum(), iters=30, warmup=3)
        print(f"{cid} {nbytes / 1e6:.0f} MB: torch.sum {ts.us:.1f} us", flush=True)
        del flat
        rows = []
        policies = ("normal",) if quick else ("normal", "first")  # (evict-normal is best from D5's size on)
        for policy, order, per_sm, unroll in itertools.product(policies, ("grid", "block"), (1, 2, 4, 8),
                                                               (1, 2, 4, 8)):  # fmt: skip
            k = _kernel(policy, unroll, order)
            grid, args = sms * per_sm, (buf, cp.int64(n16), sink)

            def run(k=k, grid=grid, args=args):
                with stream:
                    k((grid,), (256,), args)

            td = dirty.time(run, iters=25, warmup=3)
            tc = clean.time(run, iters=25, warmup=3)
            fly = per_sm * 256 * unroll * 16 // 1024
            rows.append((td.us, tc.us, policy, order, per_sm, unroll, fly))
        rows.sort()
        for td, tc, policy, order, per_sm, unroll, fly in rows[:12]:
            print(f"{cid}  dirty {td:6.1f} us {nbytes / td / 1e6:5.2f} TB/s | clean {tc:6.1f} us | {policy:6s} "
                  f"{order:5s} {per_sm} CTA/SM x unroll {unroll} = {fly:4d} KB in flight per SM")  # fmt: skip
        worst = rows[-1]
        print(f"{cid}  worst dirty {worst[0]:.1f} us ({worst[2]} {worst[3]} {worst[4]}x{worst[5]})", flush=True)
        # The decode pattern over the same bytes: pages of 16 tokens x 8 heads (32 KB; 16 KB of fp8) in a random
        # order, per head (lanes of 8 CTAs) or whole.
        row_bytes = case.shape.head_dim * cases.ITEMSIZE[case.kv_dtype or case.shape.dtype]
        n_pages = nbytes // (16 * 8 * row_bytes)
        perm = cp.asarray(np.random.default_rng(case.seed).permutation(n_pages).astype(np.int32))
        prow = []
        for policy, whole, per_sm, unroll in itertools.product(policies, (0, 1), (2, 4), (2, 4, 8)):
            k = _kernel(policy, unroll, "grid", "page_read", row_bytes)
            grid, args = sms * per_sm, (buf, perm, np.int32(n_pages), np.int32(whole), sink)

            def run(k=k, grid=grid, args=args):
                with stream:
                    k((grid,), (256,), args)

            td = dirty.time(run, iters=25, warmup=3)
            prow.append((td.us, policy, "whole pages" if whole else "head slices", per_sm, unroll))
        prow.sort()
        for td, policy, how, per_sm, unroll in prow[:6]:
            print(f"{cid}  pages dirty {td:6.1f} us {nbytes / td / 1e6:5.2f} TB/s | {policy:6s} {how} {per_sm} "
                  f"CTA/SM x unroll {unroll}")  # fmt: skip
        best_head = min(r for r in prow if r[2] == "head slices")
        best_whole = min(r for r in prow if r[2] == "whole pages")
        print(f"{cid}  pages best: head slices {best_head[0]:.1f} us, whole pages {best_whole[0]:.1f} us", flush=True)
        del buf, perm


def parse_floors(paths: list[str]) -> dict:
    """``{case: {"contiguous": us, "pages": us}}``: the best dirty-flush rows of ``main``'s logs (later files win)."""
    out: dict = {}
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 3 and parts[1] == "dirty":
                    row = out.setdefault(parts[0], {})
                    row["contiguous"] = min(row.get("contiguous", float("inf")), float(parts[2]))
                elif len(parts) > 5 and parts[1:3] == ["pages", "best:"]:
                    out.setdefault(parts[0], {})["pages"] = min(float(parts[5]), float(parts[-2]))
    return out


def plot(png: str, decode_json: str, floor_logs: list[str]) -> None:
    """Per case, µs: the target, cuinfer's and FlashInfer's best time (a decode suite's JSON), and the floors of a
    plain read of the same bytes (contiguous, and as 32 KB pages in a random order) under the same flush."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench import cases

    floors = parse_floors(floor_logs)
    with open(decode_json, encoding="utf-8") as fh:
        rec = json.load(fh)
    by_case: dict = {}
    for m in rec["measurements"]:
        if m["status"] != "ok":
            continue
        key = "cuinfer" if m["impl"] == "cuinfer" and m["variant"] == "default" else m["impl"]
        if key in ("cuinfer", "flashinfer"):
            row = by_case.setdefault(m["case"], {})
            row[key] = min(row.get(key, float("inf")), m["us"])
    ids = [c.id for c in cases.DECODE_CASES if c.id in floors and c.id in by_case]
    targets = {}
    for c in cases.DECODE_CASES:
        if c.id in ids:
            nbytes = cases.decode_bytes(c.lengths.draw(c.seed), c.shape, c.kv_dtype)
            t = c.target
            targets[c.id] = t.value if t.metric == "us" else nbytes / (t.value * 1e9) * 1e6  # (gbps: bytes / time)
    series = (("plain read, contiguous", [floors[i].get("contiguous", np.nan) for i in ids], "#bbbbbb"),
              ("plain read, pages in random order", [floors[i].get("pages", np.nan) for i in ids], "#777777"),
              ("cuinfer", [by_case[i].get("cuinfer", np.nan) for i in ids], "#1f77b4"),
              ("FlashInfer best", [by_case[i].get("flashinfer", np.nan) for i in ids], "#ff7f0e"))  # fmt: skip
    # small steps (µs targets) and large ones (hundreds of µs) on panels of their own scales
    panels = [[k for k, i in enumerate(ids) if (targets[i] < 100) == small] for small in (True, False)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [max(1, len(p)) for p in panels]})
    for ax, sub in zip(axes, panels, strict=True):
        x = np.arange(len(sub))
        for j, (label, vals, color) in enumerate(series):
            ax.bar(x + (j - 1.5) * 0.2, [vals[k] for k in sub], 0.2, label=label, color=color)
        ax.scatter(x, [targets[ids[k]] for k in sub], marker="_", s=900, color="red", zorder=3, label="target")
        ax.set_xticks(x, [ids[k] for k in sub])
        ax.set_ylabel("µs (lower is better)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Decode step time against a plain read of the same bytes (H200, L2 flushed by a 512 MB write)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.stream_floor", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command")
    ap.add_argument("--cases", default=os.environ.get("CUINFER_FLOOR_CASES", "D1,D2,D4"),
                    help="decode cases to probe ($CUINFER_FLOOR_CASES; default D1,D2,D4)")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="evict-normal loads only (half the rows)")
    p = sub.add_parser("plot", help="a record's decode step times against the floors of its logs (any machine)")
    p.add_argument("png", help="the PNG to write")
    p.add_argument("decode_json", help="a decode suite's JSON (python -m bench decode)")
    p.add_argument("floors", nargs="+", help="logs of this probe")
    args = ap.parse_args(argv)
    args.cases = [c.strip().upper() for c in args.cases.split(",") if c.strip()]
    return args


if __name__ == "__main__":
    args = parse_args()
    if args.command == "plot":
        plot(args.png, args.decode_json, args.floors)
    else:
        main(args.cases, args.quick)
