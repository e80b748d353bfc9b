// Merge kernels for attention states (o, lse), lse in base 2 (the operator: state/merge.cuh).
//   merge_two:      (o_a, lse_a) (+) (o_b, lse_b) -> (o, lse); in place when o == o_a, optional row mask
//   merge_states:   S states o[L, S, H, D], lse[L, S, H] -> o[L, H, D], lse[L, H]
//   merge_partials: the split-KV partial rows of a work plan (fp32, in the workspace) -> the output rows
// Memory bound: a group of D / VEC threads owns one (row, head) vector, each thread one 16-byte slice, and the
// slices of several states are loaded before they are used so that enough bytes are in flight per SM.
// The parameter structs (MergeTwoParams, MergeStatesParams, MergePartialsParams) come from the generated preamble.
#include "common/vec.cuh"
#include "state/merge.cuh"

namespace cuinfer {

template <typename T> struct SliceIO {
  static constexpr int kVec = kVec16<T>;
  __device__ __forceinline__ static void load(const T* p, float (&x)[kVec]) {
    Vec<T, kVec> v;
    v.load_stream(p);
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = to_float(v[i]);
  }
  __device__ __forceinline__ static void store(T* p, const float (&x)[kVec]) {
    Vec<T, kVec> v;
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = from_float<T>(x[i]);
    v.store_global(p);
  }
};

// Rows (one per (token, head)) handled by a block of kThreads threads: a group of kTpr threads (a power of two, at
// most a warp, so group reductions are warp shuffles) owns one row, each thread kSlices 16-byte slices of it.
template <typename T, int D, int kThreads> struct RowTiling {
  static constexpr int kVec = kVec16<T>;
  static_assert(D % kVec == 0, "head dim must be a multiple of one 16-byte vector");
  static constexpr int kTpr = D / kVec > 32 ? 32 : D / kVec;
  static_assert((kTpr & (kTpr - 1)) == 0, "threads per row must be a power of two");
  static constexpr int kSlices = D / (kVec * kTpr);
  static_assert(kSlices * kVec * kTpr == D, "head dim must split evenly over the row's threads");
  static constexpr int kRowsPerWarp = 32 / kTpr;
  static constexpr int kRowsPerBlock = kThreads / kTpr;
  static_assert(kThreads % 32 == 0, "whole warps");
};

constexpr unsigned kFullMask = 0xffffffffu;

template <int kTpr> __device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int off = kTpr / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off, kTpr));
  return v;
}
template <int kTpr> __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = kTpr / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFullMask, v, off, kTpr);
  return v;
}

// Merge the states of one row into acc (unnormalised), m (max lse) and d (sum of 2^(lse - m)).
// Latency matters more than arithmetic here: lane j of the row's group fetches the lse (and the address) of state
// s0 + j, so one round trip brings up to kTpr states' weights; they are then broadcast by shuffles while kUnroll
// states' o slices are in flight. Empty states (lse = -inf) are never read, so garbage (even NaN) in their o cannot
// leak into the result: merging an empty state is an exact no-op.
// `count` is this row's number of states, `count_warp` the warp-wide maximum (loops must be warp-uniform because
// every lane takes part in the shuffles); `valid` is false for a group past the last row.
// Src: i64 fetch(int s, float& lse) -> an address handle of state s (only called for s < count);
//      Raw (a slice in its storage type), void load(i64 handle, int slice, Raw&),
//      static void accumulate(const Raw&, float w, float (&acc)[kVec]) (acc += w * slice).
template <typename Tl, int kUnroll, typename Src>
__device__ __forceinline__ void merge_row(const Src& src, int count, int count_warp, bool valid, int lane_g,
                                          float (&acc)[Tl::kSlices][Tl::kVec], float& m, float& d) {
  constexpr int kTpr = Tl::kTpr, kVec = Tl::kVec, kSlices = Tl::kSlices;
  m = neg_inf();
  d = 0.f;
#pragma unroll
  for (int c = 0; c < kSlices; ++c)
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[c][i] = 0.f;
  for (int s0 = 0; s0 < count_warp; s0 += kTpr) {
    float my_lse = neg_inf();
    i64 my_handle = 0;
    if (valid && s0 + lane_g < count) my_handle = src.fetch(s0 + lane_g, my_lse);
    const float m_new = fmaxf(m, group_max<kTpr>(my_lse));
    const float m_ref = state::ref_of(m_new);  // all empty so far: keep every weight exactly 0
    const float w = fmath::ex2(my_lse - m_ref);
    const float rescale = fmath::ex2(m - m_ref);
    d = d * rescale + group_sum<kTpr>(w);
#pragma unroll
    for (int c = 0; c < kSlices; ++c)
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[c][i] *= rescale;
    m = m_new;
    const int n = min(kTpr, count_warp - s0);
    for (int u0 = 0; u0 < n; u0 += kUnroll) {
      float wu[kUnroll];
      i64 hu[kUnroll];
      typename Src::Raw raw[kUnroll][kSlices];  // loads land in their storage type: 4 registers per 16-byte slice
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        wu[u] = __shfl_sync(kFullMask, w, u0 + u < n ? u0 + u : 0, kTpr);
        hu[u] = __shfl_sync(kFullMask, my_handle, u0 + u < n ? u0 + u : 0, kTpr);
        if (u0 + u >= n) wu[u] = 0.f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int c = 0; c < kSlices; ++c)
          if (wu[u] > 0.f) src.load(hu[u], c, raw[u][c]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int c = 0; c < kSlices; ++c)
          if (wu[u] > 0.f) Src::accumulate(raw[u][c], wu[u], acc[c]);
    }
  }
}

