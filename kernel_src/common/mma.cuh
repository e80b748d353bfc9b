// Warp-level tensor-core primitives for sm_80+: mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate), ldmatrix, and
// the helpers that move data between accumulator and operand fragments. Every attention kernel that uses tensor cores
// (FA2-class prefill, tensor-core decode) builds on these, so the fragment layouts are written down once, here.
//
// Notation: lane = threadIdx.x % 32, g = lane / 4 ("group", 0..7), t = lane % 4 ("thread in group", 0..3).
// A 32-bit register holding two 16-bit values stores the lower column index in its low half.
//
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32:   D[16x8] = A[16x16] * B[16x8] + C[16x8]
//   A (row-major, 4 regs):  a0 = A[g   ][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]
//                           a2 = A[g   ][2t+8, +9]   a3 = A[g+8][2t+8, +9]
//   B (k x n, 2 regs):      b0 = B[2t, 2t+1][g]      b1 = B[2t+8, 2t+9][g]
//                           i.e. "col" layout: B stored as n-major rows of k (B^T row-major), like K[n][k] in Q·K^T.
//   C/D (fp32, 4 regs):     c0, c1 = C[g][2t, 2t+1]  c2, c3 = C[g+8][2t, 2t+1]
//
// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses (16 bytes
// each) of matrix i, and register ri of every lane receives matrix i's fragment: lane holds row g, columns 2t, 2t+1.
// With .trans the lane holds column g, rows 2t, 2t+1 instead (the matrix is transposed on the way).
//
// How the three operands of attention map onto that (used by prefill.cuh and the tensor-core decode):
//   * A from a row-major [rows][k] tile (Q): lane l addresses row (l % 16), 8-column block (l / 16): r0..r3 = a0..a3.
//   * B from an n-major [n][k] tile (K in Q·K^T), two n8 tiles at once: lane l addresses row (l % 8) + 8 * (l / 16),
//     column block (l / 8) % 2: r0, r1 = b0, b1 of n-tile 0 (rows 0-7); r2, r3 = b0, b1 of n-tile 1 (rows 8-15).
//   * B from a k-major [k][n] tile (V in P·V) with .trans, two n8 tiles at once: lane l addresses row (l % 16),
//     column block (l / 16): r0, r1 = b0, b1 of n-tile 0 (columns 0-7); r2, r3 = b0, b1 of n-tile 1 (columns 8-15).
//   * An fp32 accumulator of Q·K^T becomes the A operand of P·V without shuffles: for k-step s (keys 16s..16s+15)
//     a0 = pack(S[2s][0], S[2s][1]), a1 = pack(S[2s][2], S[2s][3]), a2 = pack(S[2s+1][0], S[2s+1][1]),
//     a3 = pack(S[2s+1][2], S[2s+1][3]) where S[j] is the accumulator of n8 tile j (see frag_c_to_a).
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace mma {

// 32-bit shared-memory address of a generic pointer into shared memory (what ldmatrix / cp.async take).
__device__ __forceinline__ u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// ---- ldmatrix -------------------------------------------------------------------------------------------------------

// Four 8x8 b16 matrices; `addr` is this lane's row address (see the lane-to-row rules above).
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Same, transposed on the way (B operand from a k-major tile, e.g. V in P·V).
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two 8x8 matrices: lanes 0-15 give the row addresses (lanes 16-31 are ignored but must be valid addresses).
__device__ __forceinline__ void ldmatrix_x2(u32 r[2], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2_trans(u32 r[2], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// The inverse of ldmatrix_x4 (sm_90+): four 8x8 b16 matrices from registers to the rows `addr` gives (same lane rules).
__device__ __forceinline__ void stmatrix_x4(u32 addr, const u32 r[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3]));
#else
  __trap();  // (callers check the arch: prefill's kStagedEpi)
#endif
}

// ---- mma.sync -------------------------------------------------------------------------------------------------------

// D = A * B + D for one m16n8k16 tile, T = half or __nv_bfloat16 (both operands), fp32 accumulators.
template <typename T> __device__ __forceinline__ void mma_m16n8k16(float d[4], const u32 a[4], const u32 b[2]);

template <> __device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float d[4], const u32 a[4], const u32 b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <> __device__ __forceinline__ void mma_m16n8k16<half>(float d[4], const u32 a[4], const u32 b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two n8 tiles sharing one A fragment; b holds {b0, b1} of tile 0 then {b0, b1} of tile 1 (an ldmatrix_x4 result).
template <typename T>
__device__ __forceinline__ void mma_m16n16k16(float d0[4], float d1[4], const u32 a[4], const u32 b[4]) {
  mma_m16n8k16<T>(d0, a, b);
  mma_m16n8k16<T>(d1, a, b + 2);
}

// ---- fragment conversions -----------------------------------------------------------------------------------------

// Two fp32 values -> one register of two 16-bit values, `lo` in the low half (round to nearest even).
template <typename T> __device__ __forceinline__ u32 pack2(float lo, float hi);

template <> __device__ __forceinline__ u32 pack2<__nv_bfloat16>(float lo, float hi) {
  u32 r;
  // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half and b in the lower half.
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <> __device__ __forceinline__ u32 pack2<half>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Accumulators of n8 tiles 2s and 2s+1 (keys 16s..16s+15 of an m16 row block) -> the A fragment of the k-step s of
// the next product (P·V): the C layout of m16n8 and the A layout of m16n8k16 line up lane by lane.
template <typename T> __device__ __forceinline__ void frag_c_to_a(u32 a[4], const float c0[4], const float c1[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

// ---- quad reductions ------------------------------------------------------------------------------------------------
// A row of an accumulator tile is spread over the 4 lanes of a group (t = 0..3); these reduce across them.

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace mma
}  // namespace cuinfer
