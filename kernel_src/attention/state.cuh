// Attention states and their merge (paper §2.2): a state is (o, lse) for the keys a kernel saw, lse in base 2.
//   [o1, s1] (+) [o2, s2] = [(2^s1 o1 + 2^s2 o2) / (2^s1 + 2^s2), log2(2^s1 + 2^s2)]
// computed stably against the running maximum. An empty state has lse = -inf and merging it changes nothing;
// a row with no keys at all finishes as o = 0, lse = -inf (never NaN).
#pragma once
#include "common/types.cuh"

namespace cuinfer {

// Online accumulator for merging N-wide slices of several states into one.
// m: running max of the lse values seen, d: sum of 2^(lse - m), o: sum of 2^(lse - m) * o_s.
template <int N> struct MergeAcc {
  float o[N];
  float m;
  float d;

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = 0.f;
    m = neg_inf();
    d = 0.f;
  }

  // Fold in one state whose slice is x[0..N) with log-sum-exp s (base 2). -inf states are skipped exactly.
  __device__ __forceinline__ void add(const float (&x)[N], float s) {
    if (s == neg_inf()) return;
    float m_new = fmaxf(m, s);
    float scale_old = exp2f(m - m_new);  // m = -inf on the first state: exp2(-inf) = 0
    float w = exp2f(s - m_new);
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = o[i] * scale_old + w * x[i];
    d = d * scale_old + w;
    m = m_new;
  }

  // Final value of component i (0 for an all-empty merge) and the merged lse.
  __device__ __forceinline__ float value(int i) const { return d > 0.f ? o[i] / d : 0.f; }
  __device__ __forceinline__ float lse() const { return d > 0.f ? m + log2f(d) : neg_inf(); }
};

// Weights of S states given their lse values, two passes (max, then weights): used when all lse are known
// before the o slices are read, so the o loads of all states can be in flight at once.
__device__ __forceinline__ float merged_lse_from(float m, float d) { return d > 0.f ? m + log2f(d) : neg_inf(); }

}  // namespace cuinfer
