// fp8 KV elements (float8_e4m3fn, float8_e5m2) turned into the 16-bit operands of the math, in registers.
//
// A KV cache of fp8 is read as it is stored (16 elements per 16-byte copy) and converted only where the math needs
// it, two elements at a time: `pair<T, F8, I, J>(x)` takes bytes I and J of a 32-bit register and returns them as two
// 16-bit values of T in one register (byte I in the low half), ready for mma.sync or for f16x2 -> f32.
//
// Exactness. Every finite e4m3fn value (|x| <= 448, subnormals down to 2^-9) and every finite e5m2 value (|x| <=
// 57344, subnormals down to 2^-16) is exactly representable in float16 and in bfloat16, so each path below is exact
// on finite values; only the non-finite codes differ between paths (see the bit paths).
//   * half, sm_89+: `cvt.rn.f16x2.{e4m3x2,e5m2x2}` (one F2FP per pair): exact, NaN stays NaN, e5m2 inf stays inf.
//   * half, sm_80 (no fp8 cvt there): e5m2 is the upper byte of a float16, so the pair is a byte permute alone; e4m3
//     takes the bit path: its 7 magnitude bits placed in a float16's exponent and mantissa fields (a float16 of the
//     value times 2^-8, subnormals included) and one multiply by 2^8 (exact: a power of two, no overflow).
//     The e4m3fn NaN code (s.1111.111) comes out as +-480.
//   * bfloat16: there is no fp8 -> bf16x2 cvt on sm_80-sm_90, and going through float16 and float (cvt, 2 x HADD2.F32,
//     F2FP.BF16.PACK_AB) costs four conversion instructions per pair on the conversion pipe; the bit path costs a
//     byte permute, two logic ops, a shift and one HFMA2.BF16 by 2^120 (e4m3) / 2^112 (e5m2), none of them
//     conversions. The magnitude bits go to the low bits of bfloat16's 8-bit exponent (the value times 2^-120 or
//     2^-112; e4m3 subnormals become bfloat16 subnormals, which HFMA2.BF16 multiplies exactly). Non-finite codes come
//     out finite: e4m3fn NaN -> +-480, e5m2 inf -> +-65536, e5m2 NaN -> +-65536 x (1.25, 1.5, 1.75).
// Caches written by saturating quantisation (every common recipe) hold no non-finite code. The constants are named
// below; tests/cpu/test_fp8_conversion.py reads them from this file and emulates each path bit by bit against
// ml_dtypes for all 256 codes of both formats, and tests/gpu/test_fp8_gpu.py runs the paths themselves
// (debug/fp8_probe.cu).
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace fp8 {

template <typename T> struct IsFp8 {
  static constexpr bool value = false;
};
template <> struct IsFp8<__nv_fp8_e4m3> {
  static constexpr bool value = true;
};
template <> struct IsFp8<__nv_fp8_e5m2> {
  static constexpr bool value = true;
};

// The bit paths: the byte, placed in the upper half of a 16-bit lane (sign at bit 15, magnitude at bits 8-14), has
// its magnitude shifted right by kShift* into the 16-bit format's exponent / mantissa fields and is then multiplied
// by kScale* (the 16-bit pattern of the power of two that undoes the bias difference).
constexpr u32 kSignMask = 0x80008000u;
constexpr u32 kMagMask = 0x7f007f00u;
constexpr int kShiftE4m3Half = 1;     // 5-bit exponent, bias 15: e4m3 (bias 7) x 2^-8
constexpr u32 kScaleE4m3Half = 0x5C00u;  // 2^8 in float16
constexpr int kShiftE4m3Bf16 = 4;     // 8-bit exponent, bias 127: e4m3 x 2^-120
constexpr u32 kScaleE4m3Bf16 = 0x7B80u;  // 2^120 in bfloat16
constexpr int kShiftE5m2Bf16 = 3;     // e5m2 (bias 15) x 2^-112
constexpr u32 kScaleE5m2Bf16 = 0x7780u;  // 2^112 in bfloat16
constexpr u32 kNegZero2 = 0x80008000u;   // -0 in both halves (the addend of the multiplies: x * s + (-0) == x * s)

template <typename F8> struct Bits;
template <> struct Bits<__nv_fp8_e4m3> {
  static constexpr int kHalfShift = kShiftE4m3Half, kBf16Shift = kShiftE4m3Bf16;
  static constexpr u32 kHalfScale = kScaleE4m3Half, kBf16Scale = kScaleE4m3Bf16;
};
template <> struct Bits<__nv_fp8_e5m2> {
  static constexpr int kHalfShift = 0, kBf16Shift = kShiftE5m2Bf16;  // (e5m2 is a float16's upper byte: no scale)
  static constexpr u32 kHalfScale = 0x3C00u, kBf16Scale = kScaleE5m2Bf16;
};

// fp8 scale arrays (the parameter structs' k_scales / v_scales: float32, value h * stride for KV head h; null when
// the scales were numbers, folded into sm_scale and v_scale): the factor of KV head h, 1 without an array.
__device__ __forceinline__ float head_scale(const void* a, int stride, int h) {
  return a == nullptr ? 1.f : __ldg(static_cast<const float*>(a) + h * stride);
}

// x * s + (-0) in both 16-bit halves.
__device__ __forceinline__ u32 hmul2_half(u32 x, u32 s) {
  u32 r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(x), "r"(s), "r"(kNegZero2));
  return r;
}
__device__ __forceinline__ u32 hmul2_bf16(u32 x, u32 s) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(x), "r"(s), "r"(kNegZero2));
  return r;
}

