"""Lab: mma.sync throughput of the operand types the attention kernels could use, on this GPU (GPU machine), and
the SASS each type compiles to (anywhere).

    python -m bench.lab.mma_probe                 # GPU machine: timings
    python -m bench.lab.mma_probe --sass sm_90a   # no GPU: opcode counts of each type's one-chain kernel

Each kernel keeps CHAINS independent accumulator tiles per warp and issues ITERS rounds of one mma.sync per chain
(no loads: the fragments are registers), WARPS warps per CTA, CTAS_PER_SM CTAs per SM. Printed per type and
configuration: instructions per SM per clock, dense TFLOP/s (FLOPs of the instruction's shape), and the time of one
instruction per SM sub-partition. Question it answers: does an fp8 m16n8k32 (e4m3 x e4m3, or e4m3 x e5m2) issue at
the f16 m16n8k16 rate (twice its FLOPs) or at its FLOPs (half the rate)? A Q·K^T over fp8 K with q split into two
fp8 parts (two k32 MMAs per 32 dims, no K conversion) costs as much tensor time as float16 Q·K^T only in the first
case. Plain CuPy kernels (NVRTC): nothing of cuinfer runs.

The SASS answers it for sm_90 without a GPU (2026-12-02, NVRTC 12.9): sm_90 has no fp8 mma.sync instruction; ptxas
turns each e4m3 m16n8k32 into F2FP.F16.E4M3.UNPACK_B conversions of both fragments, two HMMA.16816.F32 and FADDs
(sm_89 has QMMA.16832.F32.E4M3.E4M3). On Hopper only wgmma takes fp8 operands.
"""

from __future__ import annotations

import argparse

_SRC = r"""
extern "C" __global__ void __launch_bounds__(32 * WARPS) mma_loop(float* out, int iters) {
  unsigned a0 = 0x3c003c00u ^ threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b0 = a0 + 4, b1 = a0 + 5;
  float c[CHAINS][4];
#pragma unroll
  for (int i = 0; i < CHAINS; ++i) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < CHAINS; ++i) {
      asm volatile(MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                   : "+f"(c[i][0]), "+f"(c[i][1]), "+f"(c[i][2]), "+f"(c[i][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < CHAINS; ++i) acc += c[i][0] + c[i][1] + c[i][2] + c[i][3];
  if (acc == 123.456f) out[threadIdx.x] = acc;  // (keeps the chains alive)
}
"""


def source(ptx: str) -> str:
    """The kernel's source for one mma instruction (m16n8k8 takes two A registers and one B register)."""
    src = _SRC
    if ".m16n8k8." in ptx:
        src = src.replace("{%4, %5, %6, %7}, {%8, %9}", "{%4, %5}, {%6}").replace(
            '"r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1)', '"r"(a0), "r"(a1), "r"(b0)'
        )
    return src.replace("MMA", f'"{ptx}"')


def sass_ops(arch: str) -> None:
    """Opcode counts of each type's kernel (4 warps, one chain) compiled by NVRTC for ``arch``."""
    import collections

    from bench.lab.sass_snapshot import nvrtc_cubin
    from cuinfer.jit.sass import disassemble

    for name, (ptx, _) in TYPES.items():
        cubin = nvrtc_cubin(source(ptx), arch, ("-DWARPS=4", "-DCHAINS=1"), name="mma_probe.cu")
        if cubin is None:
            print(f"{name:20s} does not compile for {arch}")
            continue
        ops = collections.Counter(
            op for insns in disassemble(cubin).values() for op in insns
            if any(k in op for k in ("MMA", "F2FP", "FADD", "PRMT"))
        )  # fmt: skip
        print(f"{name:20s} {arch}: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())), flush=True)


TYPES = {  # name: (PTX instruction, FLOPs per instruction)
    "f16 m16n8k16": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 2 * 16 * 8 * 16),
    "bf16 m16n8k16": ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 2 * 16 * 8 * 16),
    "e4m3 m16n8k32": ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 2 * 16 * 8 * 32),
    "e4m3.e5m2 m16n8k32": ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32", 2 * 16 * 8 * 32),
    "f16 m16n8k8": ("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32", 2 * 16 * 8 * 8),
}


def main(iters: int) -> None:
    import cupy as cp

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    clock_khz = dev.attributes["ClockRate"]
    out = cp.zeros(1024, dtype=cp.float32)
    print(f"{sms} SMs, max clock {clock_khz / 1e6:.2f} GHz; {iters} rounds per warp", flush=True)
    for name, (ptx, flops) in TYPES.items():
        for warps, chains, per_sm in ((4, 4, 2), (4, 8, 2), (8, 4, 1), (8, 8, 2)):
            src = source(ptx)
            k = cp.RawKernel(src, "mma_loop", options=(f"-DWARPS={warps}", f"-DCHAINS={chains}", "-std=c++17"))
            grid = sms * per_sm
            k((grid,), (32 * warps,), (out, cp.int32(16)))  # compile, warm up
            start, end = cp.cuda.Event(), cp.cuda.Event()
            times = []
            for _ in range(5):
                start.record()
                k((grid,), (32 * warps,), (out, cp.int32(iters)))
                end.record()
                end.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
            t = sorted(times)[2]
            n = grid * warps * chains * iters  # instructions (warp-wide)
            per_sm_clk = n / sms / (t * clock_khz * 1e3)
            tflops = n * flops / t / 1e12
            print(f"{name:20s} {warps} warps x {chains} chains x {per_sm} CTA/SM: {t * 1e3:8.3f} ms  "
                  f"{per_sm_clk:6.3f} instr/SM/clk (at max clock)  {tflops:7.1f} TFLOP/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--sass", metavar="ARCH", help="print each type's MMA / conversion opcodes for ARCH (no GPU)")
    args = ap.parse_args()
    if args.sass:
        sass_ops(args.sass)
    else:
        main(args.iters)
