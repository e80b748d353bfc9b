// Merge kernels for attention states (o, lse), lse in base 2 (see state.cuh).
//   merge_two:      (o_a, lse_a) (+) (o_b, lse_b) -> (o, lse); in place when o == o_a, optional row mask
//   merge_states:   S states o[L, S, H, D], lse[L, S, H] -> o[L, H, D], lse[L, H]
//   merge_partials: the split-KV partial rows of a work plan (fp32, in the workspace) -> the output rows
// Memory bound: a group of D / VEC threads owns one (row, head) vector, each thread one 16-byte slice, and the
// slices of several states are loaded before they are used so that enough bytes are in flight per SM.
// The parameter structs (MergeTwoParams, MergeStatesParams, MergePartialsParams) come from the generated preamble.
#include "attention/state.cuh"
#include "common/vec.cuh"

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
    v.store(p);
  }
};

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

// Rows (one per (token, head)) handled by a block of kThreads threads, D / VEC threads per row.
template <typename T, int D, int kThreads> struct RowTiling {
  static constexpr int kVec = kVec16<T>;
  static_assert(D % kVec == 0, "head dim must be a multiple of one 16-byte vector");
  static constexpr int kThreadsPerRow = D / kVec;
  static_assert(kThreads % kThreadsPerRow == 0, "block size must hold whole rows");
  static constexpr int kRowsPerBlock = kThreads / kThreadsPerRow;
};

