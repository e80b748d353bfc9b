"""Lab: MUFU throughput per SM of tanh.approx.f32, ex2.approx.f32 and rcp.approx.f32 (and FFMA for scale), and of the
16-bit tanh / ex2 forms (scalar f16 with a float32 kernel's conversions; packed f16x2 / bf16x2), on the GPU.

    python -m bench.lab.mufu_probe
    python -m bench.lab.mufu_probe --sass sm_90a   # no GPU: the MUFU opcodes each form (f32, 16-bit) becomes
    python -m bench.lab.mufu_probe --latency       # cycles per op of one dependent chain per warp

Each thread runs 8 independent chains of N dependent ops (x = op(x) * 0.5 + 0.25 keeps the values finite; the
FFMA is counted in the op's row and measured alone in the "ffma" row), 8 warps per SMSP, enough blocks to fill every
SM; CUDA events, the median of 5 launches. Prints warp-instructions per clock per SM (clock: the SM clock while
running, from nvidia-smi when it can be read, else the GPU's max) and the op's results per clock per SM (a packed
form gives two per step).
"""

from __future__ import annotations

import subprocess

OPS = {
    "tanh": 'asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x[c]));',
    "ex2": 'asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x[c]));',
    "rcp": 'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x[c]));',
    "ffma": "y = x[c];",
}
N = 4096

# The scalar f16 forms with the conversions a float32 kernel needs around them.
HALF = {
    f"{op}.f16": f'asm("{{.reg .b16 h; cvt.rn.f16.f32 h, %1; {op}.approx.f16 h, h; cvt.f32.f16 %0, h;}}" '
    ': "=f"(y) : "f"(x[c]));'
    for op in ("tanh", "ex2")
}

# The packed 16-bit forms: a pair of floats packed, the op, both halves back to float and added (so the
# compiler keeps both halves' results).
PACKED = {
    f"{op}.{t}": f'asm("{{.reg .b32 h, r; .reg .b16 lo, hi; .reg .f32 a, b; cvt.rn.{t}.f32 h, %1, %2; '
    f"{op}.approx{ftz}.{t} r, h; mov.b32 {{lo, hi}}, r; cvt.f32.{t[:-2]} a, lo; cvt.f32.{t[:-2]} b, hi; "
    f'add.f32 %0, a, b;}}" : "=f"(y) : "f"(x[c]), "f"(x[c] * 0.5f));'
    for op in ("tanh", "ex2")
    for t in ("f16x2", "bf16x2")
    for ftz in [".ftz" if (op, t) == ("ex2", "bf16x2") else ""]
}


def _src(body: str) -> str:
    return f"""
extern "C" __global__ void k(float* out, float seed) {{
  float x[8];
  #pragma unroll
  for (int c = 0; c < 8; ++c) x[c] = seed + 0.01f * c + 1e-6f * threadIdx.x;
  for (int i = 0; i < {N}; ++i) {{
    #pragma unroll
    for (int c = 0; c < 8; ++c) {{ float y; {body} x[c] = fmaf(y, 0.5f, 0.25f); }}
  }}
  float s = 0.f;
  #pragma unroll
  for (int c = 0; c < 8; ++c) s += x[c];
  if (s == 12345.f) out[threadIdx.x] = s;
}}
"""


# --latency: one dependent chain per warp (x = op(x)), W warps on each SMSP; clock64 around 4096 steps gives the
# cycles per step: the op's latency as the warp sees it (ptxas's schedule of the soft cap assumes ~16 for MUFU, see
# bench/lab/sass_ctrl.py), or W times the unit's interval once W chains fill it.
CHAINS = {
    "tanh": 'asm("tanh.approx.f32 %0, %0;" : "+f"(x));',
    "ex2": 'asm("ex2.approx.ftz.f32 %0, %0;" : "+f"(x));',
    "tanh+ffma": 'asm("tanh.approx.f32 %0, %0;" : "+f"(x)); x = fmaf(x, 0.5f, 0.25f);',
    "tanh+ffma+ex2": 'asm("tanh.approx.f32 %0, %0;" : "+f"(x)); x = fmaf(x, -8.f, -9.f); '
    'asm("ex2.approx.ftz.f32 %0, %0;" : "+f"(x));',
    "ffma": "x = fmaf(x, 0.5f, 0.25f);",
}


