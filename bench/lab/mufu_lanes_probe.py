"""Lab probe: MUFU results per SM and clock of the f32, f16 and bf16 forms of ex2 and tanh, scalar and packed (x2
forms: two results each, which ptxas splits into two MUFU ops on sm_90a), and of tanh through f16 with the
conversions a float32 kernel needs. One CTA of 1024 threads per SM, 16 independent chains per thread, clock64 around
the loop; prints lane results per SM per clock. GPU machine: `python -m bench.lab.mufu_lanes_probe`.
(bench/lab/mufu_probe.py: warp instructions per clock of the f32 forms and rcp, and --sass without a GPU.)"""

import cupy as cp

SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define OPS 16
template <int K> __device__ __forceinline__ void op(unsigned& v);
template <> __device__ __forceinline__ void op<0>(unsigned& v) {  // ex2.approx.ftz.f32
  float x = __uint_as_float(v); asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x)); v = __float_as_uint(x); }
template <> __device__ __forceinline__ void op<1>(unsigned& v) {  // tanh.approx.f32
  float x = __uint_as_float(v); asm volatile("tanh.approx.f32 %0, %0;" : "+f"(x)); v = __float_as_uint(x); }
template <> __device__ __forceinline__ void op<2>(unsigned& v) {  // ex2.approx.f16 (scalar half in the low 16 bits)
  unsigned short h = v; asm volatile("ex2.approx.f16 %0, %0;" : "+h"(h)); v = h; }
template <> __device__ __forceinline__ void op<3>(unsigned& v) {  // tanh.approx.f16
  unsigned short h = v; asm volatile("tanh.approx.f16 %0, %0;" : "+h"(h)); v = h; }
template <> __device__ __forceinline__ void op<4>(unsigned& v) {  // ex2.approx.f16x2 (2 lane-ops)
  asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(v)); }
template <> __device__ __forceinline__ void op<5>(unsigned& v) {  // tanh.approx.f16x2 (2 lane-ops)
  asm volatile("tanh.approx.f16x2 %0, %0;" : "+r"(v)); }
template <> __device__ __forceinline__ void op<6>(unsigned& v) {  // tanh.approx.bf16x2 (2 lane-ops)
  asm volatile("tanh.approx.bf16x2 %0, %0;" : "+r"(v)); }
template <> __device__ __forceinline__ void op<7>(unsigned& v) {  // ffma (reference pipe)
  float x = __uint_as_float(v); asm volatile("fma.rn.f32 %0, %0, %0, %0;" : "+f"(x)); v = __float_as_uint(x); }
template <> __device__ __forceinline__ void op<8>(unsigned& v) {  // f32 -> f16, tanh.approx.f16, -> f32
  float x = __uint_as_float(v); unsigned short h;
  asm volatile("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  asm volatile("tanh.approx.f16 %0, %0;" : "+h"(h));
  asm volatile("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h)); v = __float_as_uint(x); }
template <> __device__ __forceinline__ void op<9>(unsigned& v) {  // f32 pair (v, v ^ 1) -> tanh.approx.f16x2
  float a = __uint_as_float(v), b = __uint_as_float(v ^ 1u); unsigned p;
  asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(a), "f"(b));
  asm volatile("tanh.approx.f16x2 %0, %0;" : "+r"(p));
  unsigned short lo = p, hi = p >> 16;
  asm volatile("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"(lo));
  asm volatile("cvt.f32.f16 %0, %1;" : "=f"(b) : "h"(hi)); v = __float_as_uint(a + b); }
template <int K>
__device__ void run(unsigned* out, long long* cyc, int iters) {
  unsigned v[OPS];
  for (int i = 0; i < OPS; ++i) v[i] = 0x3c003c00u ^ (threadIdx.x * 7 + i);
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < OPS; ++i) op<K>(v[i]);
  }
  __syncthreads();
  long long t1 = clock64();
  unsigned s = 0;
  for (int i = 0; i < OPS; ++i) s ^= v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cyc[blockIdx.x] = t1 - t0;
}
extern "C" __global__ void k0(unsigned* o, long long* c, int n) { run<0>(o, c, n); }
extern "C" __global__ void k1(unsigned* o, long long* c, int n) { run<1>(o, c, n); }
extern "C" __global__ void k2(unsigned* o, long long* c, int n) { run<2>(o, c, n); }
extern "C" __global__ void k3(unsigned* o, long long* c, int n) { run<3>(o, c, n); }
extern "C" __global__ void k4(unsigned* o, long long* c, int n) { run<4>(o, c, n); }
extern "C" __global__ void k5(unsigned* o, long long* c, int n) { run<5>(o, c, n); }
extern "C" __global__ void k6(unsigned* o, long long* c, int n) { run<6>(o, c, n); }
extern "C" __global__ void k7(unsigned* o, long long* c, int n) { run<7>(o, c, n); }
extern "C" __global__ void k8(unsigned* o, long long* c, int n) { run<8>(o, c, n); }
extern "C" __global__ void k9(unsigned* o, long long* c, int n) { run<9>(o, c, n); }
"""
NAMES = [
    "ex2.f32",
    "tanh.f32",
    "ex2.f16",
    "tanh.f16",
    "ex2.f16x2",
    "tanh.f16x2",
    "tanh.bf16x2",
    "ffma.f32",
    "tanh f32>f16>f32",
    "tanh 2xf32 via f16x2",
]
LANES = [1, 1, 1, 1, 2, 2, 2, 1, 1, 2]


def main() -> None:
    mod = cp.RawModule(code=SRC, options=("--std=c++17", "-arch=sm_90a"))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    threads, iters = 1024, 4096
    out = cp.zeros(sms * threads, cp.uint32)
    cyc = cp.zeros(sms, cp.int64)
    for k, (name, lanes) in enumerate(zip(NAMES, LANES, strict=True)):
        f = mod.get_function(f"k{k}")
        f((sms,), (threads,), (out, cyc, cp.int32(16)))
        f((sms,), (threads,), (out, cyc, cp.int32(iters)))
        cp.cuda.Device().synchronize()
        c = float(cp.median(cyc.astype(cp.float64)))
        per_clk = threads * iters * 16 * lanes / c
        print(f"{name:12s} {per_clk:7.1f} lane-results per SM per clock  ({c:.0f} cycles)")


if __name__ == "__main__":
    main()
