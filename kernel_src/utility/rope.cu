// Rotary position embedding of q [nnz, Hq, D] and k [nnz, Hk, D] (rows strided, last dim contiguous), written to
// q_out / k_out (new arrays, or q / k themselves in place). Dimension pair i < R/2 (R = rotary_dim) is
// (i, i + R/2) (rotate-half, "neox") or (2i, 2i + 1) (interleave); it turns by pos * freq_i, and dims >= R are copied
// unchanged. The math is fp32 and each output is rounded once to T.
//
// Angles: either computed, freq_i = theta^(-2i/R) in double, scaled as Llama 3.1 does (freq * (1 - s) / rope_scale +
// freq * s, s = clamp(freq * smooth_a + smooth_b, 0, 1); plain RoPE is smooth_a = smooth_b = 0), carried as hi + lo
// floats and range-reduced per token (fmath::rope_sincos: accurate for positions up to 2^24); or read from a
// cos_sin_cache [max_pos, R] float32 (cos of pair i at column i, its sin at R/2 + i; vLLM / SGLang). A position
// outside [0, max_pos) gives NaN in the token's rotary dims (never an out-of-bounds read).
//
// Positions: pos_ids (int32 or int64) per token, or ragged: token t of request b (indptr[b] <= t < indptr[b+1]) is
// at offsets[b] + t - indptr[b].
//
// Layout: threadIdx.x is a unit of the row, fixed for the thread (its frequencies stay in registers): a rotary unit
// is kVec pairs (neox: the chunks at columns c and c + R/2; interleave: one chunk of kVec / 2 pairs), a pass-through
// unit one chunk at column >= R (not launched in place). threadIdx.y and blockIdx.x stride over tokens; blockIdx.y is
// a group of heads (q heads then k heads), so small batches still fill the GPU. The sines and cosines of a token
// serve every head of the group; kHeads heads' loads (8 chunks) are in flight before their stores.
// The parameter struct RopeParams comes from the generated preamble.
#include "common/math.cuh"
#include "utility/io.cuh"

namespace cuinfer {
namespace rope {

constexpr int kThreads = 256;
// heads whose chunks are loaded before the first store: 8 chunks of a thread in flight either way
template <bool kInterleave> constexpr int kHeads = kInterleave ? 8 : 4;
enum PosKind { kPosInt32 = 0, kPosInt64 = 1, kPosRagged = 2 };

// Frequency of pair i, in double, split into hi + lo floats (see fmath::rope_freq).
__device__ __forceinline__ fmath::RopeFreq pair_freq(const RopeParams& p, int i) {
  const double f = ::exp2(-2.0 * double(i) / double(p.rotary_dim) * p.log2_theta);
  const double s = fmin(1.0, fmax(0.0, f * p.smooth_a + p.smooth_b));
  const double g = (1.0 - s) * (f * p.rcp_scale) + s * f;
  fmath::RopeFreq r;
  r.hi = float(g);
  r.lo = float(g - double(r.hi));
  return r;
}

__device__ __forceinline__ long long position(const RopeParams& p, int t) {
  if (p.pos_kind == kPosInt32) return __ldg(static_cast<const int*>(p.pos) + t);
  if (p.pos_kind == kPosInt64) return __ldg(static_cast<const long long*>(p.pos) + t);
  // ragged: the last request b in [0, batch) with indptr[b] <= t (empty requests before it are passed over)
  const int* indptr = static_cast<const int*>(p.indptr);
  int lo = 0, hi = p.batch_size;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (__ldg(indptr + mid) <= t) lo = mid;
    else hi = mid;
  }
  return static_cast<long long>(__ldg(static_cast<const int*>(p.offsets) + lo)) + t - __ldg(indptr + lo);
}

template <int kPairs> struct Angles {
  float cs[kPairs], sn[kPairs];
};

// The cosines and sines of this thread's pairs (first pair `pair0`) at token t.
template <int kPairs>
__device__ __forceinline__ void token_angles(const RopeParams& p, int t, int pair0, const fmath::RopeFreq (&f)[kPairs],
                                             Angles<kPairs>& a) {
  const long long pos = position(p, t);
  if (p.table == nullptr) {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) fmath::rope_sincos(static_cast<int>(pos), f[j], a.sn[j], a.cs[j]);
    return;
  }
  const bool inside = pos >= 0 && pos < p.max_pos;
  const float* row = static_cast<const float*>(p.table) + (inside ? pos : 0) * p.table_s0 + pair0;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    a.cs[j] = inside ? __ldg(row + j) : quiet_nan();
    a.sn[j] = inside ? __ldg(row + p.rotary_dim / 2 + j) : quiet_nan();
  }
}