// Bytes I, J of x as two 16-bit values of T (I in the low half). F8: __nv_fp8_e4m3 or __nv_fp8_e5m2.
template <typename T, typename F8, int I, int J> __device__ __forceinline__ u32 pair(u32 x) {
  static_assert(IsFp8<F8>::value, "F8 is __nv_fp8_e4m3 or __nv_fp8_e5m2");
  static_assert(0 <= I && I < 4 && 0 <= J && J < 4 && I != J, "bytes of one 32-bit register");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (is_same<T, half>::value) {
    const unsigned short two = static_cast<unsigned short>(__byte_perm(x, 0u, I | (J << 4)));
    u32 r;
    if constexpr (is_same<F8, __nv_fp8_e4m3>::value) {
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(two));
    } else {
      asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(r) : "h"(two));
    }
    return r;
  }
#endif
  static_assert(is_same<T, half>::value || is_same<T, __nv_bfloat16>::value, "T is half or __nv_bfloat16");
  // [0, byte I, 0, byte J]: each byte in the upper half of its 16-bit lane
  const u32 y = __byte_perm(x, 0u, 4 | (I << 4) | (4 << 8) | (J << 12));
  if constexpr (is_same<T, half>::value) {
    if constexpr (Bits<F8>::kHalfShift == 0) return y;
    return hmul2_half((y & kSignMask) | ((y & kMagMask) >> Bits<F8>::kHalfShift),
                      Bits<F8>::kHalfScale * 0x10001u);
  } else {
    return hmul2_bf16((y & kSignMask) | ((y & kMagMask) >> Bits<F8>::kBf16Shift), Bits<F8>::kBf16Scale * 0x10001u);
  }
}

// The four bytes of x as two registers of two 16-bit values of T: bytes (0, 1) in `lo`, (2, 3) in `hi` (byte 0 / 2 in
// the low half): pair<T, F8, 0, 1> and pair<T, F8, 2, 3>. float16 on sm_89+: the cvt reads the two 16-bit halves of x
// in place (no byte permute).
template <typename T, typename F8> __device__ __forceinline__ void quad(u32 x, u32& lo, u32& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (is_same<T, half>::value) {
    if constexpr (is_same<F8, __nv_fp8_e4m3>::value) {
      asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
          : "=r"(lo), "=r"(hi) : "r"(x));
    } else {
      asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e5m2x2 %0, l;\ncvt.rn.f16x2.e5m2x2 %1, h;\n}\n"
          : "=r"(lo), "=r"(hi) : "r"(x));
    }
    return;
  }
#endif
  lo = pair<T, F8, 0, 1>(x);
  hi = pair<T, F8, 2, 3>(x);
}

// 8 fp8 elements (8 bytes, element 0 in the lowest byte) as 8 floats, through float16 (exact).
template <typename F8> __device__ __forceinline__ void to_float8(uint2 raw, float (&out)[8]) {
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const u32 x = w == 0 ? raw.x : raw.y;
    const u32 lo = pair<half, F8, 0, 1>(x), hi = pair<half, F8, 2, 3>(x);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    out[4 * w + 0] = a.x, out[4 * w + 1] = a.y, out[4 * w + 2] = b.x, out[4 * w + 3] = b.y;
  }
}

