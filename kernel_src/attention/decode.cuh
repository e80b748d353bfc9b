// Batch decode on a paged KV cache: one query token per request, persistent CTAs driven by a work plan.
//
// Two kernels share one memory pipeline (attention/decode_pipeline.cuh) and differ only in the math:
//   batch_decode_cuda_core   thread (tx, ty, tz): tx owns 8 dims of the head, ty one query head of the GQA group,
//                            tz a slice of the tile's tokens; q·k is reduced over the D/8 tx lanes with shuffles.
//   batch_decode_tensor_core head-group fusion (paper appendix A): the g query heads of one KV head are the rows of a
//                            16-row query tile, Q·K^T and P·V run on mma.sync m16n8k16 with fp32 accumulators; warp w
//                            owns tokens 16w..16w+15 of each tile (and, for head dim 256, half of the output dims).
// Either way one CTA handles all query heads of a KV head, so every KV tile is read from memory once for the group.
//
// The plan (docs/internals.md) gives CTA c the work items work_indptr[c]..work_indptr[c+1]; an item is one request,
// one KV head (all its query heads: the decode query tile) and one KV range [start, end). The CTA walks the
// concatenation of its items' tiles (T tokens each; an empty item still has one, all-masked, tile) as a single
// stream, so the pipeline never drains at item boundaries:
//
//   iteration n:  wait for tile n (cp.async group), __syncthreads
//                 issue the cp.async copies of tile n+S-1 (offsets resolved one iteration earlier)
//                 resolve tile n+S: item bookkeeping, then the page index of each of its tokens (a global load whose
//                 latency hides behind the math; the 64-bit element offsets are stored after the math)
//                 math on tile n; at the item's last tile, merge the per-warp states and write o/lse
//
// Tile descriptors live in a ring of S+1 slots: slot n+S is written while slot n (math) and slot n+S-1 (copies) are
// read, and a slot is rewritten only after the barrier that follows its last read. Resolving offsets per token makes
// any page size (1 included), NHD and HND, a 5-D cache or separate k/v caches all one code path: the token's page and
// slot pick the offset through the caller's strides. Empty trailing tiles are zero-filled by cp.async, so masked
// tokens see K = V = 0 (never stale NaN) and p = 2^-inf = 0.
//
// Softmax runs in base 2 in fp32: logits are pre-scaled by sm_scale·log2(e), lse is log2-sum-exp (API.md). States of
// the warps (tensor cores) or token slices (CUDA cores) of one item are merged through the item's last KV stage, which
// is free until the next iteration's barrier: 4 bytes x rows x D per slice is exactly the stage's K+V bytes when the
// slices are 16 rows (tensor cores) or when g <= tokens per slice (CUDA cores).
//
// kMinBlocks (__launch_bounds__) caps the registers so that the CTAs the shared memory allows per SM (the policy's
// count, which sizes the persistent grid) are also allowed by the register file.
//
// Compile-time options: sm_scale and the logits soft cap (values in DecodeParams, soft cap on/off as kSoftCap), the
// sliding window (kWindow: the item's start is clamped to kv_len-1-window_left), positional encoding (kPos: none,
// rope_llama applied in the kernel to q at kv_len-1 and to each K tile in shared memory, alibi), writing lse (kLse).
// DecodeParams (the by-value parameter struct) comes from the generated preamble (cuinfer/decode_specs.py).
#pragma once
#include "attention/decode_pipeline.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"

