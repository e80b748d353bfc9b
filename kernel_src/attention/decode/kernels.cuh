// Batch decode on a paged KV cache: one query token per request, persistent CTAs driven by a work plan.
//
// Two kernels share one memory pipeline (pipeline.cuh) and differ only in the math:
//   batch_decode_cuda_core   thread (tx, ty, tz): tx owns 8 dims of the head, ty one query head of the GQA group,
//                            tz a slice of the tile's tokens; q·k is reduced over the D/8 tx lanes with shuffles.
//   batch_decode_tensor_core head-group fusion (paper appendix A): the g query heads of one KV head are the rows of a
//                            16-row query tile, Q·K^T and P·V run on mma.sync m16n8k16 with fp32 accumulators; warp w
//                            owns tokens 16w..16w+15 of each tile (and, for head dim 256, half of the output dims).
// Either way one CTA handles all query heads of a KV head, so every KV tile is read from memory once for the group.
//
// The plan (plan/work.cuh) gives CTA c its work items; an item is one request, one KV head (all its query heads: the
// decode query tile) and one KV range [start, end). The CTA walks the concatenation of its items' tiles (T tokens
// each; an empty item still has one, all-masked, tile) as a single stream, so the pipeline never drains at item
// boundaries:
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
// Softmax runs in base 2 in fp32: logits are pre-scaled by sm_scale·log2(e), lse is log2-sum-exp (docs/api.md). States
// of the warps (tensor cores) or token slices (CUDA cores) of one item are merged through the item's last KV stage,
// which is free until the next iteration's barrier: 4 bytes x rows x D per slice is exactly the stage's K+V bytes when
// the slices are 16 rows (tensor cores) or when g <= tokens per slice (CUDA cores).
//
// kMinBlocks (__launch_bounds__) caps the registers so that the CTAs the shared memory allows per SM (the policy's
// count, which sizes the persistent grid) are also allowed by the register file.
//
// The attention variant V (variants/contract.cuh; its parameters arrive as the kernel's second argument,
// VariantParams) shapes the logits (soft cap, ALiBi, ...), masks keys, clips each item's KV range by its key range
// (a sliding window: at load_items), and transforms q (when an item starts) and each K / V tile in shared memory
// (RoPE; the tensor-core kernel with one warp along the dims transforms q and K on their MMA fragments in registers
// instead: TensorCore::kFrag, variant::FragStates); a sink is folded into each final row (finish_item, merge_split), an output transform applied to it; without
// softmax (V::kSoftmax false) the keys' weights are summed (tile) and the pieces of a split row add up (merge_split).
// kLse: the kernel writes lse.
//
// fp8 K/V (KV = __nv_fp8_e4m3 / __nv_fp8_e5m2, common/fp8.cuh): the pipeline copies the fp8 bytes as they are (16
// elements per 16-byte copy, so a stage of the same bytes holds twice the tokens) and the math converts them in
// registers: the CUDA-core kernel 8 elements at a time to fp32 (through float16), the tensor-core kernel ldmatrix
// fragments to float16 whatever Q's type (tile_fp8: each warp owns kWarpTokens = 32 tokens of a tile; fp8::k_pairs
// gives K exactly by one cvt per pair on sm_89+ (e4m3; e5m2 and sm_80 by byte permutes and masks), fp8::v_pairs V
// exactly by a byte permute and one cvt per pair on sm_89+ (e4m3; sm_80 times 2^-8 by masks and shifts, e5m2 by a byte
// permute and a mask), no multiply; load_q converts each query row once per item to float16 times a power of two that
// puts its largest |q| in [2^14, 2^15), in the head-dim order of the K fragments; the logits take back the powers of
// two with the k scale, o V's with the v scale; the online softmax keeps a lazy reference max (softmax_fp8); the P·V
// accumulators back in the usual order at the item's end). k_scale and v_scale reach the kernels folded into sm_scale
// and v_scale, or as per-KV-head arrays (k_scales: the logits of a tile, v_scales: o at the item's end). The variants'
// logits, masks, sinks, softmax=False and output transforms apply as with 16-bit K/V; q / k and value transforms, which
// rewrite K / V tiles in shared memory, are refused for fp8 tiles (they would round the transformed keys / values back
// to fp8).
#pragma once
#include "attention/decode/math.cuh"
#include "attention/decode/pipeline.cuh"
#include "common/fp8.cuh"
#include "debug/trace.cuh"
#include "variants/apply.cuh"
#include "variants/contract.cuh"

namespace cuinfer {
namespace decode {

using fp8::head_scale;  // (fp8 scale arrays: common/fp8.cuh)

// ==================================================================================================================
// CUDA-core kernel. kThreads = (D/8) x G x BDZ; each of the BDZ token slices holds TZ = T / BDZ tokens of a tile.
// ==================================================================================================================
template <typename Q, typename KV, typename O, int D, int G, int T, int kThreads, class V, bool kLse>
struct CudaCore {
  // The pipeline's trimmed tiles (Pipeline's kPairs) for every element size: measured 3-6 % faster on D1-D7 than the
  // 16-bit offsets' code (2026-12-03).
  static constexpr bool kPairs = true;
  using Slot = TileSlot<T, kPairs>;  // (the pipeline's: Pipeline::Slot)
  static constexpr int BDX = D / 8;
  static constexpr int BDZ = kThreads / (BDX * G);
  static_assert(BDX * G * BDZ == kThreads, "kThreads = D/8 x G x BDZ");
  static_assert(BDX <= 32 && 32 % BDX == 0, "the dims of one head stay inside one warp");
  static constexpr int TZ = T / BDZ;
  static_assert(TZ * BDZ == T, "token slices split the tile evenly");
  // (BDZ x G fp32 rows of D in the 2 x T x D elements of K and V)
  static_assert(BDZ == 1 || 2 * G <= TZ * int(sizeof(KV)),
                "the merge of BDZ slices of G rows must fit in one KV stage");
  static constexpr int kSub = TZ < 8 ? TZ : 8;
  static_assert(TZ % kSub == 0, "slices hold whole sub-chunks");

