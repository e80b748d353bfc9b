// The variant's q / k transforms (RoPE) in the prefill kernel: Q rows and each K tile are transformed in shared
// memory after they land, between two barriers (variants/apply.cuh holds the tile walk shared with decode). Each
// thread's DimStates (its 8 dimension pairs, e.g. RoPE frequencies in double precision) are computed once per kernel
// and kept in shared memory (Traits::kStatesOff), since the accumulators take every register.
#pragma once
#include "attention/prefill_sm80/cta.cuh"
#include "common/math.cuh"
#include "variants/apply.cuh"

namespace cuinfer {
namespace prefill {

template <class C> __device__ __forceinline__ typename C::Variant::DimState* dim_states(const Cta<C>& c) {
  return reinterpret_cast<typename C::Variant::DimState*>(c.smem + C::kStatesOff) + c.tid * 8;
}

// Once per kernel, before the first barrier: this thread's DimStates of pairs 8c .. 8c+7, c = tid % (D/16).
template <class C, class VP> __device__ __forceinline__ void init_dim_states(const VP& v, const Cta<C>& c) {
  using V = typename C::Variant;
  typename V::DimState s[8];
  variant::pair_states<V, C::kHeadDimQK>(v, c.tid % (C::kHeadDimQK / 16), s);
  typename V::DimState* dst = dim_states(c);
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[i] = s[i];
}

// After the barrier that lands the tile at key0 in buffer `stage` (and, at an item's first tile, its Q): transform
// the item's valid Q rows (first tile) and the tile's valid K rows. The caller synchronises afterwards.
template <class C, class P, class VP>
__device__ __forceinline__ void transform_tile(const P& p, const VP& v, const Cta<C>& c, int stage, int key0,
                                               int kv_end, bool first) {
  using V = typename C::Variant;
  using T = typename C::DTypeKV;
  constexpr int D = C::kHeadDimQK, kHalf = D / 16, NT = C::kThreads;
  typename V::DimState s[8];
  const typename V::DimState* src = dim_states(c);
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = src[i];
  const int b = c.info[kIReq], kvh = c.info[kIKvHead], kv_len = c.info[kIKvLen], q_shift = c.info[kIQShift];
  const int qo_len = kv_len - q_shift;
  if constexpr (V::kQueryTransform) {
    if (first) {
      const int g = p.group_size, row0 = c.info[kIRow0];
      const int rows = min(C::kTileQ, qo_len * g - row0);
      using TQ = typename C::DTypeQ;
      TQ* q_tile = reinterpret_cast<TQ*>(c.smem);
      const int pc = c.tid % kHalf;
      for (int r = c.tid / kHalf; r < rows; r += NT / kHalf) {
        const int pr = row0 + r;
        const int token = static_cast<int>(fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
        const variant::Index ix{b, token, token + q_shift, kvh * g + (pr - token * g), kvh, qo_len, kv_len, D};
        TQ* lo_p = q_tile + Swizzle<D / 8>::slot(r, pc) * 8;
        TQ* hi_p = q_tile + Swizzle<D / 8>::slot(r, pc + kHalf) * 8;
        Vec<TQ, 8> lo, hi;
        lo.load(lo_p);
        hi.load(hi_p);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float x = to_float(lo[i]), y = to_float(hi[i]);
          lo[i] = from_float<TQ>(V::query_transform(v, s[i], ix, 8 * pc + i, x, y));
          hi[i] = from_float<TQ>(V::query_transform(v, s[i], ix, 8 * pc + i + D / 2, y, x));
        }
        lo.store(lo_p);
        hi.store(hi_p);
      }
    }
  }
  if constexpr (V::kKeyTransform) {
    const variant::Index ix{b, -1, -1, -1, kvh, qo_len, kv_len, D};  // (a key's transform sees its kv_idx)
    T* k_tile = reinterpret_cast<T*>(c.smem + C::kKOff + stage * C::kKBytes);
    variant::key_transform_tile<V, D, NT>(v, ix, k_tile, key0, min(C::kTileKV, kv_end - key0), s, c.tid);
  }
}

// After the barrier that lands the V tile at key0 in buffer `stage`: the variant's value transform on its valid rows.
// The caller synchronises afterwards.
template <class C, class VP>
__device__ __forceinline__ void transform_values(const VP& v, const Cta<C>& c, int stage, int key0, int kv_end) {
  using T = typename C::DTypeKV;
  const int kv_len = c.info[kIKvLen], q_shift = c.info[kIQShift];
  const variant::Index ix{c.info[kIReq], -1, -1, -1, c.info[kIKvHead], kv_len - q_shift, kv_len, C::kHeadDimQK};
  T* v_tile = reinterpret_cast<T*>(c.smem + C::kVOff + stage * C::kVBytes);
  variant::value_transform_tile<typename C::Variant, C::kHeadDimVO, C::kThreads>(
      v, ix, v_tile, key0, min(C::kTileKV, kv_end - key0), c.tid);
}

}  // namespace prefill
}  // namespace cuinfer
