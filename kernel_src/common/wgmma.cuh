// Warpgroup MMA (wgmma, sm_90a): the Hopper tensor-core instruction of the sm90 prefill mainloop.
//
// One wgmma.mma_async is issued by the 4 warps of a warpgroup together and computes D(64 x N) += A(64 x 16) B(16 x N)
// asynchronously: A comes from shared memory (a matrix descriptor) or from registers (the C-fragment layout of an
// earlier wgmma, packed to 16 bits: how P enters P·V), B always from shared memory. The issuing warpgroup fences its
// register operands first (wgmma_fence), closes the MMAs it issued into a group (wgmma_commit) and waits until at most
// N groups are in flight (wgmma_wait<N>) before it reads or writes the accumulators again.
//
// Accumulator layout (m64nN, f32): warp w of the warpgroup holds rows 16w .. 16w+15; lane (g = lane / 4, t = lane % 4)
// holds, for each 8-column block j, d[4j + 0, 1] = (row g, cols 8j + 2t, +1) and d[4j + 2, 3] = (row g + 8, same
// cols): mma.sync's m16n8 C layout repeated over N / 8. A in registers uses mma.sync's m16n8k16 A layout (rows g,
// g + 8; cols 2t, 2t + 1 and 2t + 8, 2t + 9), so a C fragment converts to an A fragment without moving data.
//
// Shared-memory operands use the 128-byte swizzle (layout type 1): a tile is stored as blocks of 64 16-bit columns
// (128-byte rows); within each 1024-byte atom of 8 rows, the 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the
// XOR of address bits 4-6 with bits 7-9; atoms 1024-byte aligned). Sm90Tile below gives the offsets.
//   * K-major (A = Q rows x head dims, B = K keys x head dims): the descriptor covers 64 (A) or N (B) rows of one
//     16-column k-step: start = block base + row0 * 128 + (k-step % 4) * 32 bytes, stride byte offset (8-row groups)
//     1024, leading byte offset unused (1).
//   * MN-major (B = V for P·V: keys x head dims with the head dims contiguous, imm-trans-b = 1): start = block base +
//     k-step * 16 rows * 128 bytes, stride byte offset 1024 (8-key groups), leading byte offset = the distance between
//     two 64-column blocks (N = 128 spans two).
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace sm90 {

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address, leading and stride byte
// offsets (all in 16-byte units, 14 bits each), base offset 0 (atoms 1024-byte aligned), layout type 1 (128-byte
// swizzle) in bits 62-63.
__device__ __forceinline__ u64 smem_desc_sw128(u32 smem_addr, u32 leading_bytes, u32 stride_bytes) {
  return static_cast<u64>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<u64>((leading_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<u64>((stride_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// Byte offsets in a tile of ROWS rows of 16-bit elements stored for the 128-byte swizzle: column blocks of 64
// elements, each ROWS x 128 bytes.
template <int ROWS> struct Sw128Tile {
  static constexpr u32 kBlockBytes = ROWS * 128;
  // Chunk c (8 elements, 16 bytes) of row r.
  static __device__ __forceinline__ u32 chunk_offset(u32 r, u32 c) {
    return (c / 8) * kBlockBytes + r * 128 + (((c % 8) ^ (r % 8)) * 16);
  }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads / writes across a wgmma_wait (the registers are in flight).
__device__ __forceinline__ void fence_regs(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for 16-bit A fragments in registers (P for P·V): pins their definitions before the wgmma_fence that
// starts the MMAs reading them (ptxas serialises every wgmma of a kernel where a non-wgmma instruction defines a
// wgmma input between the fence and the wait).
template <int N> __device__ __forceinline__ void fence_regs(u32 (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
  }
}

// The 64 f32 accumulators of an m64n128 wgmma as asm operands %0..%63 (string) and as "+f" operands (list).
#define CUINFER_WGMMA_D128_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CUINFER_WGMMA_D128_OUTS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// D(64 x 128, f32) (+)= A(64 x 16) B(16 x 128), A from a descriptor (K-major; `accumulate` = 0 overwrites D) or
// from registers, B from a descriptor (TRANS_B: MN-major). TY is the PTX type of A and B ("bf16" / "f16").
#define CUINFER_WGMMA_SS(TY, TRANS_B)                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                         \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" CUINFER_WGMMA_D128_REGS                  \
               "}, %64, %65, p, 1, 1, 0, " #TRANS_B ";\n}\n"                                                         \
               : CUINFER_WGMMA_D128_OUTS                                                                           \
               : "l"(a), "l"(b), "r"(accumulate)                                                                   \
               : "memory")
#define CUINFER_WGMMA_RS(TY, TRANS_B)                                                                               \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" CUINFER_WGMMA_D128_REGS                  \
               "}, {%64, %65, %66, %67}, %68, 1, 1, 1, " #TRANS_B ";\n"                                             \
               : CUINFER_WGMMA_D128_OUTS                                                                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)                                                \
               : "memory")

template <typename T> struct WgmmaIsBf16;  // (the 16-bit types wgmma takes: bf16 and f16)
template <> struct WgmmaIsBf16<__nv_bfloat16> {
  static constexpr bool value = true;
};
template <> struct WgmmaIsBf16<half> {
  static constexpr bool value = false;
};

template <typename T, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], u64 a, u64 b, int accumulate) {
  static_assert(TRANS_B == 0 || TRANS_B == 1, "TRANS_B: 0 (K-major B) or 1 (MN-major B)");
  if constexpr (WgmmaIsBf16<T>::value) {
    if constexpr (TRANS_B) CUINFER_WGMMA_SS("bf16", 1); else CUINFER_WGMMA_SS("bf16", 0);
  } else {
    if constexpr (TRANS_B) CUINFER_WGMMA_SS("f16", 1); else CUINFER_WGMMA_SS("f16", 0);
  }
}

template <typename T, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const u32 (&a)[4], u64 b) {
  static_assert(TRANS_B == 0 || TRANS_B == 1, "TRANS_B: 0 (K-major B) or 1 (MN-major B)");
  if constexpr (WgmmaIsBf16<T>::value) {
    if constexpr (TRANS_B) CUINFER_WGMMA_RS("bf16", 1); else CUINFER_WGMMA_RS("bf16", 0);
  } else {
    if constexpr (TRANS_B) CUINFER_WGMMA_RS("f16", 1); else CUINFER_WGMMA_RS("f16", 0);
  }
}

#undef CUINFER_WGMMA_SS
#undef CUINFER_WGMMA_RS
#undef CUINFER_WGMMA_D128_REGS
#undef CUINFER_WGMMA_D128_OUTS

}  // namespace sm90
}  // namespace cuinfer