namespace cuinfer {
namespace decode {

// ---- shared pieces of the math -------------------------------------------------------------------------------------

template <typename T> __device__ __forceinline__ void zero_vec(Vec<T, 16 / sizeof(T)>& v) {
  *reinterpret_cast<uint4*>(v.v) = make_uint4(0u, 0u, 0u, 0u);
}

// RoPE (rotate-half) on the K rows of a landed tile, in shared memory: row r is kv position start + r. Thread pair
// chunk c (dims 8c..8c+7 with their partners D/2 + 8c..) is fixed per thread, so its frequencies are precomputed.
template <typename KV, int D, int kThreads>
__device__ __forceinline__ void rope_k_tile(KV* ks, int start, int n_valid, const fmath::RopeFreq (&f)[8]) {
  constexpr int kChunks = D / 8;
  constexpr int kHalf = kChunks / 2;
  static_assert(kThreads % kHalf == 0, "threads cover whole half rows");
  const int c = threadIdx.x % kHalf;
  for (int r = threadIdx.x / kHalf; r < n_valid; r += kThreads / kHalf) {
    KV* lo_p = ks + Swizzle<kChunks>::slot(r, c) * 8;
    KV* hi_p = ks + Swizzle<kChunks>::slot(r, c + kHalf) * 8;
    Vec<KV, 8> lo, hi;
    lo.load(lo_p);
    hi.load(hi_p);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float sn, cs;
      fmath::rope_sincos(start + r, f[i], sn, cs);
      const float x = to_float(lo[i]), y = to_float(hi[i]);
      lo[i] = from_float<KV>(x * cs - y * sn);
      hi[i] = from_float<KV>(y * cs + x * sn);
    }
    lo.store(lo_p);
    hi.store(hi_p);
  }
}

template <int D>
__device__ __forceinline__ void rope_k_freqs(const DecodeParams& p, int kThreadsHalfIdx, fmath::RopeFreq (&f)[8]) {
  const double log2_theta = __longlong_as_double(p.rope_log2_theta_bits);
  const double rcp_scale = __longlong_as_double(p.rope_rcp_scale_bits);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = fmath::rope_freq(kThreadsHalfIdx * 8 + i, D, log2_theta, rcp_scale);
}

// Rotate one 8-dim chunk of q (dims 8c..8c+7) given the partner chunk (dims 8c ± D/2) at position pos.
template <int D> __device__ __forceinline__ void rope_q_chunk(const DecodeParams& p, int c, int pos, float (&x)[8],
                                                              const float (&partner)[8]) {
  constexpr int kHalf = D / 16;
  const double log2_theta = __longlong_as_double(p.rope_log2_theta_bits);
  const double rcp_scale = __longlong_as_double(p.rope_rcp_scale_bits);
  const bool low = c < kHalf;
  const int pair0 = (low ? c : c - kHalf) * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float sn, cs;
    fmath::rope_sincos(pos, fmath::rope_freq(pair0 + i, D, log2_theta, rcp_scale), sn, cs);
    x[i] = low ? x[i] * cs - partner[i] * sn : x[i] * cs + partner[i] * sn;
  }
}

// Final logit (base 2) of raw q·k for key position j; masked keys get -inf.
template <bool kSoftCap, int kPos>
__device__ __forceinline__ float logit(const DecodeParams& p, float raw, float slope, int j, int qpos, bool keep) {
  float t = raw * p.logits_scale;
  if constexpr (kPos == kPosAlibi) t += slope * float(j - qpos);
  if constexpr (kSoftCap) t = p.cap_log2 * fmath::tanh(t * p.rcp_cap);
  return keep ? t : neg_inf();
}

// ALiBi slope of a query head in the units of logit(): log2(e)-scaled unless the soft cap rescales afterwards.
template <bool kSoftCap> __device__ __forceinline__ float alibi_slope_scaled(int head, int num_heads) {
  return fmath::alibi_slope(head, num_heads) * (kSoftCap ? 1.f : kLog2e);
}

// Write 8 dims [dim0, dim0+8) of one output row: straight to o (and lse) for an unsplit item, or as an fp32 partial
// row of the workspace for a split one. `x` is already normalised (v_scale is applied here); `lead` is the one thread
// that writes the lse.
template <typename O, int D, bool kLse>
__device__ __forceinline__ void store_row(const DecodeParams& p, int req, int qo_head, int prow, int dim0,
                                          const float (&x)[8], float lse, bool lead) {
  if (prow < 0) {
    Vec<O, 8> v;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = from_float<O>(x[i] * p.v_scale);
    v.store_global(reinterpret_cast<O*>(p.o) + i64(req) * p.o_stride_b + i64(qo_head) * p.o_stride_h + dim0);
    if constexpr (kLse) {
      if (lead) reinterpret_cast<float*>(p.lse)[i64(req) * p.lse_stride_b + i64(qo_head) * p.lse_stride_h] = lse;
    }
  } else {
    // v_scale is linear, so scaling each partial scales the merged row.
    float* dst = reinterpret_cast<float*>(p.partial_o) + i64(prow) * D + dim0;
    const float vs = p.v_scale;
    *reinterpret_cast<float4*>(dst) = make_float4(x[0] * vs, x[1] * vs, x[2] * vs, x[3] * vs);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(x[4] * vs, x[5] * vs, x[6] * vs, x[7] * vs);
    if (lead) reinterpret_cast<float*>(p.partial_lse)[prow] = lse;
  }
}

