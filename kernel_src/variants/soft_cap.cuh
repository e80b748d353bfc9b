// Logits soft cap: logit = cap * tanh(logit / cap) (p.soft_cap = cap > 0, p.inv_soft_cap = 1 / cap).
#pragma once
#include "common/math.cuh"
#include "variants/contract.cuh"

namespace cuinfer {
namespace variant {

struct SoftCap : Identity {
  static constexpr bool kLogits = true;
  template <class P>
  __device__ __forceinline__ static float logits(const P& p, const Row&, const Index&, int, float x) {
    return p.soft_cap * fmath::tanh_approx(x * p.inv_soft_cap);
  }
};

}  // namespace variant
}  // namespace cuinfer