// Normalise and store one merged row; lse written by the group's first thread.
template <typename Tl, typename T>
__device__ __forceinline__ void store_row(T* o_row, float* lse_ptr, int col, float (&acc)[Tl::kSlices][Tl::kVec],
                                          float m, float d) {
  const float inv = state::inv_of(d);
#pragma unroll
  for (int c = 0; c < Tl::kSlices; ++c) {
    float y[Tl::kVec];
#pragma unroll
    for (int i = 0; i < Tl::kVec; ++i) y[i] = acc[c][i] * inv;
    SliceIO<T>::store(o_row + col + c * Tl::kTpr * Tl::kVec, y);
  }
  if (col == 0 && lse_ptr != nullptr) *lse_ptr = state::lse_of(m, d);
}

// Warp-uniform traversal of the rows: every lane runs the same number of iterations (shuffles need the whole warp).
#define CUINFER_FOR_EACH_ROW(Tl, rows, r, valid, lane_g)                                                         \
  const int lane_g = (threadIdx.x & 31) % Tl::kTpr;                                                            \
  const i64 row_in_block = (threadIdx.x / 32) * Tl::kRowsPerWarp + (threadIdx.x & 31) / Tl::kTpr;              \
  for (i64 base = (i64)blockIdx.x * Tl::kRowsPerBlock; base < (rows); base += (i64)gridDim.x * Tl::kRowsPerBlock) \
    if (const i64 r = base + row_in_block; true)                                                               \
      if (const bool valid = r < (rows); true)

// ---------------------------------------------------------------------------------------------------------------
template <typename T, int D, int kThreads>
__global__ void __launch_bounds__(kThreads) merge_two(const __grid_constant__ MergeTwoParams p) {
  using Tl = RowTiling<T, D, kThreads>;
  constexpr int kVec = Tl::kVec;
  const i64 rows = (i64)p.num_rows * p.num_heads;
  const int col = ((threadIdx.x & 31) % Tl::kTpr) * kVec;
  for (i64 r = (i64)blockIdx.x * Tl::kRowsPerBlock + (threadIdx.x / 32) * Tl::kRowsPerWarp + (threadIdx.x & 31) / Tl::kTpr;
       r < rows; r += (i64)gridDim.x * Tl::kRowsPerBlock) {
    const i64 l = r / p.num_heads;
    const int h = (int)(r - l * p.num_heads);
    if (p.mask != nullptr && !reinterpret_cast<const bool*>(p.mask)[l]) continue;
    const float sa = reinterpret_cast<const float*>(p.lse_a)[l * p.lse_a_s0 + h * p.lse_a_s1];
    const float sb = reinterpret_cast<const float*>(p.lse_b)[l * p.lse_b_s0 + h * p.lse_b_s1];
    float lse = neg_inf();
#pragma unroll
    for (int c = 0; c < Tl::kSlices; ++c) {
      const int cc = col + c * Tl::kTpr * kVec;
      state::Merger<kVec> mg;
      mg.init(fmaxf(sa, sb));
      // an empty state is not read at all (its o may be anything)
      const float wa = mg.weight(sa), wb = mg.weight(sb);
      float xa[kVec], xb[kVec];  // (both loads in flight before either is used)
      if (wa > 0.f) SliceIO<T>::load(reinterpret_cast<const T*>(p.o_a) + l * p.o_a_s0 + h * p.o_a_s1 + cc, xa);
      if (wb > 0.f) SliceIO<T>::load(reinterpret_cast<const T*>(p.o_b) + l * p.o_b_s0 + h * p.o_b_s1 + cc, xb);
      if (wa > 0.f) mg.add(wa, 1.f, xa);
      if (wb > 0.f) mg.add(wb, 1.f, xb);
      lse = mg.finish();
      SliceIO<T>::store(reinterpret_cast<T*>(p.o) + l * p.o_s0 + h * p.o_s1 + cc, mg.acc);
    }
    if (col == 0) reinterpret_cast<float*>(p.lse)[l * p.lse_s0 + h * p.lse_s1] = lse;
  }
}

// ---------------------------------------------------------------------------------------------------------------
template <typename T, int kVec> struct StridedStates {
  const T* o_row;
  const float* lse_row;
  i64 o_state_stride, lse_state_stride;
  int slice_stride;
  __device__ __forceinline__ i64 fetch(int s, float& lse) const {
    lse = lse_row[s * lse_state_stride];
    return s * o_state_stride;
  }
  using Raw = Vec<T, kVec>;
  __device__ __forceinline__ void load(i64 h, int c, Raw& x) const { x.load_stream(o_row + h + c * slice_stride); }
  __device__ __forceinline__ static void accumulate(const Raw& x, float w, float (&acc)[kVec]) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] += w * to_float(x[i]);
  }
};