// The in-kernel merge of a split (request, KV head): each piece stores its rows as fp32 partial states (store_row),
// then counts itself in the unit's counter; the CTA that brings the count to the unit's piece count merges all
// pieces into o / lse and resets the counter to 0 for the next launch (so a CUDA graph replays it as is). No second
// kernel, no launch gap, and the partial rows are read while they are still in L2.
//   Partial rows: piece j of the unit starting at row U holds its `rows` rows at U + j * rows (planner/merge.py).
//   Memory order: every thread fences its own partial stores before the barrier that precedes the count (release);
//   the merging CTA reads the other pieces' rows with ld.global.cg (L2, never a stale L1 line) after the count.
// All threads call it (block-uniform arguments); `flag` is one int of shared memory.
template <typename O, int D, bool kLse, int kThreads>
__device__ __forceinline__ void merge_split(const DecodeParams& p, int unit, int pieces, int rows, int req, int head0,
                                            int* flag) {
#ifndef CUINFER_DECODE_MERGE_FENCE  // (A/B builds: the fence in every thread before and after the count)
  // One acq_rel atomic of thread 0 after the barrier, instead of a fence in every thread: the release is cumulative
  // (it orders the block's partial stores that the barrier ordered before it) and the acquire, followed by the next
  // barrier, orders the block's reads of the other pieces after their stores (the semaphore pattern of CUTLASS's
  // generic barrier). Measured (dtrace, H200): the last epilogue of D1 2.36 -> 2.24 us.
  __syncthreads();
  if (threadIdx.x == 0) {
    int* count = reinterpret_cast<int*>(p.merge_count) + unit;
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(count) : "memory");
    const bool last = old == pieces - 1;
    if (last) *count = 0;  // every piece has counted itself: ready for the next launch
    *flag = last;
  }
  __syncthreads();
  if (!*flag) return;
#else
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* count = reinterpret_cast<int*>(p.merge_count) + unit;
    const bool last = atomicAdd(count, 1) == pieces - 1;
    if (last) *count = 0;  // every piece has counted itself: ready for the next launch
    *flag = last;
  }
  __syncthreads();
  if (!*flag) return;
  __threadfence();
#endif
  const float* plse = reinterpret_cast<const float*>(p.partial_lse) + unit;
  const float* po = reinterpret_cast<const float*>(p.partial_o) + i64(unit) * D;
  constexpr int kChunks = D / 8;
  for (int u = threadIdx.x; u < rows * kChunks; u += kThreads) {
    const int x = u / kChunks, c = u % kChunks;
    float mx = neg_inf();
    for (int j = 0; j < pieces; ++j) mx = fmaxf(mx, __ldcg(plse + j * rows + x));
    float acc[8], den = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    if (mx != neg_inf()) {
      for (int j = 0; j < pieces; ++j) {
        const float w = exp2f(__ldcg(plse + j * rows + x) - mx);  // an empty piece (-inf) weighs 0
        const float4* src = reinterpret_cast<const float4*>(po + i64(j * rows + x) * D + c * 8);
        const float4 lo = __ldcg(src), hi = __ldcg(src + 1);
        den += w;
        acc[0] = fmaf(w, lo.x, acc[0]), acc[1] = fmaf(w, lo.y, acc[1]);
        acc[2] = fmaf(w, lo.z, acc[2]), acc[3] = fmaf(w, lo.w, acc[3]);
        acc[4] = fmaf(w, hi.x, acc[4]), acc[5] = fmaf(w, hi.y, acc[5]);
        acc[6] = fmaf(w, hi.z, acc[6]), acc[7] = fmaf(w, hi.w, acc[7]);
      }
    }
    const float inv = den > 0.f ? 1.f / den : 0.f;
    Vec<O, 8> v;  // (the partials already carry v_scale)
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = from_float<O>(acc[i] * inv);
    const int head = head0 + x;
    v.store_global(reinterpret_cast<O*>(p.o) + i64(req) * p.o_stride_b + i64(head) * p.o_stride_h + c * 8);
    if constexpr (kLse) {
      if (c == 0) {
        reinterpret_cast<float*>(p.lse)[i64(req) * p.lse_stride_b + i64(head) * p.lse_stride_h] =
            den > 0.f ? mx + log2f(den) : neg_inf();
      }
    }
  }
}