  // This thread's 8 dims (8 tx .. 8 tx + 7) of row r of a K or V tile: 16-bit rows hold them in chunk tx, fp8 rows in
  // half tx % 2 of chunk tx / 2 (one 8-byte load, converted through float16). dot8: q · k; axpy8: o += w · v. (The
  // 16-bit branches are the loops the 16-bit kernel always had, so its code stays as it was.)
  static __device__ __forceinline__ float dot8(const KV* ks, int r, int tx, const float (&q)[8]) {
    float acc = 0.f;
    if constexpr (sizeof(KV) == 1) {
      float x[8];
      fp8::to_float8<KV>(*reinterpret_cast<const uint2*>(ks + Swizzle<D / 16>::slot(r, tx >> 1) * 16 + (tx & 1) * 8),
                         x);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc = fmaf(q[i], x[i], acc);
    } else {
      Vec<KV, 8> kv;
      kv.load(ks + Swizzle<BDX>::slot(r, tx) * 8);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc = fmaf(q[i], to_float(kv[i]), acc);
    }
    return acc;
  }
  static __device__ __forceinline__ void axpy8(const KV* vs, int r, int tx, float w, float (&o)[8]) {
    if constexpr (sizeof(KV) == 1) {
      float x[8];
      fp8::to_float8<KV>(*reinterpret_cast<const uint2*>(vs + Swizzle<D / 16>::slot(r, tx >> 1) * 16 + (tx & 1) * 8),
                         x);
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = fmaf(w, x[i], o[i]);
    } else {
      Vec<KV, 8> vv;
      vv.load(vs + Swizzle<BDX>::slot(r, tx) * 8);
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = fmaf(w, to_float(vv[i]), o[i]);
    }
  }

  // The row of this thread's query head at the item's first tile, and its 8 dims of q (transformed at qpos).
  template <class VP>
  static __device__ __forceinline__ variant::Index load_q(const DecodeParams& p, const VP& v, const Slot* cur,
                                                          int tx, int ty, float (&q)[8],
                                                          const typename V::DimState (&qst)[8]) {
    const int head = cur->kv_head * G + ty;
    const variant::Index ix{cur->req, 0, cur->kv_len - 1, head, cur->kv_head, 1, cur->kv_len, D};
    const Q* qrow = reinterpret_cast<const Q*>(p.q) + i64(cur->req) * p.q_stride_b + i64(head) * p.q_stride_h;
    Vec<Q, 8> qv;
    qv.load(qrow + tx * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = to_float(qv[i]);
    if constexpr (V::kQueryTransform) {
      Vec<Q, 8> pv;
      pv.load(qrow + ((tx + BDX / 2) % BDX) * 8);
      float partner[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) partner[i] = to_float(pv[i]);
      variant::query_transform_chunk<V, D>(v, ix, tx, q, partner, qst);
    }
    return ix;
  }

  // q·k for this slice's tokens, reduced over the BDX lanes of the head; online softmax kSub tokens at a time (a
  // slice of a large group holds up to 64 tokens, too many logits to keep in registers at once; the sub-chunk loop
  // stays rolled so the compiler does not hoist all of its shared-memory loads).
  template <class VP>
  static __device__ __forceinline__ void tile(const DecodeParams& p, const VP& v, const variant::Index& ix,
                                              const KV* ks, const KV* vs, int start, int n_valid, int tx, int tz,
                                              const float (&q)[8], float (&o)[8], float& m, float& d) {
    const float kscale = sizeof(KV) == 1 ? head_scale(p.k_scales, p.k_scales_stride, ix.kv_head) : 1.f;
#pragma unroll 1
    for (int j0 = 0; j0 < TZ; j0 += kSub) {
      float s[kSub];
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        s[j] = dot8(ks, tz * TZ + j0 + j, tx, q);
      }
      if constexpr (!V::kSoftmax) {
#pragma unroll
        for (int j = 0; j < kSub; ++j) {
          const int r = tz * TZ + j0 + j;
          const float w = weight<V>(p, v, ix, fmath::group_sum<BDX>(s[j]) * kscale, start + r, r < n_valid);
          d += w;
          axpy8(vs, r, tx, w, o);
        }
        continue;
      }
      float m_sub = neg_inf();
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int r = tz * TZ + j0 + j;
        s[j] = logit<V>(p, v, ix, fmath::group_sum<BDX>(s[j]) * kscale, start + r, r < n_valid);
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
        axpy8(vs, r, tx, pj, o);
      }
    }
  }

  // The item's last tile: merge the BDZ slices' states through this tile's stage (free once every slice is done
  // reading it), write o / lse or the partial row, and run the split merge when this is the unit's last piece.
  // Without softmax every slice's state is a sum: reference 0, merged with weight 1.
  template <class VP>
  static __device__ __forceinline__ void finish_item(const DecodeParams& p, const VP& v, const Slot* cur,
                                                     KV* ks, float* md, int tx, int ty, int tz, const float (&o)[8],
                                                     float m, float d) {
    const int head = cur->kv_head * G + ty;
    const int prow = cur->partial < 0 ? -1 : cur->partial + ty;
    if constexpr (!V::kSoftmax) m = 0.f;
    state::Merger<8> mg;
    if constexpr (BDZ == 1) {
      mg.init(m);
      mg.d = d;
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
        for (int z = 0; z < BDZ; ++z) {
          float x[8];
          load8(os + (z * G + ty) * D + tx * 8, x);
          mg.add(mg.weight(md[(z * G + ty) * 2]), md[(z * G + ty) * 2 + 1], x);  // an empty slice (-inf) weighs 0
        }
      }
    }
    if (tz == 0) {
      const variant::Index ix{cur->req, 0, cur->kv_len - 1, head, cur->kv_head, 1, cur->kv_len, D};
      const float lse = finish_state<V>(v, ix, mg, prow < 0);
      store_row<V, O, D, kLse>(p, v, ix, cur->req, head, prow, tx * 8, mg.acc, lse, tx == 0);
    }
    if (cur->merge >= 0) {
      const SplitUnit su{cur->merge, cur->pieces, G, cur->req, cur->kv_head * G, cur->kv_head, cur->kv_len};
      merge_split<V, O, D, kLse, kThreads>(p, v, su, reinterpret_cast<int*>(md));  // (md is free again here)
    }
  }
};

