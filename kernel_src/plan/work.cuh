// The kernel side of the work plan: the one place that knows how the plan buffer's arrays are read.
//
// The planner (planner/layout.py) packs a plan into one int32 buffer; the launch code hands the kernels pointers to
// its arrays as fields of their parameter struct (same names as the layout's arrays). A persistent CTA c runs items
// work_indptr[c] .. work_indptr[c+1] in order, then takes items of the shared tail (the pool, work_indptr[P] ..
// work_indptr[P+1] with P the CTA count) one at a time with an atomic counter. Item it is one query tile of one
// request for one KV head over the KV range [kv_start, kv_end); split items write fp32 partial states (partial >= 0,
// the first of their rows), others write the output. Kernels that merge split items themselves read each item's merge
// unit and piece count (item_merge, item_pieces). A compact plan (natural order, nothing split; p.natural_groups = G
// > 0, planner/layout.py pack_compact) stores only the G group entries: item it is group it % G of KV head it / G.
#pragma once
#include "common/ldst.cuh"
#include "common/types.cuh"

namespace cuinfer {
namespace plan {

template <class P> __device__ __forceinline__ const int* arr(const void* a) { return static_cast<const int*>(a); }

// ---- fields of an item entry ---------------------------------------------------------------------------------
template <class P> __device__ __forceinline__ int req(const P& p, int e) { return arr<P>(p.item_req)[e]; }
template <class P> __device__ __forceinline__ int qo_tile(const P& p, int e) { return arr<P>(p.item_qo_tile)[e]; }
template <class P> __device__ __forceinline__ int kv_head(const P& p, int e) { return arr<P>(p.item_kv_head)[e]; }
template <class P> __device__ __forceinline__ int kv_start(const P& p, int e) { return arr<P>(p.item_kv_start)[e]; }
template <class P> __device__ __forceinline__ int kv_end(const P& p, int e) { return arr<P>(p.item_kv_end)[e]; }
template <class P> __device__ __forceinline__ int partial(const P& p, int e) { return arr<P>(p.item_partial)[e]; }
template <class P> __device__ __forceinline__ int merge_unit(const P& p, int e) { return arr<P>(p.item_merge)[e]; }
template <class P> __device__ __forceinline__ int pieces(const P& p, int e) { return arr<P>(p.item_pieces)[e]; }

// Where item `it`'s facts are (its entry in the item arrays), its KV head and its partial row (compact-aware).
struct ItemRef {
  int entry, kv_head, partial;
};
template <class P> __device__ __forceinline__ ItemRef item_ref(const P& p, int it) {
  ItemRef r;
  const int ng = p.natural_groups;
  if (ng > 0) {
    r.kv_head = it / ng;
    r.entry = it - r.kv_head * ng;
    r.partial = -1;
  } else {
    r.entry = it;
    r.kv_head = kv_head(p, it);
    r.partial = partial(p, it);
  }
  return r;
}

// item_ref with loads the compiler may not merge with earlier ones (an epilogue re-reads instead of keeping the
// values live across the KV loop), plus the item's query tile and request.
struct ItemTail {
  int kv_head, partial, qo_tile, req;
};
template <class P> __device__ __forceinline__ ItemTail reload_item(const P& p, int it) {
  const int ng = p.natural_groups;
  ItemTail t;
  t.kv_head = ng > 0 ? it / ng : reload_i32(p.item_kv_head, it);
  const int entry = ng > 0 ? it - t.kv_head * ng : it;
  t.partial = ng > 0 ? -1 : reload_i32(p.item_partial, it);
  t.qo_tile = reload_i32(p.item_qo_tile, entry);
  t.req = reload_i32(p.item_req, entry);
  return t;
}

// ---- work ranges -----------------------------------------------------------------------------------------------
// [begin, end) of CTA c's own list, and of the pool (c = num_ctas).
template <class P> __device__ __forceinline__ int range_begin(const P& p, u32 c) { return arr<P>(p.work_indptr)[c]; }
template <class P> __device__ __forceinline__ int range_end(const P& p, u32 c) { return arr<P>(p.work_indptr)[c + 1]; }

// Take the next pool item of [lo, hi) (returns hi once the pool is dry). count[0] counts the items taken.
__device__ __forceinline__ int take_pool_item(int* count, int lo, int hi) {
  return lo < hi ? lo + atomicAdd(count, 1) : hi;
}

// A CTA that is done with the pool counts itself in count[1]; the last one returns both counters to 0 for the next
// launch (a CUDA graph replays the kernel as is). Every CTA calls this only after its last (failed) take, so no take
// of this launch follows the reset.
__device__ __forceinline__ void leave_pool(int* count, u32 num_ctas) {
  if (atomicAdd(count + 1, 1) == static_cast<int>(num_ctas) - 1) count[0] = 0, count[1] = 0;
}

}  // namespace plan
}  // namespace cuinfer