// Merge S slices (m_s, d_s, o_s unnormalised) of one row slice: o = Σ 2^(m_s-M) o_s / Σ 2^(m_s-M) d_s.
struct SliceMerge {
  float acc[8];
  float m, l;
  __device__ __forceinline__ void init(float max_m) {
    m = max_m;
    l = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  }
  __device__ __forceinline__ void add(float ms, float ds, const float* o_s) {
    const float w = fmath::ex2(ms - (m == neg_inf() ? 0.f : m));  // an empty slice (ms = -inf) weighs 0
    l += w * ds;
    const float4 a = *reinterpret_cast<const float4*>(o_s);
    const float4 b = *reinterpret_cast<const float4*>(o_s + 4);
    acc[0] += w * a.x, acc[1] += w * a.y, acc[2] += w * a.z, acc[3] += w * a.w;
    acc[4] += w * b.x, acc[5] += w * b.y, acc[6] += w * b.z, acc[7] += w * b.w;
  }
  // Normalise in place; returns the lse (o = 0, lse = -inf for a row that saw no key).
  __device__ __forceinline__ float finish() {
    if (l > 0.f) {
      const float inv = 1.f / l;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] *= inv;
      return m + fmath::lg2(l);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    return neg_inf();
  }
};

// ==================================================================================================================
// CUDA-core kernel. kThreads = (D/8) x G x BDZ; each of the BDZ token slices holds TZ = T / BDZ tokens of a tile.
// ==================================================================================================================
template <typename Q, typename KV, typename O, int D, int G, int T, int kStages, int kThreads, int kMinBlocks, int kPos,
          bool kSoftCap, bool kWindow, bool kLse>
