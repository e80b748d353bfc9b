// Ragged K/V tensors: request b owns rows kv_indptr[b] .. kv_indptr[b+1] of k and v ([tokens, heads, dim] NHD or
// [heads, tokens, dim] HND: only the strides differ, k_stride_n / k_stride_h and v_stride_n / v_stride_h).
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace kv {

struct Ragged {
  static constexpr bool kPaged = false;

  // Keys of request b whose rows start at `base` (= kv_indptr[b]).
  template <class P> __device__ __forceinline__ static int len(const P& p, int b, int base) {
    return static_cast<const int*>(p.kv_indptr)[b + 1] - base;
  }

  // Element offset of row `row` (absolute: base + key) of KV head kvh from the K base pointer.
  template <class P> __device__ __forceinline__ static i64 k_offset(const P& p, int row, int kvh) {
    return static_cast<i64>(row) * p.k_stride_n + static_cast<i64>(kvh) * p.k_stride_h;
  }
  template <class P> __device__ __forceinline__ static i64 v_offset(const P& p, int row, int kvh) {
    return static_cast<i64>(row) * p.v_stride_n + static_cast<i64>(kvh) * p.v_stride_h;
  }
};

}  // namespace kv
}  // namespace cuinfer
