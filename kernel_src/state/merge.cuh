// Attention states and their merge (paper §2.2): a state is (o, lse) for the keys a kernel saw, lse in base 2:
//   [o1, s1] (+) [o2, s2] = [(2^s1 o1 + 2^s2 o2) / (2^s1 + 2^s2), log2(2^s1 + 2^s2)]
// computed stably against a reference max. An empty state has lse = -inf: its weight is exactly 0 and its o is never
// read (callers test the weight before loading), so merging it changes nothing; a row with no keys at all finishes as
// o = 0, lse = -inf (never NaN).
//
// The same operator merges unnormalised states inside a kernel: (m, d, o~) with o~ = Σ 2^(x_j - m) v_j and
// d = Σ 2^(x_j - m) is the state (o~ / d, m + log2 d). So one accumulator serves every merge of the project: the merge
// kernels (attention/merge.cu), the decode kernels' split merge and per-warp merge (attention/decode/math.cuh) and the
// prefill epilogue's per-warp merge (attention/prefill_sm80/epilogue.cuh). 2^x, 1/d and log2 d take the MUFU forms
// (common/math.cuh): weights below 2^-126 flush to 0, far under any output's resolution.
#pragma once
#include "common/math.cuh"
#include "common/types.cuh"

namespace cuinfer {
namespace state {

// The reference of a running max m: m itself, or 0 while every state seen is empty (so exp2 never sees -inf - -inf).
__device__ __forceinline__ float ref_of(float m) { return m == neg_inf() ? 0.f : m; }
// 1 / d, or 0 for an empty merge.
__device__ __forceinline__ float inv_of(float d) { return d > 0.f ? fmath::rcp(d) : 0.f; }
// The merged lse of weights summing to d against the max m; -inf for an empty merge.
__device__ __forceinline__ float lse_of(float m, float d) { return d > 0.f ? m + fmath::lg2(d) : neg_inf(); }

// An attention sink joins a row's unnormalised state (reference max m, weight sum d, both base 2): a key of logit
// `sink` (base 2) and value 0, i.e. the merge with the state (o = 0, lse = sink). Returns the factor that normalises
// the row's o~ (0 for an empty merge) and sets lse. With m = -inf (no key) o = 0 and lse = sink; with sink = -inf
// this is 1 / d and lse_of(m, d).
__device__ __forceinline__ float fold_sink(float m, float d, float sink, float& lse) {
  const float ref = ref_of(fmaxf(m, sink));
  const float s = fmath::ex2(m - ref);  // 0 for m = -inf
  const float d2 = d * s + fmath::ex2(sink - ref);
  lse = lse_of(ref, d2);
  return d2 > 0.f ? s * fmath::rcp(d2) : 0.f;
}

// Accumulates N components of several states: acc = Σ w_s o_s, d = Σ w_s d_s, with w_s = 2^(m_s - ref_of(m)).
// Two-pass form: init with the max of every state to come, then add each (all weights known before any o is read,
// so the loads of all states can be in flight at once). Online form: init(-inf), rescale to each new max, add.
template <int N> struct Merger {
  float acc[N];
  float m;  // reference max
  float d;  // sum of the weights (times each state's own d)

  __device__ __forceinline__ void init(float m0) {
    m = m0;
    d = 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.f;
  }
  // The weight of a state with max (or lse) m_s; 0 for an empty one (m_s = -inf), whose o must not be read.
  __device__ __forceinline__ float weight(float m_s) const { return fmath::ex2(m_s - ref_of(m)); }
  // Fold in a state of weight w (weight()), sum d_s (1 for a normalised state) and components x.
  __device__ __forceinline__ void add(float w, float d_s, const float (&x)[N]) {
    d += w * d_s;
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] += w * x[i];
  }
  // Move the reference to m_new >= m (online form): acc and d are rescaled by 2^(m - m_new).
  __device__ __forceinline__ void rescale(float m_new) {
    const float s = fmath::ex2(m - ref_of(m_new));
    d *= s;
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] *= s;
    m = m_new;
  }
  // Fold in a state of lse `s` and o = 0 (an attention sink, fold_sink): the weight sum grows, acc does not.
  __device__ __forceinline__ void add_sink(float s) {
    if (s > m) rescale(s);
    d += weight(s);  // 0 for s = -inf
  }
  // No softmax (kSoftmax = false): states are sums, merged with weight 1 (init(0.f), add(1.f, 2^lse_s, o_s));
  // acc stays the sum and the lse is log2 of the weight sum.
  __device__ __forceinline__ float finish_sum() const { return lse_of(0.f, d); }
  // Normalise in place (o = 0 for an empty merge) and return the merged lse.
  __device__ __forceinline__ float finish() {
    const float inv = inv_of(d);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] *= inv;
    return lse_of(m, d);
  }
};

}  // namespace state
}  // namespace cuinfer
