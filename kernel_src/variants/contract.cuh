// The attention-variant contract: what a variant may change, and how several pieces compose into one.
//
// A variant is a type with static member functions (all __device__ __forceinline__, all optional through the
// defaults of `Identity`); the attention kernels take it as a template parameter and call it at fixed points, so a
// new variant is a new type, never an edit of a kernel body:
//
//   row(p, ix) -> Row            once per query row and KV tile (or per decode item): per-row state, e.g. an ALiBi
//                                slope or where the row's bits of a custom mask start
//   logits(p, row, ix, kv, x)    the logit of query row ix and key kv: x is the natural logit q·k·sm_scale (only
//                                called when kLogits; otherwise the kernel folds sm_scale into its base-2 softmax)
//   mask(p, row, ix, kv)         false drops the key (only called when kMask; on every tile)
//   key_range(p, qpos, lo, hi)   narrows the keys a query at kv position qpos may see to [lo, hi) (causal, sliding
//                                window); kernels skip tiles outside every row's range, mask the boundary tiles, and
//                                the planner clips KV ranges by the same rules (planner/tiles.py)
//
// `p` is the kernel's parameter struct (every variant reads its own fields of it), `ix` the row's `Index`. Logits are
// natural (base e); the kernels run the softmax in base 2 and multiply by log2(e) after logits(). A masked key gets
// -inf and never contributes; a row whose keys are all masked ends as o = 0, lse = -inf.
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace variant {

// Where one logit sits (the index information a variant may use).
struct Index {
  int batch;    // request
  int qo_idx;   // query token within the request
  int qpos;     // its kv position, qo_idx + kv_len - qo_len (bottom-right aligned)
  int qo_head;  // query head
  int kv_head;  // its KV head, qo_head / (num_qo_heads / num_kv_heads)
  int kv_len;   // keys of the request
};

constexpr int kNoLowerBound = -2147483647;  // key_range()'s lo before any piece raises it

// The variant that changes nothing: plain softmax attention over every key. Pieces derive from it.
struct Identity {
  static constexpr bool kLogits = false;      // logits() is not the identity
  static constexpr bool kUpperBound = false;  // key_range() may lower hi
  static constexpr bool kLowerBound = false;  // key_range() may raise lo
  static constexpr bool kMask = false;        // mask() may drop keys anywhere (applied on every tile)
  struct Row {};
  template <class P> __device__ __forceinline__ static Row row(const P&, const Index&) { return Row{}; }
  template <class P>
  __device__ __forceinline__ static float logits(const P&, const Row&, const Index&, int, float x) {
    return x;
  }
  template <class P> __device__ __forceinline__ static bool mask(const P&, const Row&, const Index&, int) {
    return true;
  }
  template <class P> __device__ __forceinline__ static void key_range(const P&, int, int&, int&) {}
};

// Pieces applied in order: logits transforms compose left to right, masks and key ranges intersect.
template <class... Pieces> struct Chain;

template <> struct Chain<> : Identity {};

template <class A, class... Rest> struct Chain<A, Rest...> {
  using Tail = Chain<Rest...>;
  static constexpr bool kLogits = A::kLogits || Tail::kLogits;
  static constexpr bool kUpperBound = A::kUpperBound || Tail::kUpperBound;
  static constexpr bool kLowerBound = A::kLowerBound || Tail::kLowerBound;
  static constexpr bool kMask = A::kMask || Tail::kMask;
  struct Row {
    typename A::Row head;
    typename Tail::Row tail;
  };
  template <class P> __device__ __forceinline__ static Row row(const P& p, const Index& ix) {
    Row r;
    if constexpr (A::kLogits || A::kMask) r.head = A::row(p, ix);
    if constexpr (Tail::kLogits || Tail::kMask) r.tail = Tail::row(p, ix);
    return r;
  }
  template <class P>
  __device__ __forceinline__ static float logits(const P& p, const Row& r, const Index& ix, int kv, float x) {
    if constexpr (A::kLogits) x = A::logits(p, r.head, ix, kv, x);
    if constexpr (Tail::kLogits) x = Tail::logits(p, r.tail, ix, kv, x);
    return x;
  }
  template <class P> __device__ __forceinline__ static bool mask(const P& p, const Row& r, const Index& ix, int kv) {
    bool keep = true;
    if constexpr (A::kMask) keep = A::mask(p, r.head, ix, kv);
    if constexpr (Tail::kMask) keep = keep && Tail::mask(p, r.tail, ix, kv);
    return keep;
  }
  template <class P> __device__ __forceinline__ static void key_range(const P& p, int qpos, int& lo, int& hi) {
    if constexpr (A::kUpperBound || A::kLowerBound) A::key_range(p, qpos, lo, hi);
    if constexpr (Tail::kUpperBound || Tail::kLowerBound) Tail::key_range(p, qpos, lo, hi);
  }
};

}  // namespace variant
}  // namespace cuinfer
