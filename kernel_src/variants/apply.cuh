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

// key_transform on row r (key `pos`) of the K tile `tile`, chunk pair c, given the PosStates of (pos, 8c + i).
template <class V, int D, class T, class VP>
__device__ __forceinline__ void key_transform_row(const VP& v, const Index& ix, T* tile, int r, int pos, int c,
                                                  const typename V::DimState (&s)[8],
                                                  const typename V::PosState (&kp)[8]) {
  constexpr int kChunks = D / 8;
  T* lo_p = tile + Swizzle<kChunks>::slot(r, c) * 8;
  T* hi_p = tile + Swizzle<kChunks>::slot(r, c + kChunks / 2) * 8;
  Vec<T, 8> lo, hi;
  lo.load(lo_p);
  hi.load(hi_p);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float x = to_float(lo[i]), y = to_float(hi[i]);
    lo[i] = from_float<T>(V::key_transform(v, s[i], kp[i], ix, pos, 8 * c + i, x, y));
    hi[i] = from_float<T>(V::key_transform(v, s[i], kp[i], ix, pos, 8 * c + i + D / 2, y, x));
  }
  lo.store(lo_p);
  hi.store(hi_p);
}

// The PosStates of key pos for dimension pairs 8c .. 8c+7.
template <class V, class VP>
__device__ __forceinline__ void pos_states(const VP& v, int c, int pos, const typename V::DimState (&s)[8],
                                           typename V::PosState (&kp)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) kp[i] = V::pos_state(v, s[i], 8 * c + i, pos);
}

// key_transform on rows [0, rows) of the K tile `tile` (row r is key key0 + r), kThreads threads from thread `tid`;
// the caller synchronises before and after. Thread tid owns chunk pair c = tid % (D/16), the one its `s` was made for.
// Every row's PosStates are computed exactly (prefill; decode advances them: KeyStates below).
template <class V, int D, int kThreads, class T, class VP>
__device__ __forceinline__ void key_transform_tile(const VP& v, const Index& ix, T* tile, int key0, int rows,
                                                   const typename V::DimState (&s)[8], int tid) {
  constexpr int kHalf = D / 16;
  static_assert(kThreads % kHalf == 0, "threads cover whole half rows");
  const int c = tid % kHalf;
  for (int r = tid / kHalf; r < rows; r += kThreads / kHalf) {
    typename V::PosState kp[8];
    if constexpr (V::kPosState) pos_states<V>(v, c, key0 + r, s, kp);
    key_transform_row<V, D>(v, ix, tile, r, key0 + r, c, s, kp);
  }
}

// A decode thread's transform states for K tiles of kTile keys: the DimStates of its dimension pairs 8c .. 8c+7
// (c = tid % (D/16)) and, with pos_advance, the PosStates of the distance between the rows of a tile it transforms
// (kThreads / (D/16) keys).
template <class V, int D, int kThreads, int kTile> struct KeyStates {
  static constexpr int kHalf = D / 16;
  static constexpr int kRowStep = kThreads / kHalf;
  static constexpr int kRows = (kTile + kRowStep - 1) / kRowStep;  // rows of a tile per thread, at most
  static_assert(kThreads % kHalf == 0, "threads cover whole half rows");
  typename V::DimState s[8];
  typename V::PosState step[8];

  // (also the q transform's: a thread's q chunks are its K chunk pair)
  template <class VP> __device__ __forceinline__ void init(const VP& v, int tid) {
    const int c = tid % kHalf;
    pair_states<V, D>(v, c, s);
    if constexpr (V::kPosAdvance) pos_states<V>(v, c, kRowStep, s, step);
  }

  // key_transform on rows [0, rows) of the K tile (row r is key key0 + r; rows <= kTile), as key_transform_tile;
  // with pos_advance the PosStates of this thread's first row are exact and each further row's come from pos_advance
  // by one step (at most kRows - 1 advances per tile, re-seeded exactly at every tile).
  template <class T, class VP>
  __device__ __forceinline__ void transform_tile(const VP& v, const Index& ix, T* tile, int key0, int rows,
                                                 int tid) const {
    if constexpr (!V::kPosAdvance) {
      key_transform_tile<V, D, kThreads>(v, ix, tile, key0, rows, s, tid);
    } else {
      const int c = static_cast<unsigned>(tid) % kHalf;
      const int r0 = static_cast<unsigned>(tid) / kHalf;
      typename V::PosState kp[8];
      pos_states<V>(v, c, key0 + r0, s, kp);
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int r = r0 + j * kRowStep;
        if (r >= rows) break;
        if (j > 0) {
#pragma unroll
          for (int i = 0; i < 8; ++i) V::pos_advance(v, s[i], 8 * c + i, kp[i], step[i]);
        }
        key_transform_row<V, D>(v, ix, tile, r, key0 + r, c, s, kp);
      }
    }
  }
};

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

// ... given the DimStates of the chunk's pairs (c % (D/16): the decode kernels' KeyStates::s, made for the same pairs).
template <class V, int D, class VP>
__device__ __forceinline__ void query_transform_chunk(const VP& v, const Index& ix, int c, float (&x)[8],
                                                      const float (&partner)[8], const typename V::DimState (&s)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = V::query_transform(v, s[i], ix, 8 * c + i, x[i], partner[i]);
}

}  // namespace variant
}  // namespace cuinfer
