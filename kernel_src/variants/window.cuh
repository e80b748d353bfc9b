// Sliding window: the query at kv position qpos keeps keys j >= qpos - window_left (p.window_left >= 0).
#pragma once
#include "variants/contract.cuh"

namespace cuinfer {
namespace variant {

struct Window : Identity {
  static constexpr bool kLowerBound = true;
  template <class P> __device__ __forceinline__ static void key_range(const P& p, int qpos, int& lo, int&) {
    lo = max(lo, qpos - p.window_left);
  }
};

}  // namespace variant
}  // namespace cuinfer