// ---- mma fragments from fp8 tiles in shared memory ----------------------------------------------------------------
//
// fp8 rows are 16 elements per 16-byte chunk, so ldmatrix (which moves 8 x 16-byte rows per matrix, 4 bytes per lane)
// hands lane (g = lane / 4, t = lane % 4) four consecutive elements of row g: elements 4t .. 4t+3 of the chunk.
//
//   K (B of Q·K^T, k = head dim): ldmatrix (no .trans) of 8 keys x one chunk gives key g, dims 4t .. 4t+3; the pairs
//   (4t, 4t+1) and (4t+2, 4t+3) are b0 and b1 of one n8 tile, i.e. the k-step's mma index 2t+e holds dim 4t+e and
//   index 2t+8+e holds dim 4t+2+e. The A fragment of Q must follow the same order: q_frag_fp8k() reads a0 = q[4t,
//   4t+1], a2 = q[4t+2, 4t+3] (and a1, a3 of row g+8) with one 8-byte load each: a permutation of the head dims,
//   summed over in q·k, so nothing else changes.
//   V (B of P·V, k = tokens): ldmatrix.trans of 8 tokens x one chunk gives lane (g, t) the 16-bit column g of rows 2t
//   and 2t+1: bytes [v(2t, 2g), v(2t, 2g+1), v(2t+1, 2g), v(2t+1, 2g+1)]. Bytes (0, 2) are dim 2g at tokens 2t, 2t+1
//   (the b0 of an n8 tile whose column g is dim 2g: the "even" tile of the chunk) and bytes (1, 3) dim 2g+1 (the
//   "odd" tile). The P fragment is the usual one; the output accumulators of the even / odd tiles of chunk c hold, for
//   thread t, dims 16c + 4t + {0, 2} / 16c + 4t + {1, 3}: pv_acc_to_natural() moves them to the usual C layout
//   (dims 16c + 2t + {0, 1} in tile 2c, 16c + 8 + 2t + {0, 1} in tile 2c+1) with four shuffles per 4 values, once per
//   item.

// K: the two B registers of one n8 tile from one ldmatrix register.
template <typename T, typename F8> __device__ __forceinline__ void k_frag(u32 x, u32 (&b)[2]) {
  b[0] = pair<T, F8, 0, 1>(x);
  b[1] = pair<T, F8, 2, 3>(x);
}

// V: b0 (or b1) of the even and the odd n8 tile of a chunk from one ldmatrix.trans register.
template <typename T, typename F8> __device__ __forceinline__ void v_frag(u32 x, u32& even, u32& odd) {
  even = pair<T, F8, 0, 2>(x);
  odd = pair<T, F8, 1, 3>(x);
}

// The A fragment of one m16 x k16 block of a 16-bit tile in the order k_frag() gives K: `row0` / `row8` are this
// lane's byte addresses (shared window) of elements 4t .. 4t+3 of the k-step in rows g and g+8.
__device__ __forceinline__ void q_frag_fp8k(u32 (&a)[4], u32 row0, u32 row8) {
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(a[0]), "=r"(a[2]) : "r"(row0));
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(a[1]), "=r"(a[3]) : "r"(row8));
}