template <typename Q, typename KV, typename O, int D, int G, int T, int kStages, int kThreads, int kMinBlocks, class V,
          bool kLse>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    batch_decode_cuda_core(const __grid_constant__ DecodeParams p, const __grid_constant__ VariantParams v) {
  static_assert(sizeof(Q) == 2 && (sizeof(KV) == 2 || fp8::IsFp8<KV>::value), "16-bit q, 16-bit or fp8 KV");
  static_assert(!((V::kKeyTransform || V::kValueTransform) && sizeof(KV) == 1),
                "key / value transforms of fp8 K / V tiles (in shared memory) are not supported");
  using K = CudaCore<Q, KV, O, D, G, T, kThreads, V, kLse>;
  using Pipe = Pipeline<KV, D, T, kStages, kThreads, V, G, G, K::kPairs>;

  extern __shared__ __align__(128) unsigned char smem[];
  float* md = reinterpret_cast<float*>(smem + Pipe::kBytes);  // [BDZ][G][2]: (m, d) per slice and head

  const int tx = threadIdx.x % K::BDX;
  const int ty = (threadIdx.x / K::BDX) % G;
  const int tz = threadIdx.x / (K::BDX * G);

  Pipe pipe;
  pipe.start(p, v, smem);

  variant::KeyStates<V, D, kThreads, T> kst;  // the key transform's states of this thread's dims (RoPE frequencies)
  if constexpr (V::kKeyTransform || V::kQueryTransform) kst.init(v, threadIdx.x);

  float q[8], o[8];
  float m = neg_inf(), d = 0.f;
  variant::Index ix{};

  for (int n = 0;; ++n) {
    const typename K::Slot* cur = pipe.wait(n);
    const int flags = cur->flags;
    if (flags & kNull) break;
    const int start = cur->start, n_valid = cur->n_valid;
    pipe.advance(p, v, n);
    KV* ks = pipe.k_stage(n);
    KV* vs = pipe.v_stage(n);

    if (flags & kFirst) {
      ix = K::load_q(p, v, cur, tx, ty, q, kst.s);
      m = neg_inf();
      d = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = 0.f;
    }
    if constexpr (V::kKeyTransform || V::kValueTransform) {
      if constexpr (V::kKeyTransform) {
        kst.transform_tile(v, ix, ks, start, n_valid, threadIdx.x);
      }
      if constexpr (V::kValueTransform) {
        const variant::Index vix{cur->req, -1, -1, -1, cur->kv_head, 1, cur->kv_len, D};  // (no query: see contract)
        variant::value_transform_tile<V, D, kThreads>(v, vix, vs, start, n_valid, threadIdx.x);
      }
      __syncthreads();
    }
    K::tile(p, v, ix, ks, vs, start, n_valid, tx, tz, q, o, m, d);
    pipe.finish(p, n);
    if (flags & kLast) {
      if constexpr (sizeof(KV) == 1) {
        const float vsc = head_scale(p.v_scales, p.v_scales_stride, cur->kv_head);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] *= vsc;
      }
      K::finish_item(p, v, cur, ks, md, tx, ty, tz, o, m, d);
    }
  }
}

// ==================================================================================================================
// Tensor-core kernel. kWarpsKV warps along the tile's tokens (kWarpTokens each: 16 for 16-bit KV, 32 for fp8,
// T = kWarpTokens kWarpsKV), kWarpsD along the output dims (each warp computes the whole S of its tokens and P·V for
// D / kWarpsD dims). Rows of the query tile are packed rows qo_tile*16 + r = the query heads of the KV head (rows >= G
// are zero and never written).
// ==================================================================================================================
template <typename Q, typename KV, typename O, int D, int G, int kWarpsKV, int kWarpsD, int kWarpTokens, class V,
          bool kLse>
struct TensorCore {
  static constexpr bool kFp8 = sizeof(KV) == 1;
  static constexpr int kThreads = 32 * kWarpsKV * kWarpsD;
  static constexpr int T = kWarpTokens * kWarpsKV;
  static constexpr int DW = D / kWarpsD;  // output dims per warp
  // The pipeline's trimmed tiles (Pipeline's kPairs) for fp8 and for a key transform, whose rotation leaves the
  // kernel short of issue slots (fused RoPE on D6: 292 -> 272 us); plain 16-bit tiles keep the offsets' code (D6
  // measured 2.1 % slower with the trimmed tiles, D1-D4 1-4 % faster: 2026-12-03).
  static constexpr bool kPairs = kFp8 || V::kKeyTransform;
  using Slot = TileSlot<T, kPairs>;       // (the pipeline's: Pipeline::Slot)
  static_assert(DW % 16 == 0, "each warp owns whole 16-dim blocks of the output");
  static_assert(kFp8 ? kWarpTokens % 32 == 0 && DW % 32 == 0 : kWarpTokens == 16,
                "16-bit KV: 16 tokens per warp; fp8: multiples of 32 tokens and of 32 output dims per warp");
  static constexpr int kChunks = D / 8;       // 16-byte chunks of a 16-bit row (q)
  static constexpr int kChunks8 = D / 16;     // ... of an fp8 row (K, V)
  // Rows gid + 8 of the mma tiles (elements 2, 3 of S and o) hold query heads only when the group passes 8; below
  // that they are padding, and the softmax leaves them out (their P is 0, their o and state never read): kHalves = 1.
  static constexpr int kHalves = G > 8 ? 2 : 1;
  // q / k transforms on the mma fragments in registers (variant::FragStates: K rotated after ldmatrix, q after its
  // ldmatrix at the item's start) when one warp spans the dims (every warp reads only its own 16 keys, each K fragment
  // once); else in shared memory (variant::KeyStates, then a barrier).
  static constexpr bool kFrag = !kFp8 && kWarpsD == 1 && (V::kKeyTransform || V::kQueryTransform);

  // The row of query head qo_head of the item (a padding row, past the group, takes the group's last head).
  static __device__ __forceinline__ variant::Index row(const Slot* cur, int qo_head) {
    return variant::Index{cur->req, 0, cur->kv_len - 1, min(qo_head, cur->kv_head * G + G - 1), cur->kv_head, 1,
                          cur->kv_len, D};
  }