def _chain_src(body: str) -> str:
    return f"""
extern "C" __global__ void lat(float* out, long long* cyc, float seed) {{
  float x = seed + 1e-6f * threadIdx.x;
  const long long t0 = clock64();
  #pragma unroll 16
  for (int i = 0; i < {N}; ++i) {{ {body} }}
  const long long t1 = clock64();
  if (x == 12345.f) out[threadIdx.x] = x;
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = t1 - t0;
}}
"""


def latency() -> int:
    import cupy as cp

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    opts = ("-arch=sm_90a",) if dev.compute_capability == "90" else ()
    out = cp.zeros(1024, cp.float32)
    print("op              warps/SMSP  cycles per step (median over warps; min - max)")
    for name, body in CHAINS.items():
        k = cp.RawKernel(_chain_src(body), "lat", options=opts)
        for w in (1, 2, 4):
            threads = 128 * w
            cyc = cp.zeros(sms * threads // 32, cp.int64)
            k((sms,), (threads,), (out, cyc, cp.float32(0.3)))
            k((sms,), (threads,), (out, cyc, cp.float32(0.3)))
            c = cp.asnumpy(cyc) / N
            print(f"{name:15s} {w:6d}      {float(sorted(c)[len(c) // 2]):7.2f}  ({c.min():.2f} - {c.max():.2f})")
    return 0


def sass(arch: str) -> dict[str, dict[str, int]]:
    """Print and return the MUFU / conversion opcodes of each op's kernel compiled by NVRTC for ``arch`` (no GPU
    needed): ``{op: {opcode: count}}``, ops that do not compile left out."""
    import collections

    from bench.lab.sass_snapshot import nvrtc_cubin
    from cuinfer.jit.sass import disassemble

    rows: dict[str, dict[str, int]] = {}
    for name, body in {**OPS, **HALF, **PACKED}.items():
        cubin = nvrtc_cubin(_src(body), arch, name="mufu_probe.cu")
        if cubin is None:
            print(f"{name:12s} does not compile for {arch}")
            continue
        kinds = ("MUFU", "F2FP", "HADD2", "PRMT")
        ops = collections.Counter(op for insns in disassemble(cubin).values() for op in insns if op.startswith(kinds))
        # (per kernel: the i loop's unroll differs between forms; compare an op's MUFU count with its packs, one each)
        print(f"{name:12s} {arch}: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())), flush=True)
        rows[name] = dict(ops)
    return rows


def main() -> int:
    import cupy as cp

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    try:
        clk = float(subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True).stdout.split()[0])  # fmt: skip
    except Exception:  # noqa: BLE001
        clk = float("nan")
    out = cp.zeros(1024, cp.float32)
    threads, blocks = 1024, sms * 2  # 64 warps per SM
    for name, body in {**OPS, **HALF, **PACKED}.items():
        k = cp.RawKernel(_src(body), "k", options=("-arch=sm_90a",) if dev.compute_capability == "90" else ())
        k((blocks,), (threads,), (out, cp.float32(0.3)))
        times = []
        for _ in range(5):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            k((blocks,), (threads,), (out, cp.float32(0.3)))
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
        t = sorted(times)[2]
        warp_ops = blocks * threads / 32 * N * 8
        per_clk_sm = warp_ops / (t * clk * 1e6 * sms)
        results = per_clk_sm * 32 * (2 if name in PACKED else 1)
        print(f"{name:11s} {t * 1e3:8.3f} ms  {per_clk_sm:6.3f} warp-instr (op + FFMA) / clock / SM, {results:5.1f} "
              f"results / clock / SM at {clk:.0f} MHz")  # fmt: skip
    return 0


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--sass":
        sass(sys.argv[2])
        raise SystemExit(0)
    if sys.argv[1:] == ["--latency"]:
        raise SystemExit(latency())
    raise SystemExit(main())