// The accumulators of the even / odd n8 tiles of one chunk (acc_e = tile 2c, acc_o = tile 2c+1, the 4 floats of each
// as mma leaves them) to the usual C layout of tiles 2c, 2c+1. Per row (e = 0, 1 and 2, 3), dim d = 8 d3 + 4 d2 +
// 2 d1 + d0 of the chunk sits in thread (d3 d2), slot (d1 d0) (v[] below) and must go
// to thread (d2 d1), slot (d3 d0). In bits of (thread; slot) that moves d3 from thread bit 1 to slot bit 1, d2 from
// thread bit 0 to thread bit 1 and d1 from slot bit 1 to thread bit 0: two in-place exchanges, thread bit 0 with slot
// bit 1 (lanes t, t ^ 1), then thread bit 1 with slot bit 1 (lanes t, t ^ 2), each swapping the two values whose slot
// bit differs from the thread bit: 4 shuffles per 4 values. Every lane of the warp must call it.
__device__ __forceinline__ void pv_acc_to_natural(float (&acc_e)[4], float (&acc_o)[4], int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // row g (e = 0, 1) and row g + 8 (e = 2, 3)
    // v[s] = slot s = (s1 s0): dim 4t + s of this row
    float v[4] = {acc_e[2 * h], acc_o[2 * h], acc_e[2 * h + 1], acc_o[2 * h + 1]};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int bit = r == 0 ? (t & 1) : (t >> 1) & 1;  // the thread bit exchanged with slot bit 1
      const int mask = r == 0 ? 1 : 2;
      // send the slots whose bit 1 differs from `bit`, receive the partner's (whose bit is the other value)
      const float x0 = bit ? v[0] : v[2], x1 = bit ? v[1] : v[3];
      float y0, y1;  // (volatile: kept in program order, so few exchanges are in flight beside the accumulators)
      asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;\n" : "=f"(y0) : "f"(x0), "r"(mask));
      asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;\n" : "=f"(y1) : "f"(x1), "r"(mask));
      if (bit) {
        v[0] = y0, v[1] = y1;
      } else {
        v[2] = y0, v[3] = y1;
      }
    }
    // now slot (d3 d0): dims 2t + {0, 1} in slots 0, 1 and 8 + 2t + {0, 1} in slots 2, 3
    acc_e[2 * h] = v[0], acc_e[2 * h + 1] = v[1];
    acc_o[2 * h] = v[2], acc_o[2 * h + 1] = v[3];
  }
}

// ---- decode tensor cores: float16 fragments scaled by a power of two, no multiply -----------------------------------
//
// The decode kernel runs its fp8 products in float16 whatever q's type (q converted once per item, P·V's P in
// float16), so an fp8 byte needs no multiply: its 7 magnitude bits shifted right by one into a float16's exponent and
// mantissa fields are the e4m3 value times 2^-8 (subnormals included, exact; NaN -> 1.875), and an e5m2 byte is the
// upper byte of a float16 (exact, inf and NaN kept). F16s<F8>::kPow is that 8 (e4m3) or 0 (e5m2); the kernel folds
// 2^kPow into the logits' scale (K) and the output's (V). One register of 4 bytes gives two fragments: bytes (0, 2) and
// (1, 3), which are exactly the V pairs of ldmatrix.trans (even / odd tile, see v_frag) and, for K, the head dims
// (4t, 4t+2) and (4t+1, 4t+3) (q_frag_f16s builds Q in that order). e4m3: per pair of bytes one byte permute that
// also replicates each byte's sign into the byte above it ([b, sign(b) x 8] per 16-bit lane), a shift left by 7 (the
// magnitude to bits 7-13, the replicated sign's lowest bit to bit 15) and one mask (kF16sMask: drops the byte's own
// sign, now at bit 14, and what the shift carried over from the lane below): 6 integer ops per 4 bytes. e5m2: a
// byte permute and a mask. No multiply.
template <typename F8> struct F16s {  // (e5m2; 0 for 16-bit K/V too)
  static constexpr int kPow = 0;
};
template <> struct F16s<__nv_fp8_e4m3> {
  static constexpr int kPow = 8;
};
constexpr int kShiftE4m3F16s = 7;       // [b, sign(b) x 8] << 7: magnitude to bits 7-13, sign to 15
constexpr u32 kF16sMask = 0xBF80BF80u;  // bits 7-13 and 15 of each 16-bit lane
constexpr u32 kF16sSel02 = 0xA280u;     // prmt: [byte 0, sign(byte 0), byte 2, sign(byte 2)]
constexpr u32 kF16sSel13 = 0xB391u;     // prmt: [byte 1, sign(byte 1), byte 3, sign(byte 3)]

// e4m3's bit path on the byte pairs two prmt selectors pick (kF16sSel02 / kF16sSel13, kF16sSel01 / kF16sSel23): each
// pair as float16 values times 2^-8.
template <u32 kSelLo, u32 kSelHi> __device__ __forceinline__ void e4m3_f16s_bits(u32 x, u32& lo, u32& hi) {
  u32 a, b;  // (prmt's selector nibbles with bit 3 set replicate the selected byte's sign)
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(a) : "r"(x), "n"(kSelLo));
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(b) : "r"(x), "n"(kSelHi));
  lo = (a << kShiftE4m3F16s) & kF16sMask;
  hi = (b << kShiftE4m3F16s) & kF16sMask;
}