  // The item's query tile into shared memory (swizzled; rows >= G zero; transformed at qpos), then this warp's A
  // fragments.
  // qst: the transform's states, variant::FragStates (kFrag: q is transformed on its fragments) or this thread's
  // KeyStates::s.
  template <class VP, class QS>
  static __device__ __forceinline__ void load_q(const DecodeParams& p, const VP& v, const Slot* cur, Q* qs,
                                                u32 (&qf)[D / 16][4], float (&qsc)[2], const QS& qst) {
    const int row0 = cur->qo_tile * 16;  // packed row of the tile's row 0 = head in group
    const Q* qb = reinterpret_cast<const Q*>(p.q) + i64(cur->req) * p.q_stride_b + i64(cur->kv_head * G) * p.q_stride_h;
    if constexpr (V::kQueryTransform && !kFrag) {
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
          const variant::Index ix = row(cur, cur->kv_head * G + row0 + r);
          variant::query_transform_chunk<V, D>(v, ix, c, xr, y, qst);  // (c = threadIdx.x % (D/16): qst's pairs)
          variant::query_transform_chunk<V, D>(v, ix, c + kChunks / 2, yr, x, qst);
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
    const int lane = threadIdx.x % 32;
    if constexpr (kFp8) {
      // float16 fragments in the head-dim order of fp8::k_pairs' K (common/fp8.cuh), each row times the power of
      // two that puts its largest |q| in [2^14, 2^15) (qsc: the inverse, in the logits' scale). Lane (g, t) reads dims
      // 4t .. 4t+3 of each k-step of rows g and g + 8 (raw 16-bit pairs in qf first); the 4 lanes of a quad cover a
      // row.
      const int g = lane / 4, t = lane % 4;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const u32 off = (t & 1) * 8;
        fp8::q_frag_fp8k(qf[kk], qbase + Swizzle<kChunks>::byte_offset(g, 2 * kk + (t >> 1)) + off,
                         qbase + Swizzle<kChunks>::byte_offset(g + 8, 2 * kk + (t >> 1)) + off);
      }
      float amax[2] = {0.f, 0.f};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // (qf[kk][0, 2]: row g; [1, 3]: row g + 8)
          const Q* x = reinterpret_cast<const Q*>(&qf[kk][i]);
          amax[i % 2] = fmaxf(amax[i % 2], fmaxf(fabsf(to_float(x[0])), fabsf(to_float(x[1]))));
        }
      }
      float sc[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) fp8::q_f16_scale(mma::quad_max(amax[h]), sc[h], qsc[h]);
      // The rows' logit scales, fixed for the item (tile_fp8 multiplies each logit by them): the KV head's k scale,
      // 2^kPowK, the inverse q scale and, without a logits transform, sm_scale·log2 e, in that order (as tile_fp8
      // once formed them per tile: the same floats). Per tile that was a global load of the k scale and 4 multiplies.
      const float ksc = head_scale(p.k_scales, p.k_scales_stride, cur->kv_head) * float(1 << kPowK);
      const float ls = V::kSoftmax && !V::kLogits ? p.logits_scale : 1.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) qsc[h] = ksc * qsc[h] * ls;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const Q* r0 = reinterpret_cast<const Q*>(&qf[kk][0]);
        const Q* r8 = reinterpret_cast<const Q*>(&qf[kk][1]);
        const Q* r0h = reinterpret_cast<const Q*>(&qf[kk][2]);
        const Q* r8h = reinterpret_cast<const Q*>(&qf[kk][3]);
        const float g0[4] = {to_float(r0[0]), to_float(r0[1]), to_float(r0h[0]), to_float(r0h[1])};
        const float g8[4] = {to_float(r8[0]), to_float(r8[1]), to_float(r8h[0]), to_float(r8h[1])};
        fp8::q_frag_f16k(qf[kk], g0, g8, sc[0], sc[1]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        mma::ldmatrix_x4(qf[kk], qbase + Swizzle<kChunks>::byte_offset(lane % 16, 2 * kk + lane / 16));
      if constexpr (kFrag && V::kQueryTransform) {
        const int h0 = cur->kv_head * G + row0 + lane / 4;  // query heads of this thread's rows: h0, h0 + 8
        const variant::Index ix[2] = {row(cur, h0), row(cur, h0 + 8)};
        qst.template queries<Q>(v, ix, qf, lane % 4);
      }
    }
  }

  // S = Q K^T for this warp's 16 tokens, the online softmax (softmax(); without softmax the variant's weights, summed)
  // on rows gid (e = 0, 1) and gid + 8 (e = 2, 3) (a row is spread over the 4 lanes of a quad), O += P V over this
  // warp's output dims.
  // fs: kFrag's FragStates (K rotated in registers between its ldmatrix and the MMAs).
  template <class VP, class FS>
  static __device__ __forceinline__ void tile(const DecodeParams& p, const VP& v, const Slot* cur,
                                              const KV* ks, const KV* vs, int start, int n_valid,
                                              const u32 (&qf)[D / 16][4], const float (&qsc)[2],
                                              float (&oacc)[DW / 8][4], float (&m)[2], float (&dsum)[2], float (&mb)[2],
                                              FS& fs) {
    if constexpr (kFp8) {
      tile_fp8(p, v, cur, ks, vs, start, n_valid, qf, qsc, oacc, m, dsum, mb);
      return;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wkv = warp % kWarpsKV, wd = warp / kWarpsKV;
    const int gid = lane / 4;
    float s[2][4];  // two n8 tiles: tokens 0-7, 8-15 of the warp
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    const u32 kbase = mma::smem_addr(ks);
    const int krow = wkv * 16 + lane % 8 + 8 * (lane / 16);
    if constexpr (kFrag && V::kKeyTransform) {
      // the warp's 16 keys whole (all k-steps), rotated in registers, then Q·K^T in the same k-step order
      u32 b[D / 16][4];
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        mma::ldmatrix_x4(b[kk], kbase + Swizzle<kChunks>::byte_offset(krow, 2 * kk + (lane / 8) % 2));
      }
      fs.template keys<KV>(v, row(cur, cur->kv_head * G), b, start + wkv * 16 + gid, lane % 4);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) mma::mma_m16n16k16<Q>(s[0], s[1], qf[kk], b[kk]);
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        u32 b[4];
        mma::ldmatrix_x4(b, kbase + Swizzle<kChunks>::byte_offset(krow, 2 * kk + (lane / 8) % 2));
        mma::mma_m16n16k16<Q>(s[0], s[1], qf[kk], b);
      }
    }
    const int h0 = cur->kv_head * G + cur->qo_tile * 16 + gid;  // query heads of this thread's rows: h0, h0 + 8
    const variant::Index ix[2] = {row(cur, h0), row(cur, h0 + 8)};
    if constexpr (V::kSoftmax) {
      softmax(p, v, ix, s, start, n_valid, oacc, m, dsum);
    } else {
      weights(p, v, ix, s, start, n_valid, dsum);
    }
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
  }

  // S -> P in place against the rows' exponent bases (rows gid and gid + 8: e / 2), added to the row sums (padding
  // rows gid + 8, kHalves = 1: P = 0).
  template <int NT>
  static __device__ __forceinline__ void exp_rows(float (&s)[NT][4], const float (&base)[2], float (&dsum)[2]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (e < 2 * kHalves) {
          s[nt][e] = fmath::ex2(s[nt][e] - base[e / 2]);
          dsum[e / 2] += s[nt][e];
        } else {
          s[nt][e] = 0.f;
        }
      }
    }
  }

  // o's accumulators of rows gid (elements 0, 1) and gid + 8 (2, 3) times the rows' factors (not the padding rows').
  static __device__ __forceinline__ void rescale_o(float (&oacc)[DW / 8][4], const float (&f)[2]) {
#pragma unroll
    for (int j = 0; j < DW / 8; ++j) {
      oacc[j][0] *= f[0];
      oacc[j][1] *= f[0];
      if constexpr (kHalves == 2) {
        oacc[j][2] *= f[1];
        oacc[j][3] *= f[1];
      }
    }
  }

  // The online softmax of this warp's S (NT n8 tiles: rows gid and gid + 8 of the tile, keys start + wkv *
  // kWarpTokens ...): logits through the variant, max, rescale of o and the row sums, S -> P in place.
  template <int NT, class VP>
  static __device__ __forceinline__ void softmax(const DecodeParams& p, const VP& v, const variant::Index (&ix)[2],
                                                 float (&s)[NT][4], int start, int n_valid, float (&oacc)[DW / 8][4],
                                                 float (&m)[2], float (&dsum)[2]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wkv = warp % kWarpsKV;
    const int tig = lane % 4;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2 * kHalves; ++e) {
        const int r = wkv * kWarpTokens + nt * 8 + 2 * tig + (e & 1);
        s[nt][e] = logit<V>(p, v, ix[e / 2], s[nt][e], start + r, r < n_valid);
        mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }
    }
    float base[2] = {0.f, 0.f}, scale[2] = {1.f, 1.f};
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const float m_new = fmaxf(m[h], mma::quad_max(mx[h]));
      base[h] = m_new == neg_inf() ? 0.f : m_new;
      scale[h] = fmath::ex2(m[h] - base[h]);
      m[h] = m_new;
      dsum[h] *= scale[h];
    }
    exp_rows(s, base, dsum);
    rescale_o(oacc, scale);
  }

  // softmax() for tile_fp8, with a lazy reference max (as the sm80 prefill's softmax_exact): m moves only when a
  // tile's max exceeds it by more than kRescaleSlack base-2 units, so p = 2^(x - m) <= 2^8 (exact in fp32, and in the
  // float16 P fragments as any p: 11 significant bits) while o, the row sums and the lse share that m, which is all
  // the result and the merges need. Past an item's first tiles m rarely moves, so the rescale of o (DW / 2 multiplies
  // per thread) is skipped for the whole warp on almost every tile. Without a logits transform the logits arrive
  // already scaled to base 2 (tile_fp8) and only the masks apply here.
  static constexpr float kRescaleSlack = 8.f;
  template <int NT, class VP>
  static __device__ __forceinline__ void softmax_fp8(const DecodeParams& p, const VP& v, const variant::Index (&ix)[2],
                                                     float (&s)[NT][4], int start, int n_valid,
                                                     float (&oacc)[DW / 8][4], float (&m)[2], float (&dsum)[2],
                                                     float (&mb)[2]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wkv = warp % kWarpsKV;
    const int tig = lane % 4;
    float mx[2];
    if (!V::kLogits && !V::kMask && (wkv + 1) * kWarpTokens <= n_valid) {
      // (all of the warp's keys are real and nothing masks them: the logits as they are; most tiles). The max starts
      // at the first logits, not at -inf: fmaxf drops a NaN, so the two differ only where all of a thread's logits are
      // NaN (NaN here, -inf there), and fmaxf(m, quad max) below is m either way.
      mx[0] = fmaxf(s[0][0], s[0][1]);
      mx[1] = fmaxf(s[0][2], s[0][3]);
#pragma unroll
      for (int nt = 1; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2 * kHalves; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }
    } else {
      mx[0] = mx[1] = neg_inf();
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2 * kHalves; ++e) {
          const int r = wkv * kWarpTokens + nt * 8 + 2 * tig + (e & 1);
          if constexpr (V::kLogits) {
            s[nt][e] = logit<V>(p, v, ix[e / 2], s[nt][e], start + r, r < n_valid);
          } else {
            s[nt][e] = masked_logit<V>(v, ix[e / 2], s[nt][e], start + r, r < n_valid);
          }
          mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
        }
      }
    }
    float alpha[2] = {1.f, 1.f};
    bool moved = false;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const float m_old = m[h];
      const float t = fmaxf(m_old, mma::quad_max(mx[h]));
      // A row's first finite max always moves m (inf > slack); a row with no key yet keeps m = -inf (-inf - -inf is
      // NaN: not moved) and 0 as the exponent base mb, so ex2 never sees -inf - -inf. A row moving off -inf has o = 0.
      // mb is m where m is finite, so it moves with m (a moved m is t > m_old + slack, never -inf) and else stays:
      // kept beside m, it takes one select instead of a compare and a select per tile.
      const bool row_moved = t - m_old > kRescaleSlack;
      m[h] = row_moved ? t : m_old;
      mb[h] = row_moved ? t : mb[h];
      moved |= row_moved && m_old != neg_inf();
      alpha[h] = row_moved ? fmath::ex2(m_old - mb[h]) : 1.f;
      dsum[h] *= alpha[h];
    }
    exp_rows(s, mb, dsum);
    if (__any_sync(0xffffffffu, moved)) rescale_o(oacc, alpha);
  }

  // Without softmax: the variant's weights of this warp's S (NT n8 tiles), in place, summed into the row sums.
  template <int NT, class VP>
  static __device__ __forceinline__ void weights(const DecodeParams& p, const VP& v, const variant::Index (&ix)[2],
                                                 float (&s)[NT][4], int start, int n_valid, float (&dsum)[2]) {
    const int wkv = (threadIdx.x / 32) % kWarpsKV, tig = threadIdx.x % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = wkv * kWarpTokens + nt * 8 + 2 * tig + (e & 1);
        if (e < 2 * kHalves) {
          s[nt][e] = weight<V>(p, v, ix[e / 2], s[nt][e], start + r, r < n_valid);
          dsum[e / 2] += s[nt][e];
        } else {
          s[nt][e] = 0.f;  // (padding rows)
        }
      }
    }
  }

  // tile() for fp8 K/V, in float16 whatever Q is: S for this warp's kWarpTokens tokens (kNT n8 tiles; K fragments from
  // one ldmatrix per 32 keys and k-step, fp8::k_pairs: the keys times 2^-kPowK against load_q's float16 Q rows
  // times 2^qe) times the rows' logit scales (qsc, formed by load_q: the KV head's k scale, 2^kPowK, 2^-qe and
  // sm_scale·log2 e; one multiply per logit), the online softmax (softmax_fp8) or the weights as in tile(), then P·V
  // a 16-token k-step at a time with P in float16 (V fragments from one ldmatrix.trans per 16 tokens and 32 output
  // dims, fp8::v_pairs: times 2^-kPow, which the kernel takes back with the v scale at the item's end; the
  // accumulators in the even / odd order of fp8::v_frag).
  static constexpr int kPow = fp8::F16sV<KV>::kPow;   // V's fragments: times 2^-kPow
  static constexpr int kPowK = fp8::F16sK<KV>::kPow;  // K's fragments: times 2^-kPowK
  template <class VP>
  static __device__ __forceinline__ void tile_fp8(const DecodeParams& p, const VP& v, const Slot* cur,
                                                  const KV* ks, const KV* vs, int start, int n_valid,
                                                  const u32 (&qf)[D / 16][4], const float (&qsc)[2],
                                                  float (&oacc)[DW / 8][4], float (&m)[2], float (&dsum)[2],
                                                  float (&mb)[2]) {
    constexpr int kNT = kWarpTokens / 8;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // (one warp along the dims: wd is 0, which the compiler cannot see from threadIdx, and with it the V ldmatrix
    // addresses' swizzle terms fold to constants)
    const int wkv = warp % kWarpsKV, wd = kWarpsD == 1 ? 0 : warp / kWarpsKV;
    const int gid = lane / 4;
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    const u32 kbase = mma::smem_addr(ks);
#pragma unroll
    for (int kg = 0; kg < kWarpTokens / 32; ++kg) {
      // lanes 8i .. 8i+7 address keys 8i .. 8i+7 of this group of 32: register i is n8 tile 4 kg + i
      const u32 a0 = kbase + Swizzle<kChunks8>::byte_offset(wkv * kWarpTokens + kg * 32 + lane, 0);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        u32 r[4];
        mma::ldmatrix_x4(r, ChunkAddr<kChunks8>::at(a0, kk));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          u32 b[2];
          fp8::k_pairs<KV>(r[i], b[0], b[1]);
          mma::mma_m16n8k16<half>(s[4 * kg + i], qf[kk], b);
        }
      }
    }
    const int h0 = cur->kv_head * G + cur->qo_tile * 16 + gid;  // query heads of this thread's rows: h0, h0 + 8
    const variant::Index ix[2] = {row(cur, h0), row(cur, h0 + 8)};
    // Without a logits transform the base-2 logit is raw · (k scale · 2^kPowK · 2^-qe · sm_scale · log2 e): one
    // multiply per logit by the row's scale, formed once per item by load_q (the scales are powers of two but the k
    // scale and sm_scale, so with numbers for the scales the product is the 16-bit kernels' raw · logits_scale
    // exactly).
    const float rs0 = qsc[0], rs1 = qsc[1];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) s[nt][0] *= rs0, s[nt][1] *= rs0, s[nt][2] *= rs1, s[nt][3] *= rs1;
    if constexpr (V::kSoftmax) {
      softmax_fp8(p, v, ix, s, start, n_valid, oacc, m, dsum, mb);
    } else {
      weights(p, v, ix, s, start, n_valid, dsum);
    }
    const u32 vbase = mma::smem_addr(vs);
    // lanes 8i .. 8i+7: tokens 8 (i % 2) .. + 7 of a 16-token step, chunk 2 s + i / 2
    const u32 va = LdmatrixAddr<kChunks8>::make(vbase, wkv * kWarpTokens + lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
#pragma unroll
    for (int st = 0; st < kWarpTokens / 16; ++st) {
      u32 pa[4];
      mma::frag_c_to_a<half>(pa, s[2 * st], s[2 * st + 1]);
#pragma unroll
      for (int cp = 0; cp < DW / 32; ++cp) {
        u32 r[4];
        mma::ldmatrix_x4_trans(r, LdmatrixAddr<kChunks8>::at(va, (wd * DW) / 32 + cp, st * 16));
        u32 e0, o0, e1, o1, e2, o2, e3, o3;
        fp8::v_pairs<KV>(r[0], e0, o0);  // tokens 0-7, chunk 2 cp: bytes (0, 2) even tile, (1, 3) odd tile
        fp8::v_pairs<KV>(r[1], e1, o1);  // tokens 8-15
        fp8::v_pairs<KV>(r[2], e2, o2);  // tokens 0-7, chunk 2 cp + 1
        fp8::v_pairs<KV>(r[3], e3, o3);
        const u32 be[2] = {e0, e1}, bo[2] = {o0, o1}, be2[2] = {e2, e3}, bo2[2] = {o2, o3};
        mma::mma_m16n8k16<half>(oacc[4 * cp + 0], pa, be);
        mma::mma_m16n8k16<half>(oacc[4 * cp + 1], pa, bo);
        mma::mma_m16n8k16<half>(oacc[4 * cp + 2], pa, be2);
        mma::mma_m16n8k16<half>(oacc[4 * cp + 3], pa, bo2);
      }
    }
  }

  // The item's last tile: merge the warps' states through this tile's stage (free once every warp is done reading
  // it), write o / lse or the partial rows (a split piece: its count and merge follow, PendingPiece).
  template <class VP>
  static __device__ __forceinline__ void finish_item(const DecodeParams& p, const VP& v, const Slot* cur,
                                                     KV* ks, float* md, float (&oacc)[DW / 8][4], const float (&m)[2],
                                                     const float (&dsum)[2]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wkv = warp % kWarpsKV, wd = warp / kWarpsKV;
    const int gid = lane / 4, tig = lane % 4;
    if constexpr (kFp8) {
#pragma unroll
      for (int c = 0; c < DW / 16; ++c) fp8::pv_acc_to_natural(oacc[2 * c], oacc[2 * c + 1], tig);
    }
    __syncthreads();  // every warp is done reading this tile's stage: reuse it as merge scratch
    float* os = reinterpret_cast<float*>(ks);  // [kWarpsKV][16][D]
    const float d0 = mma::quad_sum(dsum[0]), d1 = mma::quad_sum(dsum[1]);
    // Only the tile's real rows (query heads row0 + r < G) are staged: the merge below reads no others, and with
    // G = 4 that is a quarter of the scratch traffic of all 16 mma rows.
    const bool lo_row = cur->qo_tile * 16 + gid < G, hi_row = cur->qo_tile * 16 + gid + 8 < G;
#pragma unroll
    for (int j = 0; j < DW / 8; ++j) {
      const int col = wd * DW + j * 8 + 2 * tig;
      if (lo_row) *reinterpret_cast<float2*>(os + (wkv * 16 + gid) * D + col) = make_float2(oacc[j][0], oacc[j][1]);
      if (hi_row) {
        *reinterpret_cast<float2*>(os + (wkv * 16 + gid + 8) * D + col) = make_float2(oacc[j][2], oacc[j][3]);
      }
    }
    if (wd == 0 && tig == 0) {
      // (without softmax every warp's state is a sum: reference 0, merged with weight 1)
      md[(wkv * 16 + gid) * 2] = V::kSoftmax ? m[0] : 0.f;
      md[(wkv * 16 + gid) * 2 + 1] = d0;
      md[(wkv * 16 + gid + 8) * 2] = V::kSoftmax ? m[1] : 0.f;
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
        state::Merger<8> mg;
        mg.init(mxr);
#pragma unroll
        for (int w = 0; w < kWarpsKV; ++w) {
          float x[8];
          load8(os + (w * 16 + r) * D + c * 8, x);
          mg.add(mg.weight(md[(w * 16 + r) * 2]), md[(w * 16 + r) * 2 + 1], x);  // an empty warp (-inf) weighs 0
        }
        const variant::Index ix = row(cur, cur->kv_head * G + row0 + r);  // (sink, output transform)
        const float lse = finish_state<V>(v, ix, mg, cur->partial < 0);
        const int prow = cur->partial < 0 ? -1 : cur->partial + r;
        store_row<V, O, D, kLse>(p, v, ix, cur->req, cur->kv_head * G + row0 + r, prow, c * 8, mg.acc, lse, c == 0);
      }
    }
    // (a split piece's count and merge follow in the kernel's loop: PendingPiece)
  }
};

