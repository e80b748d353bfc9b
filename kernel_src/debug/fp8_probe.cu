// Probe of the fp8 conversions of common/fp8.cuh, for the tests (tests/gpu/test_fp8_gpu.py runs it on the GPU,
// tests/cpu/test_fp8_conversion.py compiles it and checks its SASS). Not part of any attention kernel.
//
// fp8_probe<T, F8>: thread i < 64 takes the four codes 4i .. 4i+3 as one 32-bit register and writes the 16-bit results
// of each byte pair the kernels use: out[8 i + 0..1] = pair<0, 1> (the K fragments' low pair), [2..3] = pair<2, 3>,
// [4..5] = pair<0, 2> (the V fragments' even pair), [6..7] = pair<1, 3>; each pair's low half first. So every one of
// the 256 codes goes through each of the four byte positions' paths exactly once per pair it belongs to.
// fp8_probe_float<F8>: out[i] = the CUDA-core path (to_float8) of code i, as float.
// fp8_probe_f16s<F8>: thread i < 64, the same register: out[4 i + 0..1] = f16s_pairs' bytes (0, 2), [2..3] = (1, 3)
// (the decode tensor-core kernel's float16 fragments, times 2^-F16s<F8>::kPow).
// fp8_probe_kpairs<F8>: thread i < 64, the same register: out[4 i + 0..1] = k_pairs' bytes (0, 1), [2..3] = (2, 3)
// (the decode tensor-core kernel's K fragments, times 2^-F16sK<F8>::kPow).
// fp8_probe_vpairs<F8>: thread i < 64, the same register: out[4 i + 0..1] = v_pairs' bytes (0, 2), [2..3] = (1, 3)
// (the decode tensor-core kernel's V fragments, times 2^-F16sV<F8>::kPow).
#include "common/fp8.cuh"

namespace cuinfer {

template <typename T, typename F8> __global__ void fp8_probe(unsigned short* out) {
  const u32 i = threadIdx.x;
  if (i >= 64) return;
  const u32 x = (4 * i) | ((4 * i + 1) << 8) | ((4 * i + 2) << 16) | ((4 * i + 3) << 24);
  const u32 r[4] = {fp8::pair<T, F8, 0, 1>(x), fp8::pair<T, F8, 2, 3>(x), fp8::pair<T, F8, 0, 2>(x),
                    fp8::pair<T, F8, 1, 3>(x)};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    out[8 * i + 2 * k] = static_cast<unsigned short>(r[k] & 0xffffu);
    out[8 * i + 2 * k + 1] = static_cast<unsigned short>(r[k] >> 16);
  }
}

template <typename F8> __global__ void fp8_probe_float(float* out) {
  const u32 i = threadIdx.x;
  if (i >= 32) return;
  uint2 raw;
  raw.x = (8 * i) | ((8 * i + 1) << 8) | ((8 * i + 2) << 16) | ((8 * i + 3) << 24);
  raw.y = (8 * i + 4) | ((8 * i + 5) << 8) | ((8 * i + 6) << 16) | ((8 * i + 7) << 24);
  float f[8];
  fp8::to_float8<F8>(raw, f);
#pragma unroll
  for (int k = 0; k < 8; ++k) out[8 * i + k] = f[k];
}

template <typename F8> __global__ void fp8_probe_f16s(unsigned short* out) {
  const u32 i = threadIdx.x;
  if (i >= 64) return;
  const u32 x = (4 * i) | ((4 * i + 1) << 8) | ((4 * i + 2) << 16) | ((4 * i + 3) << 24);
  u32 p02, p13;
  fp8::f16s_pairs<F8>(x, p02, p13);
  out[4 * i + 0] = static_cast<unsigned short>(p02 & 0xffffu);
  out[4 * i + 1] = static_cast<unsigned short>(p02 >> 16);
  out[4 * i + 2] = static_cast<unsigned short>(p13 & 0xffffu);
  out[4 * i + 3] = static_cast<unsigned short>(p13 >> 16);
}

template <typename F8> __global__ void fp8_probe_kpairs(unsigned short* out) {
  const u32 i = threadIdx.x;
  if (i >= 64) return;
  const u32 x = (4 * i) | ((4 * i + 1) << 8) | ((4 * i + 2) << 16) | ((4 * i + 3) << 24);
  u32 p01, p23;
  fp8::k_pairs<F8>(x, p01, p23);
  out[4 * i + 0] = static_cast<unsigned short>(p01 & 0xffffu);
  out[4 * i + 1] = static_cast<unsigned short>(p01 >> 16);
  out[4 * i + 2] = static_cast<unsigned short>(p23 & 0xffffu);
  out[4 * i + 3] = static_cast<unsigned short>(p23 >> 16);
}

template <typename F8> __global__ void fp8_probe_vpairs(unsigned short* out) {
  const u32 i = threadIdx.x;
  if (i >= 64) return;
  const u32 x = (4 * i) | ((4 * i + 1) << 8) | ((4 * i + 2) << 16) | ((4 * i + 3) << 24);
  u32 p02, p13;
  fp8::v_pairs<F8>(x, p02, p13);
  out[4 * i + 0] = static_cast<unsigned short>(p02 & 0xffffu);
  out[4 * i + 1] = static_cast<unsigned short>(p02 >> 16);
  out[4 * i + 2] = static_cast<unsigned short>(p13 & 0xffffu);
  out[4 * i + 3] = static_cast<unsigned short>(p13 >> 16);
}

}  // namespace cuinfer