// Bytes 0, 2 (p02, byte 0 in the low half) and 1, 3 (p13) of x as float16 values times 2^-F16s<F8>::kPow.
template <typename F8> __device__ __forceinline__ void f16s_pairs(u32 x, u32& p02, u32& p13) {
  static_assert(IsFp8<F8>::value, "F8 is __nv_fp8_e4m3 or __nv_fp8_e5m2");
  if constexpr (is_same<F8, __nv_fp8_e5m2>::value) {
    p02 = __byte_perm(x, 0u, 0x2404);  // [0, byte 0, 0, byte 2]
    p13 = x & 0xff00ff00u;
  } else {
    e4m3_f16s_bits<kF16sSel02, kF16sSel13>(x, p02, p13);
  }
}

// K of the decode tensor-core kernel: bytes (0, 1) and (2, 3) of an ldmatrix register (key g, head dims (4t, 4t+1)
// and (4t+2, 4t+3): b0 and b1 of one n8 tile, as k_frag) as float16 values times 2^-F16sK<F8>::kPow. e4m3 on sm_89+:
// one cvt.rn.f16x2.e4m3x2 per pair on the register's 16-bit halves in place (F2FP, exact, no byte permute: kPow 0),
// where the bit path takes three integer ops per pair; the V fragments keep f16s_pairs' integer path, so the
// conversions of a tile are split between the conversion and the integer pipes. e4m3 on sm_80: f16s_pairs' bit path
// on the pairs (0, 1), (2, 3) (kF16sSel01 / kF16sSel23; kPow 8). e5m2: one byte permute per pair, [0, b, 0, b']
// (kPow 0).
template <typename F8> struct F16sK {  // (e5m2)
  static constexpr int kPow = 0;
};
template <> struct F16sK<__nv_fp8_e4m3> {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  static constexpr int kPow = 0;
#else
  static constexpr int kPow = F16s<__nv_fp8_e4m3>::kPow;
#endif
};
constexpr u32 kF16sSel01 = 0x9180u;  // prmt: [byte 0, sign(byte 0), byte 1, sign(byte 1)]
constexpr u32 kF16sSel23 = 0xB3A2u;  // prmt: [byte 2, sign(byte 2), byte 3, sign(byte 3)]

template <typename F8> __device__ __forceinline__ void k_pairs(u32 x, u32& p01, u32& p23) {
  static_assert(IsFp8<F8>::value, "F8 is __nv_fp8_e4m3 or __nv_fp8_e5m2");
  if constexpr (is_same<F8, __nv_fp8_e5m2>::value) {
    p01 = __byte_perm(x, 0u, 0x1404);  // [0, byte 0, 0, byte 1]
    p23 = __byte_perm(x, 0u, 0x3424);  // [0, byte 2, 0, byte 3]
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    quad<half, F8>(x, p01, p23);
#else
    e4m3_f16s_bits<kF16sSel01, kF16sSel23>(x, p01, p23);
#endif
  }
}

// V of the decode tensor-core kernel: bytes (0, 2) and (1, 3) of an ldmatrix.trans register (dim 2g, resp. 2g+1, at
// tokens 2t, 2t+1: the b0 / b1 of the even and odd n8 tiles, as v_frag) as float16 values times 2^-F16sV<F8>::kPow.
// e4m3 on sm_89+: one byte permute puts the pairs in the register's 16-bit halves ([b0, b2, b1, b3]), then one
// cvt.rn.f16x2.e4m3x2 per pair on the halves in place (exact, NaN kept; kPow 0): 3 instructions per register where
// f16s_pairs' integer path takes 6. Everywhere else f16s_pairs (e5m2: a byte permute and a mask; sm_80 e4m3: the bit
// path, kPow 8).
template <typename F8> struct F16sV {  // (e5m2)
  static constexpr int kPow = 0;
};
template <> struct F16sV<__nv_fp8_e4m3> {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  static constexpr int kPow = 0;
#else
  static constexpr int kPow = F16s<__nv_fp8_e4m3>::kPow;
#endif
};
constexpr u32 kVPairsSel = 0x3120u;  // prmt: [byte 0, byte 2, byte 1, byte 3]