// A split piece of the tensor-core kernel between its partial stores and its merge (math.cuh, merge_split), carried
// over the next tiles so that no warp waits for a memory round trip where the piece ends: its count is issued at the
// end of the iteration after its last tile (the partial stores ordered by that iteration's top barrier, and
// acknowledged while the tile's math ran), the count's answer read at the end of the next iteration (thread 0 writes
// the flag), and the merge, when the piece was its unit's last, runs at the next item boundary (or the CTA's end),
// where the item's accumulators are dead. A boundary that comes sooner settles the piece at once. One piece waits at
// a time. The flag and the piece's unit live in shared memory (`area`: the flag, then the SplitUnit, at a constant
// offset), so that only the stage and thread 0's count `old` stay in registers across the tiles (the RoPE kernels
// are at the register limit); block-uniform but `old`. (The tile code stays outside any branch that rejoins the
// boundary code: a loop whose tiles ran under `if (!null)` took WARPSYNC / ENDCOLLECTIVE around every shuffle.)
struct PendingPiece {
  // kEnded: stored this iteration; kStored: an iteration's top barrier has ordered the stores since
  enum Stage : int { kNone, kEnded, kStored, kCounted, kFlagged };
  int stage = kNone, old = 0;

  static __device__ __forceinline__ SplitUnit* unit(int* area) { return reinterpret_cast<SplitUnit*>(area + 1); }

