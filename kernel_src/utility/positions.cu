// Index arrays of a serving step (int32):
//   get_batch_indices_positions: row t < append_indptr[B] belongs to request b (append_indptr[b] <= t <
//     append_indptr[b+1]) and lands at position seq_lens[b] - append_indptr[b+1] + t (seq_lens count the tokens
//     after the append); rows past append_indptr[B] (padding up to nnz) get batch index -1 and position -1.
//   get_seq_lens: seq_lens[b] = (pages - 1) * page_size + kv_last_page_len[b] for a request with pages
//     (pages = kv_indptr[b+1] - kv_indptr[b]), 0 for one without.
//   narrow_indices: an int64 index array as int32 (the caller's int64 indices for the kernels that read int32; the
//     values must fit, which the host does not read to check).
// A thread writes 4 consecutive entries of each output: one 16-byte store when all 4 are in range.
// The parameter struct PositionsParams comes from the generated preamble.
#include "common/vec.cuh"

namespace cuinfer {
namespace positions {

constexpr int kThreads = 256;

__device__ __forceinline__ void store4(int* out, i64 i, i64 n, const Vec<int, 4>& v) {
  if (i + 4 <= n) {
    v.store_global(out + i);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i + k < n) out[i + k] = v[k];
  }
}

__global__ void __launch_bounds__(kThreads) batch_indices_positions(const __grid_constant__ PositionsParams p) {
  const int* indptr = static_cast<const int*>(p.indptr);
  const int* seq_lens = static_cast<const int*>(p.lens);
  const int batch = p.batch_size;
  const int end = batch > 0 ? __ldg(indptr + batch) : 0;
  for (i64 i = 4 * (static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x); i < p.n;
       i += 4 * static_cast<i64>(gridDim.x) * kThreads) {
    int lo = 0, hi = batch;  // the last request b with indptr[b] <= i (empty requests are passed over)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (__ldg(indptr + mid) <= i) lo = mid;
      else hi = mid;
    }
    Vec<int, 4> b, pos;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const i64 t = i + k;
      while (lo + 1 < batch && __ldg(indptr + lo + 1) <= t) ++lo;
      const bool live = batch > 0 && t < end && t >= __ldg(indptr + lo);
      b[k] = live ? lo : -1;
      pos[k] = live ? __ldg(seq_lens + lo) - __ldg(indptr + lo + 1) + static_cast<int>(t) : -1;
    }
    store4(static_cast<int*>(p.out0), i, p.n, b);
    store4(static_cast<int*>(p.out1), i, p.n, pos);
  }
}

__global__ void __launch_bounds__(kThreads) seq_lens(const __grid_constant__ PositionsParams p) {
  const int* indptr = static_cast<const int*>(p.indptr);
  const int* last = static_cast<const int*>(p.lens);
  for (i64 i = 4 * (static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x); i < p.n;
       i += 4 * static_cast<i64>(gridDim.x) * kThreads) {
    Vec<int, 4> len;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const i64 b = i + k < p.n ? i + k : p.n - 1;
      const int pages = __ldg(indptr + b + 1) - __ldg(indptr + b);
      len[k] = pages > 0 ? (pages - 1) * p.page_size + __ldg(last + b) : 0;
    }
    store4(static_cast<int*>(p.out0), i, p.n, len);
  }
}

__global__ void __launch_bounds__(kThreads) narrow_indices(const __grid_constant__ PositionsParams p) {
  const long long* in = static_cast<const long long*>(p.indptr);
  for (i64 i = 4 * (static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x); i < p.n;
       i += 4 * static_cast<i64>(gridDim.x) * kThreads) {
    Vec<int, 4> v;
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = static_cast<int>(__ldg(in + (i + k < p.n ? i + k : p.n - 1)));
    store4(static_cast<int*>(p.out0), i, p.n, v);
  }
}

}  // namespace positions
}  // namespace cuinfer