// One head's unit: x (column c0) and, for a neox rotary unit, y (column c0 + R/2).
template <typename T, int kVec, bool kInterleave> struct Unit {
  using C = util::Chunk<T, kVec>;
  static constexpr int kPairs = kInterleave ? kVec / 2 : kVec;
  static constexpr bool kTwo = !kInterleave;
  C x, y;

  __device__ __forceinline__ void rotate(const Angles<kPairs>& a) {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      if constexpr (kInterleave) {
        turn(x[2 * j], x[2 * j + 1], a.cs[j], a.sn[j]);
      } else {
        turn(x[j], y[j], a.cs[j], a.sn[j]);
      }
    }
  }

  __device__ __forceinline__ static void turn(T& e1, T& e2, float c, float s) {
    const float x1 = to_float(e1), x2 = to_float(e2);
    e1 = from_float<T>(x1 * c - x2 * s);
    e2 = from_float<T>(x2 * c + x1 * s);
  }
};

template <typename T> struct Row {
  const T* in;
  T* out;
};

// Head hh of token t: a q head (hh < Hq) or a k head, element 0 of its input and output rows.
template <typename T> __device__ __forceinline__ Row<T> row_of(const RopeParams& p, int t, int hh) {
  const bool is_q = hh < p.num_q_heads;
  const i64 h = is_q ? hh : hh - p.num_q_heads;
  const i64 in = t * (is_q ? p.q_s0 : p.k_s0) + h * (is_q ? p.q_s1 : p.k_s1);
  const i64 out = t * (is_q ? p.qo_s0 : p.ko_s0) + h * (is_q ? p.qo_s1 : p.ko_s1);
  return {static_cast<const T*>(is_q ? p.q : p.k) + in, static_cast<T*>(is_q ? p.q_out : p.k_out) + out};
}

template <typename T, int kVec, bool kInterleave>
__global__ void __launch_bounds__(kThreads, 2) apply_rope(const __grid_constant__ RopeParams p) {
  using U = Unit<T, kVec, kInterleave>;
  constexpr int kPairs = U::kPairs;
  constexpr int kHeads = rope::kHeads<kInterleave>;
  const int u = threadIdx.x;
  const bool rot = u < p.rot_units;
  // columns of the unit: c0, and c0 + R/2 for a neox rotary unit
  const int c0 = rot ? u * kVec : p.rotary_dim + (u - p.rot_units) * kVec;
  const int c1 = c0 + p.rotary_dim / 2;
  const int pair0 = kInterleave ? c0 / 2 : c0;
  fmath::RopeFreq f[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) f[j] = rot && p.table == nullptr ? pair_freq(p, pair0 + j) : fmath::RopeFreq{0.f, 0.f};
  const int heads = p.num_q_heads + p.num_k_heads;
  const int h_begin = blockIdx.y * p.heads_per_group;
  const int h_end = min(h_begin + p.heads_per_group, heads);
  for (int t = blockIdx.x * blockDim.y + threadIdx.y; t < p.nnz; t += gridDim.x * blockDim.y) {
    Angles<kPairs> a;
    if (rot) token_angles(p, t, pair0, f, a);
    for (int h0 = h_begin; h0 < h_end; h0 += kHeads) {
      U x[kHeads];
      Row<T> r[kHeads];
#pragma unroll
      for (int i = 0; i < kHeads; ++i) {
        if (h0 + i >= h_end) continue;
        r[i] = row_of<T>(p, t, h0 + i);
        x[i].x.load(r[i].in + c0);
        if (U::kTwo && rot) x[i].y.load(r[i].in + c1);
      }
#pragma unroll
      for (int i = 0; i < kHeads; ++i) {
        if (h0 + i >= h_end) continue;
        if (rot) x[i].rotate(a);
        x[i].x.store(r[i].out + c0);
        if (U::kTwo && rot) x[i].y.store(r[i].out + c1);
      }
    }
  }
}

}  // namespace rope
}  // namespace cuinfer