  // A piece's partials were stored in this iteration (K::finish_item; no piece is waiting: settle ran).
  __device__ __forceinline__ void stored(int* area, const SplitUnit& u) {
    if (threadIdx.x == 0) *unit(area) = u;  // (read by thread 0 alone until a barrier)
    stage = kEnded;
  }
  // End of an iteration: count a piece stored in an earlier one, or flag a counted one.
  __device__ __forceinline__ void advance(const DecodeParams& p, int* area) {
    if (stage == kCounted) {
      if (threadIdx.x == 0) area[0] = last_piece(p, unit(area)->unit, unit(area)->pieces, old);
      stage = kFlagged;
    } else if (stage == kStored) {
      if (threadIdx.x == 0) old = count_piece(p, unit(area)->unit);
      stage = kCounted;
    } else if (stage == kEnded) {
      stage = kStored;
    }
  }
  // At an item boundary (all threads): finish the waiting piece, counting it and reading the answer now where the
  // loop has not yet, and merge its unit if it was the last piece. (The uncounted case repeats merge_split's count
  // rather than calling it: two merge_rows call sites inline the merge twice, +18 % SASS in the tensor-core kernels.)
  template <class V, typename O, int D, bool kLse, int kThreads, int kLoadAll, class VP>
  __device__ __forceinline__ void settle(const DecodeParams& p, const VP& v, int* area) {
    if (stage == kNone) return;
    if (stage != kFlagged) {
      if (stage == kCounted) {
        if (threadIdx.x == 0) area[0] = last_piece(p, unit(area)->unit, unit(area)->pieces, old);
      } else {
        __syncthreads();  // (the partial stores before the count)
        if (threadIdx.x == 0) area[0] = count_last_piece(p, unit(area)->unit, unit(area)->pieces);
      }
      __syncthreads();
    }  // (a flag and unit written before an earlier iteration's top barrier are visible since)
    stage = kNone;
    if (area[0]) merge_rows<V, O, D, kLse, kThreads, kLoadAll>(p, v, *unit(area));
    __syncthreads();  // (every thread has read the flag and the unit before thread 0 may write them again)
  }
};

