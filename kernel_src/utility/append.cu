// append_paged_kv_cache: row t of append_key / append_value ([nnz, H, D], rows strided, last dim contiguous) is
// copied into request b = batch_indices[t] at position pos = positions[t]: page kv_indices[kv_indptr[b] + pos /
// page_size], slot pos % page_size, of the K / V cache (any layout: the cache is base pointers and element strides of
// a page, a slot and a head). Bit-exact copies.
//
// Memory bound: the work is flat over (token, 16-byte vector of the token's row) and each thread moves kUnroll
// vectors of K and the same kUnroll vectors of V (one slot lookup serves both), all 2 * kUnroll loads issued before
// the first store. Consecutive threads take consecutive vectors of a token, so a warp moves contiguous 512-byte
// pieces of a row. When a row's heads are contiguous in both the source and the cache (NHD, a plain or fused-qkv
// slice) the host passes vecs_per_row = vecs_per_token: the row is one run of vectors and h is always 0. The two
// sides may have different row lengths (a (k_cache, v_cache) pair with different head dims): the work covers the
// longer, and vector r of the shorter side exists only for r < its vecs_per_token.
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

// Element offsets of vector r of a token row of side s: in the source row and in the cache slot.
struct SideOffsets {
  i64 src, dst;
};
__device__ __forceinline__ SideOffsets side_offsets(const AppendSide& s, u32 r, int kvec) {
  const u32 h = fast_div(r, s.row_mul, s.row_shift);  // 0 for a contiguous row (vecs_per_row = vecs_per_token)
  const i64 c = static_cast<i64>(r - h * static_cast<u32>(s.vecs_per_row)) * kvec;
  return {h * s.src_s1 + c, h * s.dst_head + c};
}

// The host launches only when batch_size >= 1 and kv_indices is not empty (otherwise every row is skipped), so the
// clamped lookups above always read inside the arrays.
template <typename Tin, typename Tcache, int kUnroll>
__global__ void __launch_bounds__(kThreads, 4) append_paged_kv_cache(const __grid_constant__ AppendParams p) {
  using Store = CacheStore<Tin, Tcache>;
  constexpr int kVec = Store::kVec;
  const Tin* ksrc = static_cast<const Tin*>(p.k.src);
  const Tin* vsrc = static_cast<const Tin*>(p.v.src);
  Tcache* kdst = static_cast<Tcache*>(p.k.dst);
  Tcache* vdst = static_cast<Tcache*>(p.v.dst);
  const u32 total = static_cast<u32>(p.nnz) * static_cast<u32>(p.vecs_per_token);  // < 2^31 (host)
  const u32 step = gridDim.x * kThreads * kUnroll;
  for (u32 base = blockIdx.x * kThreads * kUnroll + threadIdx.x; base < total; base += step) {
    Slots<kUnroll> sl;
    u32 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const u32 w = base + u * kThreads;
      const u32 tl = fast_div(w, p.tok_mul, p.tok_shift);  // token within this launch
      r[u] = w - tl * static_cast<u32>(p.vecs_per_token);
      sl.t[u] = p.token_begin + static_cast<int>(tl);
      sl.ok[u] = w < total;
    }
    sl.find(p);
    typename Store::In xk[kUnroll], xv[kUnroll];
    i64 dk[kUnroll], dv[kUnroll];
    bool okk[kUnroll], okv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      okk[u] = sl.ok[u] & (r[u] < static_cast<u32>(p.k.vecs_per_token));
      okv[u] = sl.ok[u] & (r[u] < static_cast<u32>(p.v.vecs_per_token));
      const SideOffsets ok_ = side_offsets(p.k, r[u], kVec), ov = side_offsets(p.v, r[u], kVec);
      const i64 t = sl.t[u];
      if (okk[u]) xk[u].load(ksrc + t * p.k.src_s0 + ok_.src);
      if (okv[u]) xv[u].load(vsrc + t * p.v.src_s0 + ov.src);
      dk[u] = sl.page[u] * p.k.dst_page + sl.slot[u] * p.k.dst_slot + ok_.dst;
      dv[u] = sl.page[u] * p.v.dst_page + sl.slot[u] * p.v.dst_slot + ov.dst;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (okk[u]) Store::store(kdst + dk[u], xk[u]);
      if (okv[u]) Store::store(vdst + dv[u], xv[u]);
    }
  }
}

}  // namespace append
}  // namespace cuinfer
