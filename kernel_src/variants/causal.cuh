// Causal attention, bottom-right aligned: the query at kv position qpos sees keys j <= qpos.
#pragma once
#include "variants/contract.cuh"

namespace cuinfer {
namespace variant {

struct Causal : Identity {
  static constexpr bool kUpperBound = true;
  template <class P> __device__ __forceinline__ static void key_range(const P&, int qpos, int&, int& hi) {
    hi = min(qpos + 1, hi);
  }
};

}  // namespace variant
}  // namespace cuinfer
