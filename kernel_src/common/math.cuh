// Fast math for the softmax and the positional encodings: MUFU exp2 / log2 / rcp, warp reductions, an accurate
// tanh built on exp2 (for the logits soft cap) and accurately range-reduced RoPE angles.
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace fmath {

// 2^x in one MUFU.EX2 (rel. error ~2^-22); exp2(-inf) = +0, which is how masked logits vanish.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1 / (1 + 2^t) in one MUFU (the ex2): the reciprocal by Newton's method on the FMA pipe, from the integer first guess
// 0x7EF311C3 - bits(d) (within 5.1 %): one second-order step (r (1 + e), e = 1 - d r: 2.6e-3), then one third-order
// step (r (1 + e + e^2): ~2e-8 before rounding); five FFMAs for ~8e-8 relative, as rcp.approx's (three second-order
// steps took six; the third-order step first, the same count, spilled the soft-capped 128 x 64 prefill tile). d is
// clamped to 2^26, where the result (1.5e-8) is as good as 0 for tanh: 2^(+big) = inf -> 2^-26, 2^(-big) = 0 -> 1.
// (A NaN t gives 2^-26.)
__device__ __forceinline__ float rcp_one_plus_ex2(float t) {
  const float d = fminf(1.f + ex2(t), 67108864.f);
  float r = __int_as_float(0x7EF311C3 - __float_as_int(d));
  r = fmaf(r, fmaf(-d, r, 1.f), r);
  const float e = fmaf(-d, r, 1.f);
  return fmaf(r, fmaf(e, e, e), r);
}

// tanh(x) = 1 - 2 / (1 + 2^(2x·log2 e)), accurate to ~2e-7 absolute, with one MUFU op (rcp_one_plus_ex2).
// tanh.approx.f32 (tanh_approx: one MUFU too) has a relative error of ~2^-11, which a soft cap of 30 turns into logit
// errors of ~0.015 (1.5 % on the probabilities).
__device__ __forceinline__ float tanh(float x) { return fmaf(-2.f, rcp_one_plus_ex2(2.f * kLog2e * x), 1.f); }

// The logits soft cap cap · tanh(x / cap) as cap - 2 cap / (1 + 2^(x · 2 log2 e / cap)): one multiply, one MUFU op
// and the Newton steps per logit; ~7e-6 absolute at cap 30. neg_two_cap = -2 cap and ex2_scale = 2 log2(e) / cap are
// given precomputed (best as a variant's parameters: read from the constant bank by the FMUL / FFMA that use them,
// they hold no registers; computed here, the two constants took two registers across the FA2-class prefill's KV loop,
// which spilled its 128 x 64 tile). The built-in soft caps are written with logits_scale instead (builtins/soft_cap.py).
__device__ __forceinline__ float soft_cap(float x, float cap, float neg_two_cap, float ex2_scale) {
  return fmaf(neg_two_cap, rcp_one_plus_ex2(x * ex2_scale), cap);
}

// The logistic function 1 / (1 + e^-x) from MUFU ex2 and rcp (relative error ~2^-21), for sigmoid attention;
// saturates cleanly (e^+big = inf -> 0, e^-big = 0 -> 1).
__device__ __forceinline__ float sigmoid(float x) { return rcp(1.f + ex2(-kLog2e * x)); }

// tanh in one MUFU.TANH (relative error ~2^-11).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Butterfly reductions over aligned groups of W lanes (W a power of two <= 32); every lane gets the result.
template <int W> __device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int off = W / 2; off >= 1; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

template <int W> __device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int off = W / 2; off >= 1; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// ALiBi slope of query head h among n heads, as the ALiBi paper and FlashInfer define it: with m the largest power
// of two <= n, 2^(-8(h+1)/m) for h < m, then the odd slopes of the 2m sequence, 2^(-4(2(h-m)+1)/m).
// The exponents are exact: m is a power of two, so dividing by it is multiplying by 2^-log2(m), built from its bits.
__device__ __forceinline__ float alibi_slope(int h, int n) {
  const int log2m = 31 - __clz(n), m = 1 << log2m;
  const float inv_m = __int_as_float((127 - log2m) << 23);
  return h < m ? ::exp2f(-8.f * float(h + 1) * inv_m) : ::exp2f(-4.f * float(2 * (h - m) + 1) * inv_m);
}

// RoPE frequency of dimension pair i (of head_dim/2), split into hi + lo floats: pos · freq must be accurate to far
// better than fp32 for positions in the 10^4..10^5 range (an fp32 freq alone is off by pos · 2^-24 · freq, ~2e-3
// rad at position 33000), so it is computed in double once per thread and carried as two floats.
struct RopeFreq {
  float hi, lo;
};

__device__ __forceinline__ RopeFreq rope_freq(int i, int head_dim, double log2_theta, double rcp_scale) {
  const double f = ::exp2(-2.0 * double(i) / double(head_dim) * log2_theta) * rcp_scale;
  RopeFreq r;
  r.hi = float(f);
  r.lo = float(f - double(r.hi));
  return r;
}

// sin and cos of pos · freq. The product is formed exactly as hi + lo parts (two-product with an FMA), reduced by
// 2π in two constants (Cody–Waite), and only the reduced angle in [-π, π] goes to the MUFU sin/cos.
__device__ __forceinline__ void rope_sincos(int pos, RopeFreq f, float& s, float& c) {
  const float x = float(pos);  // exact below 2^24
  const float a = x * f.hi;
  const float e = fmaf(x, f.hi, -a) + x * f.lo;
  const float k = rintf(a * 0.15915494309189535f);
  float r = fmaf(-k, 6.28318548202514648f, a);
  r = fmaf(-k, -1.7484556000744487e-07f, r);
  __sincosf(r + e, &s, &c);
}

}  // namespace fmath

// n / d for 0 <= n < 2^31 with a host-computed multiplier (round-up method; jit fast_div_magic gives mul, shift):
// q = (umulhi(n, mul) + n) >> shift.
__device__ __forceinline__ u32 fast_div(u32 n, u32 mul, u32 shift) { return (__umulhi(n, mul) + n) >> shift; }

}  // namespace cuinfer