__global__ void __launch_bounds__(kThreads, kMinBlocks) batch_decode_cuda_core(const __grid_constant__ DecodeParams p) {
  static_assert(sizeof(KV) == 2 && sizeof(Q) == 2, "16-bit q and KV");
  constexpr int BDX = D / 8;
  constexpr int BDZ = kThreads / (BDX * G);
  static_assert(BDX * G * BDZ == kThreads, "kThreads = D/8 x G x BDZ");
  static_assert(BDX <= 32 && 32 % BDX == 0, "the dims of one head stay inside one warp");
  constexpr int TZ = T / BDZ;
  static_assert(TZ * BDZ == T, "token slices split the tile evenly");
  static_assert(BDZ == 1 || G <= TZ, "the merge of BDZ slices of G rows must fit in one KV stage");
  constexpr int kSub = TZ < 8 ? TZ : 8;
  static_assert(TZ % kSub == 0, "slices hold whole sub-chunks");
  using Pipe = Pipeline<KV, D, T, kStages, kThreads, kWindow, G, G>;

  extern __shared__ __align__(128) unsigned char smem[];
  float* md = reinterpret_cast<float*>(smem + Pipe::kBytes);  // [BDZ][G][2]: (m, d) per slice and head

  const int tx = threadIdx.x % BDX;
  const int ty = (threadIdx.x / BDX) % G;
  const int tz = threadIdx.x / (BDX * G);

  Pipe pipe;
  pipe.start(p, smem);

  fmath::RopeFreq kf[8];
  if constexpr (kPos == kPosRope) rope_k_freqs<D>(p, threadIdx.x % (D / 16), kf);

  float q[8], o[8];
  float m = neg_inf(), d = 0.f, slope = 0.f;
  int qpos = 0;

  for (int n = 0;; ++n) {
    const TileSlot<T>* cur = pipe.wait(n);
    const int flags = cur->flags;
    if (flags & kNull) break;
    const int start = cur->start, n_valid = cur->n_valid;
    pipe.advance(p, n);
    KV* ks = pipe.k_stage(n);
    KV* vs = pipe.v_stage(n);

    if (flags & kFirst) {
      const int head = cur->kv_head * G + ty;
      const Q* qrow = reinterpret_cast<const Q*>(p.q) + i64(cur->req) * p.q_stride_b + i64(head) * p.q_stride_h;
      Vec<Q, 8> qv;
      qv.load(qrow + tx * 8);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = to_float(qv[i]);
      qpos = cur->kv_len - 1;
      if constexpr (kPos == kPosRope) {
        Vec<Q, 8> pv;
        pv.load(qrow + ((tx + BDX / 2) % BDX) * 8);
        float partner[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) partner[i] = to_float(pv[i]);
        rope_q_chunk<D>(p, tx, qpos, q, partner);
      }
      if constexpr (kPos == kPosAlibi) slope = alibi_slope_scaled<kSoftCap>(head, p.num_qo_heads);
      m = neg_inf();
      d = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = 0.f;
    }
    if constexpr (kPos == kPosRope) {
      rope_k_tile<KV, D, kThreads>(ks, start, n_valid, kf);
      __syncthreads();
    }

    // q·k for this slice's tokens, reduced over the BDX lanes of the head; online softmax kSub tokens at a time
    // (a slice of a large group holds up to 64 tokens, too many logits to keep in registers at once; the sub-chunk
    // loop stays rolled so the compiler does not hoist all of its shared-memory loads).
#pragma unroll 1
    for (int j0 = 0; j0 < TZ; j0 += kSub) {
      float s[kSub];
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int r = tz * TZ + j0 + j;
        Vec<KV, 8> kv;
        kv.load(ks + Swizzle<BDX>::slot(r, tx) * 8);
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc = fmaf(q[i], to_float(kv[i]), acc);
        s[j] = acc;
      }
      float m_sub = neg_inf();
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int r = tz * TZ + j0 + j;
        s[j] = logit<kSoftCap, kPos>(p, fmath::group_sum<BDX>(s[j]), slope, start + r, qpos, r < n_valid);
        m_sub = fmaxf(m_sub, s[j]);
      }
      const float m_new = fmaxf(m, m_sub);
      const float base = m_new == neg_inf() ? 0.f : m_new;
      const float scale = fmath::ex2(m - base);
      m = m_new;
      d *= scale;
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] *= scale;
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int r = tz * TZ + j0 + j;
        const float pj = fmath::ex2(s[j] - base);
        d += pj;
        Vec<KV, 8> vv;
        vv.load(vs + Swizzle<BDX>::slot(r, tx) * 8);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = fmaf(pj, to_float(vv[i]), o[i]);
      }
    }
    pipe.finish(p, n);

    if (flags & kLast) {
      const int head = cur->kv_head * G + ty;
      const int prow = cur->partial < 0 ? -1 : cur->partial + ty;
      SliceMerge mg;
      if constexpr (BDZ == 1) {
        mg.init(m);
        mg.l = d;
#pragma unroll
        for (int i = 0; i < 8; ++i) mg.acc[i] = o[i];
      } else {
        __syncthreads();  // every slice is done reading this tile's stage: reuse it as merge scratch
        float* os = reinterpret_cast<float*>(ks);  // [BDZ][G][D]
        float* orow = os + (tz * G + ty) * D + tx * 8;
        *reinterpret_cast<float4*>(orow) = make_float4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<float4*>(orow + 4) = make_float4(o[4], o[5], o[6], o[7]);
        if (tx == 0) {
          md[(tz * G + ty) * 2] = m;
          md[(tz * G + ty) * 2 + 1] = d;
        }
        __syncthreads();
        if (tz == 0) {
          float mx = neg_inf();
#pragma unroll
          for (int z = 0; z < BDZ; ++z) mx = fmaxf(mx, md[(z * G + ty) * 2]);
          mg.init(mx);
#pragma unroll
          for (int z = 0; z < BDZ; ++z)
            mg.add(md[(z * G + ty) * 2], md[(z * G + ty) * 2 + 1], os + (z * G + ty) * D + tx * 8);
        }
      }
      if (tz == 0) {
        const float lse = mg.finish();
        store_row<O, D, kLse>(p, cur->req, head, prow, tx * 8, mg.acc, lse, tx == 0);
      }
      if (cur->merge >= 0) {
        merge_split<O, D, kLse, kThreads>(p, cur->merge, cur->pieces, G, cur->req, cur->kv_head * G,
                                          reinterpret_cast<int*>(md));  // (md is free again: see merge_split)
      }
    }
  }
}

