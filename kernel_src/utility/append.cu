// append_paged_kv_cache: row t of append_key / append_value ([nnz, H, D], rows strided, last dim contiguous) is
// copied into request b = batch_indices[t] at position pos = positions[t]: page kv_indices[kv_indptr[b] + pos /
// page_size], slot pos % page_size, of the K / V cache (any layout: the cache is base pointers and element strides of
// a page, a slot and a head). Bit-exact copies.
//
// Memory bound: the work is flat over (token, head, 16-byte vector) and each thread moves kUnroll vectors whose
// loads are all issued before the first store. blockIdx.y picks the side (0 = K, 1 = V); each side has its own
// row length (a (k_cache, v_cache) pair may have different head dims).
//
// Rows whose indices fall outside the page table or the cache (batch index < 0 for padding rows, or out of range;
// a position past the request's kv_len; a page-table entry or a page beyond the arrays) are skipped: nothing is
// written for them. The host checks the indices only on request (the check reads them on the host).
//
// The store goes through CacheStore<Tin, Tcache>, the one place that knows the cache's element type: the
// same-dtype specialisation is a copy; a quantising fp8 store is another specialisation (input vectors of
// 16 bytes, stored as kVec fp8 values) with its scale in the parameters.
// The parameter struct AppendParams (with AppendSide for K and V) comes from the generated preamble.
#include "common/math.cuh"
#include "utility/io.cuh"

namespace cuinfer {
namespace append {

constexpr int kThreads = 256;

template <typename Tin, typename Tcache> struct CacheStore;

template <typename T> struct CacheStore<T, T> {
  static constexpr int kVec = kVec16<T>;
  using In = util::Chunk<T, kVec>;
  __device__ __forceinline__ static void store(T* dst, const In& x) { x.store(dst); }
};

// Where a thread's rows go. The lookups of its kUnroll rows run phase by phase without branches (indices clamped
// into their arrays, validity kept aside), so the dependent loads of all rows are in flight together.
template <int kUnroll> struct Slots {
  int t[kUnroll], b[kUnroll], pos[kUnroll], page[kUnroll], slot[kUnroll];
  bool ok[kUnroll];

  // t[u] set for the rows with ok[u]; afterwards ok[u] says whether row u has a slot (page[u], slot[u]).
  __device__ __forceinline__ void find(const AppendParams& p) {
    const int* indptr = static_cast<const int*>(p.kv_indptr);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t_safe = ok[u] ? t[u] : 0;
      b[u] = __ldg(static_cast<const int*>(p.batch_indices) + t_safe);
      pos[u] = __ldg(static_cast<const int*>(p.positions) + t_safe);
    }
    int first[kUnroll], pages[kUnroll], last_len[kUnroll], entry[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      ok[u] = ok[u] & (b[u] >= 0) & (b[u] < p.batch_size) & (pos[u] >= 0);  // & not &&: no branches
      const int bb = ok[u] ? b[u] : 0;
      first[u] = __ldg(indptr + bb);
      pages[u] = __ldg(indptr + bb + 1) - first[u];
      last_len[u] = __ldg(static_cast<const int*>(p.kv_last_page_len) + bb);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int pi = static_cast<int>(fast_div(static_cast<u32>(ok[u] ? pos[u] : 0), p.page_mul, p.page_shift));
      slot[u] = pos[u] - pi * p.page_size;
      entry[u] = first[u] + pi;
      // pos < kv_len = (pages - 1) * page_size + last_len, and the page-table entry inside kv_indices
      ok[u] = ok[u] & (pi < pages[u]) & ((pi < pages[u] - 1) | (slot[u] < last_len[u])) & (first[u] >= 0) &
              (entry[u] < p.num_indices);
      page[u] = __ldg(static_cast<const int*>(p.kv_indices) + (ok[u] ? entry[u] : 0));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) ok[u] = ok[u] & (page[u] >= 0) & (page[u] < p.num_pages);
  }
};

// The host launches only when batch_size >= 1 and kv_indices is not empty (otherwise every row is skipped), so the
// clamped lookups above always read inside the arrays.
template <typename Tin, typename Tcache, int kUnroll>
__global__ void __launch_bounds__(kThreads, 4) append_paged_kv_cache(const __grid_constant__ AppendParams p) {
  using Store = CacheStore<Tin, Tcache>;
  constexpr int kVec = Store::kVec;
  const AppendSide s = blockIdx.y == 0 ? p.k : p.v;
  const Tin* src = static_cast<const Tin*>(s.src);
  Tcache* dst = static_cast<Tcache*>(s.dst);
  const u32 total = static_cast<u32>(p.nnz) * static_cast<u32>(s.vecs_per_token);  // < 2^31 (host)
  const u32 step = gridDim.x * kThreads * kUnroll;
  for (u32 base = blockIdx.x * kThreads * kUnroll + threadIdx.x; base < total; base += step) {
    Slots<kUnroll> sl;
    u32 h[kUnroll];
    int c[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const u32 w = base + u * kThreads;
      const u32 tl = fast_div(w, s.tok_mul, s.tok_shift);  // token within this launch
      const u32 r = w - tl * static_cast<u32>(s.vecs_per_token);
      h[u] = fast_div(r, s.row_mul, s.row_shift);
      c[u] = static_cast<int>(r - h[u] * static_cast<u32>(s.vecs_per_row)) * kVec;
      sl.t[u] = p.token_begin + static_cast<int>(tl);
      sl.ok[u] = w < total;
    }
    sl.find(p);
    typename Store::In x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (sl.ok[u]) x[u].load(src + sl.t[u] * s.src_s0 + h[u] * s.src_s1 + c[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (sl.ok[u])
        Store::store(dst + sl.page[u] * s.dst_page + sl.slot[u] * s.dst_slot + h[u] * s.dst_head + c[u], x[u]);
  }
}

}  // namespace append
}  // namespace cuinfer