template <typename F8> __device__ __forceinline__ void v_pairs(u32 x, u32& p02, u32& p13) {
  static_assert(IsFp8<F8>::value, "F8 is __nv_fp8_e4m3 or __nv_fp8_e5m2");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (is_same<F8, __nv_fp8_e4m3>::value) {
    quad<half, F8>(__byte_perm(x, 0u, kVPairsSel), p02, p13);
    return;
  }
#endif
  f16s_pairs<F8>(x, p02, p13);
}

// The Q fragment of one m16 x k16 block in the order k_pairs() gives K (b0 = dims 4t, 4t+1; b1 = 4t+2, 4t+3), from
// this lane's 4 q values of rows g (lo = [q 4t, q 4t+1], hi = [q 4t+2, q 4t+3], as floats) and g + 8, times `sc`
// (the row's power of two): a0 = (4t, 4t+1) of row g, a1 = of row g + 8, a2 = (4t+2, 4t+3) of row g, a3 = of g + 8.
__device__ __forceinline__ u32 pack_half2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ void q_frag_f16k(u32 (&a)[4], const float (&g0)[4], const float (&g8)[4], float sc0,
                                            float sc8) {
  a[0] = pack_half2(g0[0] * sc0, g0[1] * sc0);
  a[1] = pack_half2(g8[0] * sc8, g8[1] * sc8);
  a[2] = pack_half2(g0[2] * sc0, g0[3] * sc0);
  a[3] = pack_half2(g8[2] * sc8, g8[3] * sc8);
}

// The power of two that brings a row of q with max |q| = `amax` into [2^14, 2^15) in float16 (so every element within
// 2^28 of the row's largest converts exactly: bfloat16 values have 8 significant bits, float16 11), and its inverse
// (clamped to normal floats; an all-zero row takes 2^126).
constexpr int kQF16TopExp = 14;
// Prefill's float16 Q·K^T (attention/prefill_sm80 kernel.cuh convert_q, one scale per warp): the largest |q| is
// floored at 2^-kQF16AmaxFloorExp, so the inverse scale stays >= 2^-64 and the logits' scale it multiplies a normal
// float (an all-zero block would take 2^-126, which times the logits' scale could flush to 0 and turn masked -inf
// logits into NaN).
constexpr int kQF16AmaxFloorExp = 50;
__device__ __forceinline__ void q_f16_scale(float amax, float& sc, float& inv) {
  const int e = static_cast<int>((__float_as_uint(amax) >> 23) & 0xff);  // amax in [2^(e-127), 2^(e-126))
  const int se = min(253, max(1, 127 + kQF16TopExp - (e - 127)));
  sc = __uint_as_float(static_cast<u32>(se) << 23);
  inv = __uint_as_float(static_cast<u32>(254 - se) << 23);
}

// The pieces of a bfloat16 Q block's conversion to float16 (prefill_sm80 kernel.cuh convert_q, one scale per warp;
// prefill_sm90 consumer.cuh convert_q_rows, one per row): `m2` gathers the block's largest |q| over its registers
// (q_abs_max2), q_f16_pow2 turns it into 2^s in both bfloat16 halves (q_f16_scale with the floor; `inv` = 2^-s), and
// q_f16_times converts one register of two bfloat16 values to float16 times 2^s (exact: a power of two in bfloat16,
// and a bfloat16 is the upper half of a float).
__device__ __forceinline__ __nv_bfloat162 q_abs_max2(__nv_bfloat162 m2, u32 w) {
  return __hmax2(m2, __habs2(*reinterpret_cast<const __nv_bfloat162*>(&w)));
}
__device__ __forceinline__ u32 q_f16_pow2(__nv_bfloat162 m2, float& inv) {
  float sc;
  const float floor = __uint_as_float(static_cast<u32>(127 - kQF16AmaxFloorExp) << 23);  // 2^-kQF16AmaxFloorExp
  q_f16_scale(fmaxf(fmaxf(__low2float(m2), __high2float(m2)), floor), sc, inv);
  return (__float_as_uint(sc) >> 16) * 0x10001u;  // (a normal power of two: its bfloat16 is the float's upper half)
}
__device__ __forceinline__ u32 q_f16_times(u32 w, u32 sc2) {
  const u32 y = hmul2_bf16(w, sc2);
  return pack_half2(__uint_as_float(y << 16), __uint_as_float(y & 0xffff0000u));
}

}  // namespace fp8
}  // namespace cuinfer