// ==================================================================================================================
// Tensor-core kernel. kWarpsKV warps along the tile's tokens (16 each, T = 16 kWarpsKV), kWarpsD along the output
// dims (each warp computes the whole 16x16 S of its tokens and P·V for D / kWarpsD dims). Rows of the query tile are
// packed rows qo_tile*16 + r = the query heads of the KV head (rows >= G are zero and never written).
// ==================================================================================================================
template <typename Q, typename KV, typename O, int D, int G, int kWarpsKV, int kWarpsD, int kStages, int kMinBlocks,
          int kPos, bool kSoftCap, bool kWindow, bool kLse>
__global__ void __launch_bounds__(32 * kWarpsKV * kWarpsD, kMinBlocks) batch_decode_tensor_core(
    const __grid_constant__ DecodeParams p) {
  static_assert(is_same<Q, KV>::value, "tensor cores take q and KV of one 16-bit type");
  static_assert(sizeof(KV) == 2, "16-bit KV");
  constexpr int kThreads = 32 * kWarpsKV * kWarpsD;
  constexpr int T = 16 * kWarpsKV;
  constexpr int DW = D / kWarpsD;  // output dims per warp
  static_assert(DW % 16 == 0, "each warp owns whole 16-dim blocks of the output");
  constexpr int kChunks = D / 8;
  using Pipe = Pipeline<KV, D, T, kStages, kThreads, kWindow, G, 16>;
  static_assert(Pipe::kStageBytes == 16LL * kWarpsKV * D * 4, "the merge scratch is exactly one KV stage");

  extern __shared__ __align__(128) unsigned char smem[];
  Q* qs = reinterpret_cast<Q*>(smem + Pipe::kBytes);                  // [16][D], swizzled
  float* md = reinterpret_cast<float*>(smem + Pipe::kBytes + 16 * D * sizeof(Q));  // [kWarpsKV * 16][2]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wkv = warp % kWarpsKV, wd = warp / kWarpsKV;
  const int gid = lane / 4, tig = lane % 4;

  CUINFER_DECODE_GSTAMP(0)
  CUINFER_DECODE_STAMP(1)
  Pipe pipe;
  pipe.start(p, smem);
  CUINFER_DECODE_STAMP(2)

  fmath::RopeFreq kf[8];
  if constexpr (kPos == kPosRope) rope_k_freqs<D>(p, threadIdx.x % (D / 16), kf);

  u32 qf[D / 16][4];
  float oacc[DW / 8][4];
  float m[2] = {neg_inf(), neg_inf()}, dsum[2] = {0.f, 0.f}, slope[2] = {0.f, 0.f};
  int qpos = 0;

  for (int n = 0;; ++n) {
    const TileSlot<T>* cur = pipe.wait(n);
    const int flags = cur->flags;
#ifdef CUINFER_DECODE_TRACE
    if (n == 0) CUINFER_DECODE_STAMP(3)
    if (flags & kNull) {
      CUINFER_DECODE_STAMP(5)
      CUINFER_DECODE_GSTAMP(6)
      if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        reinterpret_cast<unsigned long long*>(p.lse)[blockIdx.x * kTraceWords + 7] = smid;
      }
    }
#endif
    if (flags & kNull) break;
    const int start = cur->start, n_valid = cur->n_valid;
    pipe.advance(p, n);
    KV* ks = pipe.k_stage(n);
    KV* vs = pipe.v_stage(n);

    if (flags & kFirst) {
      const int row0 = cur->qo_tile * 16;  // packed row of the tile's row 0 = head in group
      const Q* qb = reinterpret_cast<const Q*>(p.q) + i64(cur->req) * p.q_stride_b +
                    i64(cur->kv_head * G) * p.q_stride_h;
      qpos = cur->kv_len - 1;
      if constexpr (kPos == kPosRope) {
        for (int u = threadIdx.x; u < 16 * (kChunks / 2); u += kThreads) {
          const int r = u / (kChunks / 2), c = u % (kChunks / 2);
          Vec<Q, 8> lo, hi;
          zero_vec<Q>(lo);
          zero_vec<Q>(hi);
          if (row0 + r < G) {
            const Q* src = qb + i64(row0 + r) * p.q_stride_h;
            lo.load(src + c * 8);
            hi.load(src + (c + kChunks / 2) * 8);
            float x[8], y[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) x[i] = to_float(lo[i]), y[i] = to_float(hi[i]);
            float xr[8], yr[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) xr[i] = x[i], yr[i] = y[i];
            rope_q_chunk<D>(p, c, qpos, xr, y);
            rope_q_chunk<D>(p, c + kChunks / 2, qpos, yr, x);
#pragma unroll
            for (int i = 0; i < 8; ++i) lo[i] = from_float<Q>(xr[i]), hi[i] = from_float<Q>(yr[i]);
          }
          lo.store(qs + Swizzle<kChunks>::slot(r, c) * 8);
          hi.store(qs + Swizzle<kChunks>::slot(r, c + kChunks / 2) * 8);
        }
      } else {
        for (int u = threadIdx.x; u < 16 * kChunks; u += kThreads) {
          const int r = u / kChunks, c = u % kChunks;
          Vec<Q, 8> v;
          zero_vec<Q>(v);
          if (row0 + r < G) v.load(qb + i64(row0 + r) * p.q_stride_h + c * 8);
          v.store(qs + Swizzle<kChunks>::slot(r, c) * 8);
        }
      }
      __syncthreads();
      const u32 qbase = mma::smem_addr(qs);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        mma::ldmatrix_x4(qf[kk], qbase + Swizzle<kChunks>::byte_offset(lane % 16, 2 * kk + lane / 16));
      if constexpr (kPos == kPosAlibi) {
        const int h0 = cur->kv_head * G + row0 + gid;
        slope[0] = alibi_slope_scaled<kSoftCap>(min(h0, p.num_qo_heads - 1), p.num_qo_heads);
        slope[1] = alibi_slope_scaled<kSoftCap>(min(h0 + 8, p.num_qo_heads - 1), p.num_qo_heads);
      }
      m[0] = m[1] = neg_inf();
      dsum[0] = dsum[1] = 0.f;
#pragma unroll
      for (int j = 0; j < DW / 8; ++j) oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.f;
    }
    if constexpr (kPos == kPosRope) {
      rope_k_tile<KV, D, kThreads>(ks, start, n_valid, kf);
      __syncthreads();
    }

#ifndef CUINFER_DECODE_NOMATH  // A/B builds (bench/tune_sched.py dtrace): the memory pipeline alone
    // S = Q K^T for this warp's 16 tokens: two n8 tiles (tokens 0-7, 8-15 of the warp).
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    const u32 kbase = mma::smem_addr(ks);
    const int krow = wkv * 16 + lane % 8 + 8 * (lane / 16);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      u32 b[4];
      mma::ldmatrix_x4(b, kbase + Swizzle<kChunks>::byte_offset(krow, 2 * kk + (lane / 8) % 2));
      mma::mma_m16n16k16<Q>(s[0], s[1], qf[kk], b);
    }

    // Online softmax on rows gid (e = 0, 1) and gid + 8 (e = 2, 3); a row is spread over the 4 lanes of a quad.
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = wkv * 16 + nt * 8 + 2 * tig + (e & 1);
        s[nt][e] = logit<kSoftCap, kPos>(p, s[nt][e], slope[e / 2], start + r, qpos, r < n_valid);
        mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }
    }
    float base[2], scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], mma::quad_max(mx[h]));
      base[h] = m_new == neg_inf() ? 0.f : m_new;
      scale[h] = fmath::ex2(m[h] - base[h]);
      m[h] = m_new;
      dsum[h] *= scale[h];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = fmath::ex2(s[nt][e] - base[e / 2]);
        dsum[e / 2] += s[nt][e];
      }
    }