// S states per row: o[L, S, H, D], lse[L, S, H] -> o[L, H, D], lse[L, H].
template <typename T, int D, int kThreads, int kUnroll, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) merge_states(const __grid_constant__ MergeStatesParams p) {
  using Tl = RowTiling<T, D, kThreads>;
  const i64 rows = (i64)p.num_rows * p.num_heads;
  CUINFER_FOR_EACH_ROW(Tl, rows, r, valid, lane_g) {
    const i64 l = valid ? r / p.num_heads : 0;
    const int h = valid ? (int)(r - l * p.num_heads) : 0;
    const int col = lane_g * Tl::kVec;
    StridedStates<T, Tl::kVec> src{reinterpret_cast<const T*>(p.o_in) + l * p.o_in_s0 + h * p.o_in_s2 + col,
                                   reinterpret_cast<const float*>(p.lse_in) + l * p.lse_in_s0 + h * p.lse_in_s2,
                                   p.o_in_s1, p.lse_in_s1, Tl::kTpr * Tl::kVec};
    float acc[Tl::kSlices][Tl::kVec], m, d;
    merge_row<Tl, kUnroll>(src, p.num_states, p.num_states, valid, lane_g, acc, m, d);
    if (valid)
      store_row<Tl>(reinterpret_cast<T*>(p.o) + l * p.o_s0 + h * p.o_s1,
                    reinterpret_cast<float*>(p.lse) + l * p.lse_s0 + h * p.lse_s1, col, acc, m, d);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// N fp32 values from 16-byte aligned p as N / 4 streamed 16-byte loads.
template <int N> __device__ __forceinline__ void load_floats(const float* p, float (&x)[N]) {
  static_assert(N % 4 == 0, "fp32 slices are whole 16-byte vectors");
#pragma unroll
  for (int c = 0; c < N / 4; ++c) {
    Vec<float, 4> v;
    v.load_stream(p + 4 * c);
#pragma unroll
    for (int i = 0; i < 4; ++i) x[4 * c + i] = v[i];
  }
}

template <int D, int kVec> struct PartialRows {
  const int* src;        // this target's partial-row indices, in KV order
  const float* part_o;   // partial_o + this thread's column
  const float* part_lse;
  int slice_stride;
  __device__ __forceinline__ i64 fetch(int s, float& lse) const {
    const int row = src[s];
    lse = part_lse[row];
    return (i64)row * D;
  }
  struct Raw {
    float v[kVec];
  };
  __device__ __forceinline__ void load(i64 h, int c, Raw& x) const { load_floats(part_o + h + c * slice_stride, x.v); }
  __device__ __forceinline__ static void accumulate(const Raw& x, float w, float (&acc)[kVec]) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] += w * x.v[i];
  }
};

// Split-KV partials of a plan: target t merges partial rows merge_src[merge_indptr[t] .. merge_indptr[t+1]) (fp32,
// [rows, D] in the workspace) into o[merge_dst_token[t], merge_dst_head[t]]. The target count is read on the device
// (plan header) so a CUDA graph captured once stays valid after re-planning.
template <typename T, int D, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) merge_partials(const __grid_constant__ MergePartialsParams p) {
  using Tl = RowTiling<T, D, kThreads>;  // output slices of 16 bytes: kVec fp32 sources per slice
  const int n = *reinterpret_cast<const int*>(p.num_targets);
  const int* indptr = reinterpret_cast<const int*>(p.merge_indptr);
  CUINFER_FOR_EACH_ROW(Tl, n, t, valid, lane_g) {
    const int begin = valid ? indptr[t] : 0;
    const int count = valid ? indptr[t + 1] - begin : 0;
    const int count_warp = __reduce_max_sync(kFullMask, count);
    const int col = lane_g * Tl::kVec;
    PartialRows<D, Tl::kVec> src{reinterpret_cast<const int*>(p.merge_src) + begin,
                                 reinterpret_cast<const float*>(p.partial_o) + col,
                                 reinterpret_cast<const float*>(p.partial_lse), Tl::kTpr * Tl::kVec};
    float acc[Tl::kSlices][Tl::kVec], m, d;
    merge_row<Tl, kUnroll>(src, count, count_warp, valid, lane_g, acc, m, d);
    if (valid) {
      const i64 tok = reinterpret_cast<const int*>(p.merge_dst_token)[t];
      const int head = reinterpret_cast<const int*>(p.merge_dst_head)[t];
      float* lse = p.lse == nullptr ? nullptr : reinterpret_cast<float*>(p.lse) + tok * p.lse_s0 + head * p.lse_s1;
      store_row<Tl>(reinterpret_cast<T*>(p.o) + tok * p.o_s0 + head * p.o_s1, lse, col, acc, m, d);
    }
  }
}

}  // namespace cuinfer
