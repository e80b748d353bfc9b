// ALiBi: logit += slope_h * (j - qpos) with the standard slopes of num_qo_heads heads (p.alibi_pow2 = the largest
// power of two <= num_qo_heads): 2^(-8(h+1)/m) for h < m, then the odd slopes of the 2m sequence (FlashInfer's rule).
#pragma once
#include "variants/contract.cuh"

namespace cuinfer {
namespace variant {

struct Alibi : Identity {
  static constexpr bool kLogits = true;
  struct Row {
    float slope;
  };
  template <class P> __device__ __forceinline__ static Row row(const P& p, const Index& ix) {
    const int head = ix.qo_head;
    const float m = static_cast<float>(p.alibi_pow2);
    Row r;
    r.slope = exp2f(head < p.alibi_pow2 ? -8.f * (head + 1) / m : -4.f * (2 * (head - p.alibi_pow2) + 1) / m);
    return r;
  }
  template <class P>
  __device__ __forceinline__ static float logits(const P&, const Row& r, const Index& ix, int kv, float x) {
    return x + r.slope * static_cast<float>(kv - ix.qpos);
  }
};

}  // namespace variant
}  // namespace cuinfer
