// Permuted ("swizzled") shared-memory layout for tiles of 16-bit elements read by ldmatrix and written by 16-byte
// cp.async, free of bank conflicts on both sides.
//
// A tile row holds CHUNKS 16-byte chunks (8 elements each; CHUNKS = head_dim / 8 for fp16/bf16, a multiple of 8).
// Chunk c of row r is stored at chunk slot  r * CHUNKS + (c ^ (r % 8)).  The XOR only touches the low three bits, so
// a chunk stays inside its aligned group of 8 (one 128-byte line).
//   * ldmatrix: the 8 lanes of one phase read the same logical chunk of 8 consecutive rows -> 8 distinct slots mod 8
//     -> 8 distinct 16-byte bank groups (the row pitch is a multiple of 128 bytes): one wavefront.
//   * cp.async: 8 consecutive threads write chunks 8k..8k+7 of one row -> a permutation of one 128-byte line.
//
// Address arithmetic for fully unrolled ldmatrix loops: a lane that reads logical chunk 2*s + c (c = 0 or 1: which
// 8-column half of a 16-wide k-step it addresses) of row r finds it at slot  8 * (s / 4) + ((2 * (s % 4)) ^ (c ^ r % 8))
// of the row, because 2*s and c have disjoint bits and the XOR leaves bits >= 3 alone. With tiles 128-byte aligned and
// rows a multiple of 128 bytes, the low 7 bits of the lane's byte address for s = 0 are exactly (c ^ r % 8) * 16, so
//   address(s) = (address(0) ^ (32 * (s % 4))) + 128 * (s / 4)
// One register per lane and operand, and at most one LOP3 per k-step (shared by every ldmatrix of that k-step: other
// row blocks are immediate offsets). See LdmatrixAddr.
//
// Rows of 4 chunks (64 bytes: fp8 K/V rows of head dim 64, common/fp8.cuh) pair up in a 128-byte line: chunk c of row
// r is at slot r * 4 + (c ^ ((r / 2) % 4)). Eight consecutive rows at one logical chunk still land in 8 distinct
// 16-byte bank groups (rows r, r+1 share the XOR and sit in the two halves of a line), 8 consecutive threads copying
// rows r, r+1 (r even) write a permutation of one line, and both address rules above hold unchanged (the XOR only
// touches chunk bits, a row shift by a multiple of 8 keeps it).
#pragma once
#include "common/types.cuh"

namespace cuinfer {

template <int CHUNKS> struct Swizzle {
  static_assert(CHUNKS % 8 == 0 || CHUNKS == 4,
                "swizzled rows hold 4 or a multiple of 8 chunks of 16 bytes (head_dim % 64 == 0)");
  static constexpr int kRowBytes = CHUNKS * 16;

  // The XOR of row `r`'s chunk indices.
  static __device__ __forceinline__ u32 xor_of(u32 r) { return CHUNKS >= 8 ? r % 8 : (r / 2) % 4; }
  // Slot (in 16-byte units) of chunk `c` of row `r`.
  static __device__ __forceinline__ u32 slot(u32 r, u32 c) { return r * CHUNKS + (c ^ xor_of(r)); }
  // Byte offset of chunk `c` of row `r`.
  static __device__ __forceinline__ u32 byte_offset(u32 r, u32 c) { return slot(r, c) * 16; }
};

// Lane addresses for unrolled ldmatrix loops over 16-column k-steps (see the header comment).
template <int CHUNKS> struct LdmatrixAddr {
  // Address for k-step 0 of the lane that addresses row `row`, 8-column half `c` (0 or 1), of the tile at shared
  // address `tile` (128-byte aligned).
  static __device__ __forceinline__ u32 make(u32 tile, u32 row, u32 c) {
    return tile + row * (CHUNKS * 16) + ((c ^ Swizzle<CHUNKS>::xor_of(row)) * 16);
  }
  // Address for k-step `s`, `row_shift` rows further (a multiple of 8, keeping the permutation). Call it from fully
  // unrolled loops so that `s` and `row_shift` fold to constants.
  static __device__ __forceinline__ u32 at(u32 a, int s, int row_shift = 0) {
    return (a ^ static_cast<u32>((s % 4) * 32)) + (s / 4) * 128 + row_shift * (CHUNKS * 16);
  }
};

// Lane addresses for loops over single chunks (fp8 tiles: one chunk is one 16-element k-step): from the address of
// chunk 0 of the lane's row, chunk `c`, `row_shift` rows further (a multiple of 8). Call it from unrolled loops.
template <int CHUNKS> struct ChunkAddr {
  static __device__ __forceinline__ u32 at(u32 a0, int c, int row_shift = 0) {
    return (a0 ^ static_cast<u32>((c % 8) * 16)) + (c / 8) * 128 + row_shift * (CHUNKS * 16);
  }
};

}  // namespace cuinfer