// ---------------------------------------------------------------------------------------------------------------
template <typename T, int D, int kThreads>
__global__ void __launch_bounds__(kThreads) merge_two(const __grid_constant__ MergeTwoParams p) {
  using Tl = RowTiling<T, D, kThreads>;
  constexpr int kVec = Tl::kVec;
  const int lane_row = threadIdx.x / Tl::kThreadsPerRow;
  const int col = (threadIdx.x % Tl::kThreadsPerRow) * kVec;
  const i64 rows = (i64)p.num_rows * p.num_heads;
  for (i64 r = (i64)blockIdx.x * Tl::kRowsPerBlock + lane_row; r < rows; r += (i64)gridDim.x * Tl::kRowsPerBlock) {
    const i64 l = r / p.num_heads;
    const int h = (int)(r - l * p.num_heads);
    if (p.mask != nullptr && !reinterpret_cast<const bool*>(p.mask)[l]) continue;
    const T* a = reinterpret_cast<const T*>(p.o_a) + l * p.o_a_s0 + h * p.o_a_s1 + col;
    const T* b = reinterpret_cast<const T*>(p.o_b) + l * p.o_b_s0 + h * p.o_b_s1 + col;
    const float sa = reinterpret_cast<const float*>(p.lse_a)[l * p.lse_a_s0 + h * p.lse_a_s1];
    const float sb = reinterpret_cast<const float*>(p.lse_b)[l * p.lse_b_s0 + h * p.lse_b_s1];
    float xa[kVec], xb[kVec];
    SliceIO<T>::load(a, xa);
    SliceIO<T>::load(b, xb);
    MergeAcc<kVec> acc;
    acc.init();
    acc.add(xa, sa);
    acc.add(xb, sb);
    float y[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = acc.value(i);
    SliceIO<T>::store(reinterpret_cast<T*>(p.o) + l * p.o_s0 + h * p.o_s1 + col, y);
    if (col == 0) reinterpret_cast<float*>(p.lse)[l * p.lse_s0 + h * p.lse_s1] = acc.lse();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// S states per row; kUnroll state slices are loaded before any is used (kUnroll * 16 bytes in flight per thread).
template <typename T, int D, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) merge_states(const __grid_constant__ MergeStatesParams p) {
  using Tl = RowTiling<T, D, kThreads>;
  constexpr int kVec = Tl::kVec;
  const int lane_row = threadIdx.x / Tl::kThreadsPerRow;
  const int col = (threadIdx.x % Tl::kThreadsPerRow) * kVec;
  const i64 rows = (i64)p.num_rows * p.num_heads;
  const float* lse_in = reinterpret_cast<const float*>(p.lse_in);
  for (i64 r = (i64)blockIdx.x * Tl::kRowsPerBlock + lane_row; r < rows; r += (i64)gridDim.x * Tl::kRowsPerBlock) {
    const i64 l = r / p.num_heads;
    const int h = (int)(r - l * p.num_heads);
    const float* lse_row = lse_in + l * p.lse_in_s0 + h * p.lse_in_s2;
    // Pass 1 over the (small) lse values: max and normaliser, so pass 2 streams o with known weights.
    float m = neg_inf();
    for (int s = 0; s < p.num_states; ++s) m = fmaxf(m, lse_row[s * p.lse_in_s1]);
    float out[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = 0.f;
    float d = 0.f;
    if (m != neg_inf()) {
      const T* o_row = reinterpret_cast<const T*>(p.o_in) + l * p.o_in_s0 + h * p.o_in_s2 + col;
      for (int s0 = 0; s0 < p.num_states; s0 += kUnroll) {
        float x[kUnroll][kVec];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (s0 + u < p.num_states) SliceIO<T>::load(o_row + (i64)(s0 + u) * p.o_in_s1, x[u]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (s0 + u < p.num_states) {
            const float w = exp2f(lse_row[(s0 + u) * p.lse_in_s1] - m);  // -inf states get weight 0
            d += w;
#pragma unroll
            for (int i = 0; i < kVec; ++i) out[i] += w * x[u][i];
          }
        }
      }
      const float inv = 1.f / d;
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] *= inv;
    }
    SliceIO<T>::store(reinterpret_cast<T*>(p.o) + l * p.o_s0 + h * p.o_s1 + col, out);
    if (col == 0) reinterpret_cast<float*>(p.lse)[l * p.lse_s0 + h * p.lse_s1] = merged_lse_from(m, d);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Split-KV partials of a plan: target t merges partial rows merge_src[merge_indptr[t] .. merge_indptr[t+1]) (fp32,
// [rows, D] in the workspace) into o[merge_dst_token[t], merge_dst_head[t]]. The target count is read on the device
// (plan header) so a CUDA graph captured once stays valid after re-planning.
template <typename T, int D, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) merge_partials(const __grid_constant__ MergePartialsParams p) {
  using Tl = RowTiling<T, D, kThreads>;  // one 16-byte output slice per thread: 8 fp32 sources for 16-bit T
  constexpr int kVec = Tl::kVec;
  const int lane_row = threadIdx.x / Tl::kThreadsPerRow;
  const int col = (threadIdx.x % Tl::kThreadsPerRow) * kVec;
  const int n = *reinterpret_cast<const int*>(p.num_targets);
  const int* indptr = reinterpret_cast<const int*>(p.merge_indptr);
  const int* src = reinterpret_cast<const int*>(p.merge_src);
  const int* dst_token = reinterpret_cast<const int*>(p.merge_dst_token);
  const int* dst_head = reinterpret_cast<const int*>(p.merge_dst_head);
  const float* part_o = reinterpret_cast<const float*>(p.partial_o);
  const float* part_lse = reinterpret_cast<const float*>(p.partial_lse);
  for (int t = blockIdx.x * Tl::kRowsPerBlock + lane_row; t < n; t += gridDim.x * Tl::kRowsPerBlock) {
    const int begin = indptr[t], end = indptr[t + 1];
    float m = neg_inf();
    for (int j = begin; j < end; ++j) m = fmaxf(m, part_lse[src[j]]);
    float out[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = 0.f;
    float d = 0.f;
    if (m != neg_inf()) {
      for (int j0 = begin; j0 < end; j0 += kUnroll) {
        float x[kUnroll][kVec];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (j0 + u < end) load_floats(part_o + (i64)src[j0 + u] * D + col, x[u]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (j0 + u < end) {
            const float w = exp2f(part_lse[src[j0 + u]] - m);
            d += w;
#pragma unroll
            for (int i = 0; i < kVec; ++i) out[i] += w * x[u][i];
          }
        }
      }
      const float inv = 1.f / d;
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] *= inv;
    }
    const i64 tok = dst_token[t];
    const int head = dst_head[t];
    SliceIO<T>::store(reinterpret_cast<T*>(p.o) + tok * p.o_s0 + head * p.o_s1 + col, out);
    if (col == 0 && p.lse != nullptr) reinterpret_cast<float*>(p.lse)[tok * p.lse_s0 + head * p.lse_s1] = merged_lse_from(m, d);
  }
}

}  // namespace cuinfer
