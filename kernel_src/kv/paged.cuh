// Paged KV caches (any page size; NHD, HND, 5-D cache or (k, v) pair: only base pointers and strides differ).
//
// Request b owns the page-table entries indices[indptr[b] .. indptr[b+1]); key j of the request lives in page
// indices[indptr[b] + j / page_size], slot j % page_size; the last page holds last_page_len[b] keys. Block-sparse
// rows are the same structure (a block column is a page). The kernels' parameter structs carry kv_indices,
// kv_indptr, kv_last_page_len, page_size with its fast-division magic (page_mul, page_shift) and the element strides
// of a page, a slot and a head (k_stride_page, k_stride_n, k_stride_h; V shares them).
#pragma once
#include "common/ldst.cuh"
#include "common/math.cuh"
#include "common/types.cuh"

namespace cuinfer {
namespace kv {

struct Paged {
  static constexpr bool kPaged = true;

  // Keys of request b whose entries start at `base` (= kv_indptr[b]).
  template <class P> __device__ __forceinline__ static int len(const P& p, int b, int base) {
    const int num_pages = static_cast<const int*>(p.kv_indptr)[b + 1] - base;
    return num_pages > 0 ? (num_pages - 1) * p.page_size + static_cast<const int*>(p.kv_last_page_len)[b] : 0;
  }

  // The page holding key `key` of the request whose entries start at `base` (one global read), 0 when !valid.
  template <class P> __device__ __forceinline__ static int page(const P& p, int base, int key, bool valid) {
    const u32 pg = fast_div(static_cast<u32>(key), p.page_mul, p.page_shift);
    return valid ? ldg_i32(static_cast<const int*>(p.kv_indices) + base + pg) : 0;
  }

  // Element offset of key `key` (in page `page`) of KV head kvh from the K (or V) base pointer.
  template <class P> __device__ __forceinline__ static i64 offset(const P& p, int page, int key, int kvh) {
    const int pg = static_cast<int>(fast_div(static_cast<u32>(key), p.page_mul, p.page_shift));
    return static_cast<i64>(page) * p.k_stride_page + static_cast<i64>(key - pg * p.page_size) * p.k_stride_n +
           static_cast<i64>(kvh) * p.k_stride_h;
  }
};

}  // namespace kv
}  // namespace cuinfer