#pragma unroll
    for (int j = 0; j < DW / 8; ++j) {
      oacc[j][0] *= scale[0];
      oacc[j][1] *= scale[0];
      oacc[j][2] *= scale[1];
      oacc[j][3] *= scale[1];
    }

    // O += P V over this warp's output dims.
    u32 pa[4];
    mma::frag_c_to_a<Q>(pa, s[0], s[1]);
    const u32 vbase = mma::smem_addr(vs);
    const int vrow = wkv * 16 + lane % 16;
#pragma unroll
    for (int nd = 0; nd < DW / 16; ++nd) {
      u32 b[4];
      mma::ldmatrix_x4_trans(b, vbase + Swizzle<kChunks>::byte_offset(vrow, (wd * DW) / 8 + 2 * nd + lane / 16));
      mma::mma_m16n16k16<Q>(oacc[2 * nd], oacc[2 * nd + 1], pa, b);
    }
#endif
    pipe.finish(p, n);

    if (flags & kLast) {
      CUINFER_DECODE_STAMP(4)
      __syncthreads();  // every warp is done reading this tile's stage: reuse it as merge scratch
      float* os = reinterpret_cast<float*>(ks);  // [kWarpsKV][16][D]
      const float d0 = mma::quad_sum(dsum[0]), d1 = mma::quad_sum(dsum[1]);
      // Only the tile's real rows (query heads row0 + r < G) are staged: the merge below reads no others, and with
      // G = 4 that is a quarter of the scratch traffic of all 16 mma rows.
#ifdef CUINFER_DECODE_EPI_ALL_ROWS
      const bool lo_row = true, hi_row = true;  // A/B builds (bench/tune_sched.py)
#else
      const bool lo_row = cur->qo_tile * 16 + gid < G, hi_row = cur->qo_tile * 16 + gid + 8 < G;
#endif
#pragma unroll
      for (int j = 0; j < DW / 8; ++j) {
        const int col = wd * DW + j * 8 + 2 * tig;
        if (lo_row) *reinterpret_cast<float2*>(os + (wkv * 16 + gid) * D + col) = make_float2(oacc[j][0], oacc[j][1]);
        if (hi_row) {
          *reinterpret_cast<float2*>(os + (wkv * 16 + gid + 8) * D + col) = make_float2(oacc[j][2], oacc[j][3]);
        }
      }
      if (wd == 0 && tig == 0) {
        md[(wkv * 16 + gid) * 2] = m[0];
        md[(wkv * 16 + gid) * 2 + 1] = d0;
        md[(wkv * 16 + gid + 8) * 2] = m[1];
        md[(wkv * 16 + gid + 8) * 2 + 1] = d1;
      }
      __syncthreads();
      const int row0 = cur->qo_tile * 16;
      for (int u = threadIdx.x; u < 16 * kChunks; u += kThreads) {
        const int r = u / kChunks, c = u % kChunks;
        if (row0 + r < G) {
          float mxr = neg_inf();
#pragma unroll
          for (int w = 0; w < kWarpsKV; ++w) mxr = fmaxf(mxr, md[(w * 16 + r) * 2]);
          SliceMerge mg;
          mg.init(mxr);
#pragma unroll
          for (int w = 0; w < kWarpsKV; ++w)
            mg.add(md[(w * 16 + r) * 2], md[(w * 16 + r) * 2 + 1], os + (w * 16 + r) * D + c * 8);
          const float lse = mg.finish();
          const int prow = cur->partial < 0 ? -1 : cur->partial + r;
          store_row<O, D, kLse>(p, cur->req, cur->kv_head * G + row0 + r, prow, c * 8, mg.acc, lse, c == 0);
        }
      }
      if (cur->merge >= 0) {
        merge_split<O, D, kLse, kThreads>(p, cur->merge, cur->pieces, min(16, G - row0), cur->req,
                                          cur->kv_head * G + row0, reinterpret_cast<int*>(md));
      }
    }
  }
}

#undef CUINFER_DECODE_STAMP
#undef CUINFER_DECODE_GSTAMP

}  // namespace decode
}  // namespace cuinfer