template <typename Q, typename KV, typename O, int D, int G, int kWarpsKV, int kWarpsD, int kWarpTokens, int kStages,
          int kMinBlocks, class V, bool kLse>
__global__ void __launch_bounds__(32 * kWarpsKV * kWarpsD, kMinBlocks)
    batch_decode_tensor_core(const __grid_constant__ DecodeParams p, const __grid_constant__ VariantParams v) {
  static_assert(is_same<Q, KV>::value || fp8::IsFp8<KV>::value,
                "tensor cores take q and KV of one 16-bit type, or fp8 KV converted to q's type");
  static_assert(!((V::kKeyTransform || V::kValueTransform) && sizeof(KV) == 1),
                "key / value transforms of fp8 K / V tiles (in shared memory) are not supported");
  using K = TensorCore<Q, KV, O, D, G, kWarpsKV, kWarpsD, kWarpTokens, V, kLse>;
  constexpr int T = K::T;
  using Pipe = Pipeline<KV, D, T, kStages, K::kThreads, V, G, 16, K::kPairs>;
  static_assert(Pipe::kStageBytes >= 16LL * kWarpsKV * D * 4, "the merge scratch fits in one KV stage");

  extern __shared__ __align__(128) unsigned char smem[];
  Q* qs = reinterpret_cast<Q*>(smem + Pipe::kBytes);                               // [16][D], swizzled
  float* md = reinterpret_cast<float*>(smem + Pipe::kBytes + 16 * D * sizeof(Q));  // [kWarpsKV * 16][2]
  // PendingPiece's flag and unit (policy.py: 32 bytes)
  int* const pending_area = reinterpret_cast<int*>(md + kWarpsKV * 16 * 2);
  static_assert(sizeof(SplitUnit) + sizeof(int) <= 32, "the pending piece's shared memory");

  CUINFER_DECODE_GSTAMP(0);
  CUINFER_DECODE_STAMP(1);
  Pipe pipe;
  pipe.start(p, v, smem);
  CUINFER_DECODE_STAMP(2);

  // The q / k transforms' states of this thread's dims (RoPE frequencies): on the mma fragments (K::kFrag: one warp
  // along the dims, no barrier) or in shared memory, where with one warp along the dims and no value transform each
  // warp rotates the 16 keys only it reads, and a warp barrier replaces the block's.
  constexpr bool kWarpKeys = kWarpsD == 1 && !V::kValueTransform;
  variant::KeyStates<V, D, kWarpKeys ? 32 : K::kThreads, kWarpKeys ? 16 : T> kst;
  using Frag = variant::FragStates<V, D, T>;
  Frag fst;
  if constexpr (K::kFrag) {
    __shared__ typename Frag::Tables frag_tables;
    fst.init(v, &frag_tables, threadIdx.x, K::kThreads);
    __syncthreads();
  } else if constexpr (V::kKeyTransform || V::kQueryTransform) {
    kst.init(v, threadIdx.x);
  }

  u32 qf[D / 16][4];
  float qsc[2] = {1.f, 1.f};  // fp8: the rows' logit scales, the inverse q scales among them (load_q)
  float oacc[K::DW / 8][4];
  float m[2] = {neg_inf(), neg_inf()}, dsum[2] = {0.f, 0.f};
  float mb[2] = {0.f, 0.f};  // fp8: the rows' exponent bases, m or 0 while m is -inf (softmax_fp8)

  // (the RoPE kernels' fragment states hold their registers: the merge's loads one piece at a time there)
  constexpr int kMergeLoads = K::kFrag ? 0 : 2;
  // Measured on the H200 (docs/results/h200-2026-12-04c): carried pieces made bf16 D9 4-5 % faster but the fp8 cases
  // D10, D5-e4m3, D9-e4m3 ~1 % slower; fp8 K / V settle each piece where it ends, as before
  constexpr bool kDeferPieces = !K::kFp8;
  PendingPiece pend;
  for (int n = 0;; ++n) {
    const typename K::Slot* cur = pipe.wait(n);
    const int flags = cur->flags;
    if (n == 0) CUINFER_DECODE_STAMP(3);
    if (flags & kNull) {
      CUINFER_DECODE_STAMP(5);
      CUINFER_DECODE_GSTAMP(6);
      CUINFER_DECODE_SMID(7);
      break;
    }
    const int start = cur->start, n_valid = cur->n_valid;
    pipe.advance(p, v, n);
    KV* ks = pipe.k_stage(n);
    KV* vs = pipe.v_stage(n);

    if (flags & kFirst) {
      if constexpr (K::kFrag) {
        K::load_q(p, v, cur, qs, qf, qsc, fst);
      } else {
        K::load_q(p, v, cur, qs, qf, qsc, kst.s);
      }
      m[0] = m[1] = neg_inf();
      mb[0] = mb[1] = 0.f;
      dsum[0] = dsum[1] = 0.f;
#pragma unroll
      for (int j = 0; j < K::DW / 8; ++j) oacc[j][0] = oacc[j][1] = oacc[j][2] = oacc[j][3] = 0.f;
    }
    CUINFER_DECODE_TILE_BEGIN();
    if constexpr (V::kKeyTransform || V::kValueTransform) {
      if constexpr (V::kKeyTransform && !K::kFrag) {
        const int w = kWarpKeys ? threadIdx.x / 32 : 0;  // (keys 16w.. of the tile: warp w's)
        kst.transform_tile(v, K::row(cur, cur->kv_head * G), ks + w * 16 * D, start + 16 * w, n_valid - 16 * w,
                           kWarpKeys ? threadIdx.x % 32 : threadIdx.x);
      }
      if constexpr (V::kValueTransform) {
        const variant::Index vix{cur->req, -1, -1, -1, cur->kv_head, 1, cur->kv_len, D};  // (no query: see contract)
        variant::value_transform_tile<V, D, K::kThreads>(v, vix, vs, start, n_valid, threadIdx.x);
      }
      if constexpr (K::kFrag && !V::kValueTransform) {
        // (keys rotate in registers inside tile(): nothing written here)
      } else if constexpr (kWarpKeys) {
        __syncwarp();
      } else {
        __syncthreads();
      }
    }
    K::tile(p, v, cur, ks, vs, start, n_valid, qf, qsc, oacc, m, dsum, mb, fst);
    CUINFER_DECODE_TILE_END();
    pipe.finish(p, n);
    if (flags & kLast) {
      CUINFER_DECODE_STAMP(4);
      if constexpr (K::kFp8) {
        // (V's fragments were times 2^-kPow: tile_fp8)
        const float vsc = head_scale(p.v_scales, p.v_scales_stride, cur->kv_head) * float(1 << K::kPow);
#pragma unroll
        for (int j = 0; j < K::DW / 8; ++j) oacc[j][0] *= vsc, oacc[j][1] *= vsc, oacc[j][2] *= vsc, oacc[j][3] *= vsc;
      }
      K::finish_item(p, v, cur, ks, md, oacc, m, dsum);
      // an item boundary: the waiting split piece is settled (where the item's accumulators are dead), and a piece
      // that ended here starts waiting; fp8 K / V settle it at once (kDeferPieces)
      if constexpr (kDeferPieces) pend.template settle<V, O, D, kLse, K::kThreads, kMergeLoads>(p, v, pending_area);
      if (cur->merge >= 0) {
        const int row0 = cur->qo_tile * 16;
        pend.stored(pending_area, {cur->merge, cur->pieces, min(16, G - row0), cur->req, cur->kv_head * G + row0,
                                   cur->kv_head, cur->kv_len});
      }
      if constexpr (!kDeferPieces) pend.template settle<V, O, D, kLse, K::kThreads, kMergeLoads>(p, v, pending_area);
    }
    if constexpr (kDeferPieces) pend.advance(p, pending_area);
  }
  pend.template settle<V, O, D, kLse, K::kThreads, kMergeLoads>(p, v, pending_area);  // (the CTA's end)
}

}  // namespace decode
}  // namespace cuinfer
