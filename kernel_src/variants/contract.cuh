// The attention-variant contract: what a variant may change, and how several pieces compose into one.
//
// A variant is a type with static member functions (all __device__ __forceinline__, every one optional through the
// defaults of `Identity`). The attention kernels take it as a template parameter and call it at fixed points, so a new
// variant is a new type, never an edit of a kernel body. Python renders these types from a `cuinfer.Variant`'s CUDA
// snippets (cuinfer/variants/render.py): the built-ins (causal, sliding window, soft cap, ALiBi, custom mask, RoPE,
// Llama-3.1 RoPE, sinks, sigmoid) are written exactly as a user's variant is (cuinfer/variants/builtins/).
//
//   logits(v, ix, row, kv, x)       the logit of query row ix and key kv: x is the natural logit q·k·sm_scale (only
//                                   called when kLogits; otherwise the kernels fold sm_scale into a base-2 softmax);
//                                   row is the row's RowState
//   slope(v, ix, row)               a linear key bias (kSlope; ALiBi): the piece's logits() is x + slope · kv_dist,
//                                   so where every piece before it has no logits, the prefill kernel puts the bias
//                                   into the Q·K^T accumulators' initial values (one FFMA per logit; kFoldSlope,
//                                   slope_lead, logits_rest below) instead of running it per logit after the MMA
//   row_state(v, ix)                per-row state of query row ix (its token and query head) for logits(), computed
//                                   once per row outside the KV loop (kRowState; e.g. an ALiBi slope)
//   mask(v, ix, kv)                 false drops the key (only when kMask; applied on every tile)
//   key_range(v, ix, lo, hi)        narrows the keys query row ix may see to [lo, hi) (kUpperBound / kLowerBound:
//                                   causal, sliding window); kernels skip tiles outside every row's range and mask the
//                                   boundary tiles; the planner clips KV ranges by the same rules (planner/tiles.py)
//   dim_state(v, dim, head_dim)     per-thread state of one head dimension, computed once per kernel (e.g. a RoPE
//                                   frequency in double precision)
//   query_transform(v, s, ix, dim, x, partner)        q[dim] before q·k (kQueryTransform); partner is q[dim ± D/2]
//   pos_state(v, s, dim, pos)       the PosState of key position pos and dimension dim (kPosState): what the key
//                                   transform needs of (pos, dim) alone, e.g. RoPE's sin / cos; computed once per
//                                   (key, dimension pair) and handed to key_transform as kp
//   pos_advance(v, s, dim, kp, step)  kp (the PosState of pos) becomes that of pos + n, given step = pos_state(n)
//                                   (kPosAdvance; e.g. RoPE's angle addition): decode computes the PosState of each
//                                   thread's first key of a tile exactly and advances it to its further keys
//   key_transform(v, s, kp, ix, kv, dim, x, partner)  k[dim] of key kv before q·k (kKeyTransform); kp the PosState
//                                   of (kv, dim) (empty without kPosState)
//   value_transform(v, ix, kv, dim, x)                v[dim] of key kv before P·V (kValueTransform; ix has no query:
//                                                     qo_idx, qpos, qo_head are -1)
//   sink(v, ix)                     the row's sink logit (natural): a key of value 0 in the softmax denominator
//                                   (kSink), folded once per row where the row is finalised (see below)
//   output_transform(v, ix, dim, x, lse)              o[dim] of the finished row (normalised, v_scale applied), lse
//                                   its base-2 lse (kOutputTransform); applied only where a row is final
//   kScaled: logits_core(v, ix, row, kv, x), logits_scale(v), logits_inv_scale(v)
//                                   a piece with Variant.logits_scale (the soft cap): logits() is
//                                   c · logits_core(x / c) with |logits_core| <= 1, c = logits_scale(v) > 0 and
//                                   logits_inv_scale(v) = 1 / c; a chain whose only logits piece is such a piece is
//                                   kScaledLogits, and a kernel may fold c into its scales and bound the logits by c
//   kSoftmax = false                no softmax: logits() returns each key's weight w, o = Σ w v (not normalised), lse
//                                   = log2 Σ w; partial states merge by adding (decode's in-kernel merge; prefill
//                                   plans of such chains are never split)
//
// Sinks are exact under KV splitting because they are folded where a row's state is final, never per tile: the
// unsplit epilogues (decode finish_item, prefill store_rows / store_staged / epilogue_merge_warps), decode's in-kernel
// merge of split pieces (merge_split), and for prefill's split rows (merged by the generic merge kernel) the partial
// state of the row's first piece (item_partial == item_merge). A row without keys then ends as o = 0, lse = sink.
//
// `v` is the kernel's VariantParams (each piece reads its own member), `ix` the row's `Index`, `s` the DimState of
// `dim`. Logits are natural (base e): the kernels run the softmax in base 2 and multiply by log2(e) after logits(). A
// masked key gets -inf and never contributes; a row whose keys are all masked ends as o = 0, lse = -inf.
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace variant {

// Where one logit sits: the index information a variant may use.
struct Index {
  int batch;    // request
  int qo_idx;   // query token within the request
  int qpos;     // its kv position, qo_idx + kv_len - qo_len (bottom-right aligned)
  int qo_head;  // query head
  int kv_head;  // its KV head, qo_head / (num_qo_heads / num_kv_heads)
  int qo_len;    // query tokens of the request
  int kv_len;    // keys of the request
  int head_dim;  // (of q and k)
};

constexpr int kNoLowerBound = -2147483647;  // key_range()'s lo before any piece raises it

// The variant that changes nothing: plain softmax attention over every key. Pieces derive from it.
struct Identity {
  static constexpr bool kLogits = false;          // logits() is not the identity
  static constexpr bool kUpperBound = false;      // key_range() may lower hi
  static constexpr bool kLowerBound = false;      // key_range() may raise lo
  static constexpr bool kMask = false;            // mask() may drop keys anywhere (applied on every tile)
  static constexpr bool kQueryTransform = false;  // query_transform() is not the identity
  static constexpr bool kKeyTransform = false;    // key_transform() is not the identity
  static constexpr bool kSoftmax = true;          // false: logits() gives weights, summed without normalisation
  static constexpr bool kSink = false;            // sink() gives the row's sink logit
  static constexpr bool kValueTransform = false;  // value_transform() is not the identity
  static constexpr bool kOutputTransform = false;  // output_transform() is not the identity
  static constexpr bool kRowState = false;          // row_state() fills a RowState
  static constexpr bool kPosState = false;        // pos_state() gives key_transform() its PosState
  static constexpr bool kPosAdvance = false;      // pos_advance() moves a PosState on by a step's
  static constexpr bool kRisingLogits = false;    // logits() climb along the keys (ALiBi; Variant.rising_logits)
  static constexpr bool kSlope = false;           // logits() is x + slope() · kv_dist (a piece's; also kLogits)
  static constexpr bool kLeadSlope = false;       // (chains) slope pieces before any other logits: slope_lead()
  static constexpr bool kLogitsRest = false;      // (chains) logits beyond the leading slopes: logits_rest()
  static constexpr bool kScaled = false;          // logits() is c · logits_core(x / c), |logits_core| <= 1
  static constexpr int kLogitsPieces = 0;         // (chains) pieces with logits
  static constexpr bool kScaledLogits = false;    // (chains) the only logits piece is kScaled
  struct DimState {};
  struct RowState {};
  struct PosState {};
  template <class VP> __device__ __forceinline__ static DimState dim_state(const VP&, int, int) { return DimState{}; }
  template <class VP> __device__ __forceinline__ static RowState row_state(const VP&, const Index&) { return {}; }
  template <class VP>
  __device__ __forceinline__ static PosState pos_state(const VP&, const DimState&, int, int) {
    return PosState{};
  }
  template <class VP>
  __device__ __forceinline__ static void pos_advance(const VP&, const DimState&, int, PosState&, const PosState&) {}
  template <class VP>
  __device__ __forceinline__ static float logits(const VP&, const Index&, const RowState&, int, float, float x) {
    return x;
  }
  template <class VP>
  __device__ __forceinline__ static float logits_core(const VP&, const Index&, const RowState&, int, float, float x) {
    return x;
  }
  template <class VP> __device__ __forceinline__ static float logits_scale(const VP&) { return 1.f; }
  template <class VP> __device__ __forceinline__ static float logits_inv_scale(const VP&) { return 1.f; }
  template <class VP> __device__ __forceinline__ static float slope(const VP&, const Index&, const RowState&) {
    return 0.f;
  }
  template <class VP> __device__ __forceinline__ static float slope_lead(const VP&, const Index&, const RowState&) {
    return 0.f;
  }
  template <class VP>
  __device__ __forceinline__ static float logits_rest(const VP&, const Index&, const RowState&, int, float, float x) {
    return x;
  }
  template <class VP> __device__ __forceinline__ static bool mask(const VP&, const Index&, int) { return true; }
  template <class VP> __device__ __forceinline__ static void key_range(const VP&, const Index&, int&, int&) {}
  template <class VP>
  __device__ __forceinline__ static float query_transform(const VP&, const DimState&, const Index&, int, float x,
                                                          float) {
    return x;
  }
  template <class VP>
  __device__ __forceinline__ static float key_transform(const VP&, const DimState&, const PosState&, const Index&, int,
                                                        int, float x, float) {
    return x;
  }
  template <class VP> __device__ __forceinline__ static float sink(const VP&, const Index&) { return neg_inf(); }
  template <class VP>
  __device__ __forceinline__ static float value_transform(const VP&, const Index&, int, int, float x) {
    return x;
  }
  template <class VP>
  __device__ __forceinline__ static float output_transform(const VP&, const Index&, int, float x, float) {
    return x;
  }
};

template <bool B, class T, class F> struct PickState {
  using type = T;
};
template <class T, class F> struct PickState<false, T, F> {
  using type = F;
};

// Pieces applied in order: logits compose left to right, masks and key ranges intersect.
template <class... Pieces> struct Chain;

template <> struct Chain<> : Identity {};

template <class A, class... Rest> struct Chain<A, Rest...> {
  using Tail = Chain<Rest...>;
  static constexpr bool kLogits = A::kLogits || Tail::kLogits;
  static constexpr bool kUpperBound = A::kUpperBound || Tail::kUpperBound;
  static constexpr bool kLowerBound = A::kLowerBound || Tail::kLowerBound;
  static constexpr bool kMask = A::kMask || Tail::kMask;
  static constexpr bool kQueryTransform = A::kQueryTransform || Tail::kQueryTransform;
  static constexpr bool kKeyTransform = A::kKeyTransform || Tail::kKeyTransform;
  static constexpr bool kSoftmax = A::kSoftmax && Tail::kSoftmax;
  static constexpr bool kSink = A::kSink || Tail::kSink;  // (at most one piece has a sink: the renderer checks)
  static constexpr bool kValueTransform = A::kValueTransform || Tail::kValueTransform;
  static constexpr bool kOutputTransform = A::kOutputTransform || Tail::kOutputTransform;
  static constexpr bool kRowState = A::kRowState || Tail::kRowState;
  static constexpr bool kRisingLogits = A::kRisingLogits || Tail::kRisingLogits;
  // The leading slopes: slope pieces with no other logits piece before them (pieces without logits, e.g. causal,
  // may come between). Their biases add up (slope_lead); logits_rest runs the chain's logits without them.
  static constexpr bool kSkipsA = A::kSlope || !A::kLogits;  // A adds nothing to logits_rest
  static constexpr bool kLeadSlope = A::kSlope || (!A::kLogits && Tail::kLeadSlope);
  static constexpr bool kLogitsRest = kSkipsA ? Tail::kLogitsRest : true;
  // Scaled logits: the chain's only logits piece is kScaled, so the chain's logits are c · logits_core(x / c).
  static constexpr int kLogitsPieces = (A::kLogits ? 1 : 0) + Tail::kLogitsPieces;
  static constexpr bool kScaledLogits = kLogitsPieces == 1 && (A::kLogits ? A::kScaled : Tail::kScaledLogits);
  // At most one piece of a chain transforms (the renderer refuses two: rotations do not compose element by element),
  // so the chain's DimState and PosState are that piece's.
  static constexpr bool kHeadTransforms = A::kQueryTransform || A::kKeyTransform;
  static constexpr bool kPosState = kHeadTransforms ? A::kPosState : Tail::kPosState;
  static constexpr bool kPosAdvance = kHeadTransforms ? A::kPosAdvance : Tail::kPosAdvance;
  using DimState = typename PickState<kHeadTransforms, typename A::DimState, typename Tail::DimState>::type;
  using PosState = typename PickState<kHeadTransforms, typename A::PosState, typename Tail::PosState>::type;
  template <class VP> __device__ __forceinline__ static DimState dim_state(const VP& v, int dim, int head_dim) {
    if constexpr (kHeadTransforms) {
      return A::dim_state(v, dim, head_dim);
    } else {
      return Tail::dim_state(v, dim, head_dim);
    }
  }
  // Each piece's row state (empty for most: no registers once inlined).
  struct RowState {
    typename A::RowState a;
    typename Tail::RowState tail;
  };
  template <class VP> __device__ __forceinline__ static RowState row_state(const VP& v, const Index& ix) {
    if constexpr (A::kRowState || Tail::kRowState) {
      RowState r;
      if constexpr (A::kRowState) r.a = A::row_state(v, ix);
      if constexpr (Tail::kRowState) r.tail = Tail::row_state(v, ix);
      return r;
    } else {
      return RowState{};  // (nothing to set)
    }
  }
  template <class VP>
  __device__ __forceinline__ static PosState pos_state(const VP& v, const DimState& s, int dim, int pos) {
    if constexpr (kHeadTransforms) {
      return A::pos_state(v, s, dim, pos);
    } else {
      return Tail::pos_state(v, s, dim, pos);
    }
  }
  template <class VP>
  __device__ __forceinline__ static void pos_advance(const VP& v, const DimState& s, int dim, PosState& kp,
                                                     const PosState& step) {
    if constexpr (kHeadTransforms) {
      A::pos_advance(v, s, dim, kp, step);
    } else {
      Tail::pos_advance(v, s, dim, kp, step);
    }
  }
  template <class VP>
  __device__ __forceinline__ static float logits(const VP& v, const Index& ix, const RowState& row, int kv, float dist,
                                                float x) {
    if constexpr (A::kLogits) x = A::logits(v, ix, row.a, kv, dist, x);
    if constexpr (Tail::kLogits) x = Tail::logits(v, ix, row.tail, kv, dist, x);
    return x;
  }
  template <class VP>
  __device__ __forceinline__ static float logits_core(const VP& v, const Index& ix, const RowState& row, int kv,
                                                     float dist, float x) {
    static_assert(kScaledLogits, "logits_core is a chain's with scaled logits (kScaledLogits)");
    if constexpr (A::kLogits) {
      return A::logits_core(v, ix, row.a, kv, dist, x);
    } else {
      return Tail::logits_core(v, ix, row.tail, kv, dist, x);
    }
  }
  template <class VP> __device__ __forceinline__ static float logits_scale(const VP& v) {
    if constexpr (A::kLogits) {
      return A::logits_scale(v);
    } else {
      return Tail::logits_scale(v);
    }
  }
  template <class VP> __device__ __forceinline__ static float logits_inv_scale(const VP& v) {
    if constexpr (A::kLogits) {
      return A::logits_inv_scale(v);
    } else {
      return Tail::logits_inv_scale(v);
    }
  }
  template <class VP>
  __device__ __forceinline__ static float slope_lead(const VP& v, const Index& ix, const RowState& row) {
    float a = 0.f;
    if constexpr (A::kSlope) a = A::slope(v, ix, row.a);
    if constexpr (kSkipsA && Tail::kLeadSlope) a += Tail::slope_lead(v, ix, row.tail);
    return a;
  }
  template <class VP>
  __device__ __forceinline__ static float logits_rest(const VP& v, const Index& ix, const RowState& row, int kv,
                                                     float dist, float x) {
    if constexpr (kSkipsA) {
      return Tail::logits_rest(v, ix, row.tail, kv, dist, x);
    } else {
      return logits(v, ix, row, kv, dist, x);
    }
  }
  template <class VP> __device__ __forceinline__ static bool mask(const VP& v, const Index& ix, int kv) {
    bool keep = true;
    if constexpr (A::kMask) keep = A::mask(v, ix, kv);
    if constexpr (Tail::kMask) keep = keep && Tail::mask(v, ix, kv);
    return keep;
  }
  template <class VP> __device__ __forceinline__ static void key_range(const VP& v, const Index& ix, int& lo, int& hi) {
    if constexpr (A::kUpperBound || A::kLowerBound) A::key_range(v, ix, lo, hi);
    if constexpr (Tail::kUpperBound || Tail::kLowerBound) Tail::key_range(v, ix, lo, hi);
  }
  template <class VP>
  __device__ __forceinline__ static float query_transform(const VP& v, const DimState& s, const Index& ix, int dim,
                                                          float x, float partner) {
    if constexpr (A::kQueryTransform) {
      return A::query_transform(v, s, ix, dim, x, partner);
    } else {
      return Tail::query_transform(v, s, ix, dim, x, partner);
    }
  }
  template <class VP>
  __device__ __forceinline__ static float key_transform(const VP& v, const DimState& s, const PosState& kp,
                                                        const Index& ix, int kv, int dim, float x, float partner) {
    if constexpr (A::kKeyTransform) {
      return A::key_transform(v, s, kp, ix, kv, dim, x, partner);
    } else {
      return Tail::key_transform(v, s, kp, ix, kv, dim, x, partner);
    }
  }
  template <class VP> __device__ __forceinline__ static float sink(const VP& v, const Index& ix) {
    if constexpr (A::kSink) {
      return A::sink(v, ix);
    } else {
      return Tail::sink(v, ix);
    }
  }
  // Value and output transforms compose in chain order.
  template <class VP>
  __device__ __forceinline__ static float value_transform(const VP& v, const Index& ix, int kv, int dim, float x) {
    if constexpr (A::kValueTransform) x = A::value_transform(v, ix, kv, dim, x);
    if constexpr (Tail::kValueTransform) x = Tail::value_transform(v, ix, kv, dim, x);
    return x;
  }
  template <class VP>
  __device__ __forceinline__ static float output_transform(const VP& v, const Index& ix, int dim, float x, float lse) {
    if constexpr (A::kOutputTransform) x = A::output_transform(v, ix, dim, x, lse);
    if constexpr (Tail::kOutputTransform) x = Tail::output_transform(v, ix, dim, x, lse);
    return x;
  }
};

// The row's sink logit in base 2 (the kernels' softmax units), -inf without a sink.
template <class V, class VP> __device__ __forceinline__ float sink_log2(const VP& v, const Index& ix) {
  if constexpr (V::kSink) {
    return V::sink(v, ix) * kLog2e;
  } else {
    return neg_inf();
  }
}

// A kernel that folds the leading slopes' bias into Q·K^T (prefill) runs logits_rest on the tiles, and only when
// kTileLogits; chains without softmax keep logits() whole (their weights are what logits() returns).
template <class V> constexpr bool kFoldSlope = V::kLeadSlope && V::kSoftmax;
template <class V> constexpr bool kTileLogits = kFoldSlope<V> ? V::kLogitsRest : V::kLogits;

}  // namespace variant
}  // namespace cuinfer
