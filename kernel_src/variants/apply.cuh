// Applying a variant's q / k transforms (RoPE) to tiles in shared memory: rows of D 16-bit elements in the swizzled
// layout of common/swizzle.cuh (chunk c of row r at slot r * D/8 + (c ^ r % 8)), as both the decode and the prefill
// kernels keep their K tiles. A thread owns a fixed rotate-half chunk pair (c, c + D/16) of the rows it transforms,
// so the DimStates of its 8 dimension pairs are computed once per kernel (pair_states).
#pragma once
#include "common/swizzle.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"
#include "variants/contract.cuh"

namespace cuinfer {
namespace variant {

// The DimStates of dimension pairs 8c .. 8c+7 (c < D/16): each serves dims i and i + D/2.
template <class V, int D, class VP>
__device__ __forceinline__ void pair_states(const VP& v, int c, typename V::DimState (&s)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = V::dim_state(v, 8 * c + i, D);
}

// key_transform on rows [0, rows) of the K tile `tile` (row r is key key0 + r), kThreads threads from thread `tid`;
// the caller synchronises before and after. Thread tid owns chunk pair c = tid % (D/16), the one its `s` was made for.
template <class V, int D, int kThreads, class T, class VP>
__device__ __forceinline__ void key_transform_tile(const VP& v, const Index& ix, T* tile, int key0, int rows,
                                                   const typename V::DimState (&s)[8], int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kHalf = kChunks / 2;
  static_assert(kThreads % kHalf == 0, "threads cover whole half rows");
  const int c = tid % kHalf;
  for (int r = tid / kHalf; r < rows; r += kThreads / kHalf) {
    T* lo_p = tile + Swizzle<kChunks>::slot(r, c) * 8;
    T* hi_p = tile + Swizzle<kChunks>::slot(r, c + kHalf) * 8;
    Vec<T, 8> lo, hi;
    lo.load(lo_p);
    hi.load(hi_p);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float x = to_float(lo[i]), y = to_float(hi[i]);
      lo[i] = from_float<T>(V::key_transform(v, s[i], ix, key0 + r, 8 * c + i, x, y));
      hi[i] = from_float<T>(V::key_transform(v, s[i], ix, key0 + r, 8 * c + i + D / 2, y, x));
    }
    lo.store(lo_p);
    hi.store(hi_p);
  }
}

// value_transform on rows [0, rows) of the V tile `tile` (DV 16-bit elements per row, swizzled like K; row r is key
// key0 + r), kThreads threads from thread `tid`, one 16-byte chunk at a time; the caller synchronises before and after.
template <class V, int DV, int kThreads, class T, class VP>
__device__ __forceinline__ void value_transform_tile(const VP& v, const Index& ix, T* tile, int key0, int rows,
                                                     int tid) {
  constexpr int kChunks = DV / 8;
#pragma unroll 1
  for (int u = tid; u < rows * kChunks; u += kThreads) {
    const int r = u / kChunks, c = u % kChunks;
    T* p = tile + Swizzle<kChunks>::slot(r, c) * 8;
    Vec<T, 8> x;
    x.load(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = from_float<T>(V::value_transform(v, ix, key0 + r, 8 * c + i, to_float(x[i])));
    x.store(p);
  }
}

// query_transform on 8 dims [8c, 8c + 8) of one query row held in registers, given the partner dims (8c ± D/2).
template <class V, int D, class VP>
__device__ __forceinline__ void query_transform_chunk(const VP& v, const Index& ix, int c, float (&x)[8],
                                                      const float (&partner)[8]) {
  constexpr int kHalf = D / 16;
  const int pair0 = (c < kHalf ? c : c - kHalf) * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[i] = V::query_transform(v, V::dim_state(v, pair0 + i, D), ix, 8 * c + i, x[i], partner[i]);
  }
}

}  // namespace variant
}  // namespace cuinfer
