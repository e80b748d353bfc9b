// The shared math of the batch-decode kernels (attention/decode/kernels.cuh): the logit of one key through the
// variant, writing an output row (or an fp32 partial state), the in-kernel merge of split requests.
#pragma once
#include "attention/decode/pipeline.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"
#include "state/merge.cuh"
#include "variants/contract.cuh"

namespace cuinfer {
namespace decode {

// ---- shared pieces of the math -------------------------------------------------------------------------------------

template <typename T> __device__ __forceinline__ void zero_vec(Vec<T, 16 / sizeof(T)>& v) {
  *reinterpret_cast<uint4*>(v.v) = make_uint4(0u, 0u, 0u, 0u);
}

// Final logit (base 2) of raw q·k for key position j of row ix; masked keys (and tile padding: !keep) get -inf.
// Without a logits transform sm_scale·log2(e) is one multiply (logits_scale); with one, the variant sees the natural
// logit and the result is scaled to base 2.
template <class V, class VP>
__device__ __forceinline__ float logit(const DecodeParams& p, const VP& v, const variant::Index& ix, float raw, int j,
                                       bool keep) {
  float t;
  if constexpr (V::kLogits) {
    t = V::logits(v, ix, V::row_state(v, ix), j, static_cast<float>(j - ix.qpos), raw * p.sm_scale) * kLog2e;
  } else {
    t = raw * p.logits_scale;
  }
  if constexpr (V::kMask) keep = keep && V::mask(v, ix, j);
  return keep ? t : neg_inf();
}

// logit() for a logit already scaled to base 2 (no logits transform: V::kLogits false): the masks only.
template <class V, class VP>
__device__ __forceinline__ float masked_logit(const VP& v, const variant::Index& ix, float t, int j, bool keep) {
  static_assert(!V::kLogits, "a logits transform sees the natural logit: logit()");
  if constexpr (V::kMask) keep = keep && V::mask(v, ix, j);
  return keep ? t : neg_inf();
}

// No softmax (V::kSoftmax false): the weight of key j is the variant's logits output; masked keys and padding weigh 0.
template <class V, class VP>
__device__ __forceinline__ float weight(const DecodeParams& p, const VP& v, const variant::Index& ix, float raw, int j,
                                        bool keep) {
  const float w = V::logits(v, ix, V::row_state(v, ix), j, static_cast<float>(j - ix.qpos), raw * p.sm_scale);
  if constexpr (V::kMask) keep = keep && V::mask(v, ix, j);
  return keep ? w : 0.f;
}

// The lse of a row's merged state and its o normalised in place: the softmax's (with the row's sink folded in when
// the row is final, i.e. not a partial state of a split), or the plain sum without softmax.
template <class V, class VP>
__device__ __forceinline__ float finish_state(const VP& v, const variant::Index& ix, state::Merger<8>& mg,
                                              bool final) {
  if constexpr (!V::kSoftmax) {
    return mg.finish_sum();
  } else {
    if constexpr (V::kSink) {
      if (final) mg.add_sink(variant::sink_log2<V>(v, ix));
    }
    return mg.finish();
  }
}

// Write 8 dims [dim0, dim0+8) of one output row: straight to o (and lse) for an unsplit item, through the variant's
// output transform, or as an fp32 partial row of the workspace for a split one. `x` is already normalised (v_scale is
// applied here); `lead` is the one thread that writes the lse; `ix` is the row's index (for the output transform).
template <class V, typename O, int D, bool kLse, class VP>
__device__ __forceinline__ void store_row(const DecodeParams& p, const VP& v, const variant::Index& ix, int req,
                                          int qo_head, int prow, int dim0, const float (&x)[8], float lse, bool lead) {
  if (prow < 0) {
    Vec<O, 8> ov;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float y = x[i] * p.v_scale;
      if constexpr (V::kOutputTransform) y = V::output_transform(v, ix, dim0 + i, y, lse);
      ov[i] = from_float<O>(y);
    }
    ov.store_global(reinterpret_cast<O*>(p.o) + i64(req) * p.o_stride_b + i64(qo_head) * p.o_stride_h + dim0);
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

// The variant's index of a decode row: query head `head` of request `req` (at kv position kv_len - 1).
template <int D>
__device__ __forceinline__ variant::Index row_index(int req, int head, int kv_head, int kv_len) {
  return variant::Index{req, 0, kv_len - 1, head, kv_head, 1, kv_len, D};
}

// The in-kernel merge of a split (request, KV head): each piece stores its rows as fp32 partial states (store_row),
// then counts itself in the unit's counter; the CTA that brings the count to the unit's piece count merges all
// pieces into o / lse and resets the counter to 0 for the next launch (so a CUDA graph replays it as is). No second
// kernel, no launch gap, and the partial rows are read while they are still in L2.
//   Partial rows: piece j of the unit starting at row U holds its `rows` rows at U + j * rows (planner/merge.py).
//   Memory order (the semaphore pattern of CUTLASS's generic barrier, with thread 0 for the block): a barrier after
//   the block's partial stores, then thread 0's release fence and count (count_piece: the fence is cumulative, so it
//   orders the stores the barrier ordered before it); the last piece's thread 0 takes an acquire fence
//   (last_piece) and a barrier follows before the block reads the other pieces' rows, with ld.global.cg (L2, never
//   a stale L1 line). The count is a relaxed atomic: its answer is needed only by last_piece, which the
//   tensor-core kernel calls a tile later (its pending piece: kernels.cuh), so no warp waits for the round trip.
// The merged rows are final: a sink is folded in here (once per row), the output transform applied. Without softmax
// the pieces' sums add (weights 1, lse log2 of the summed weights).

// One split piece's unit, as its merge needs it (block-uniform).
struct SplitUnit {
  int unit, pieces, rows, req, head0, kv_head, kv_len;
};

// Thread 0, after a barrier that follows the block's partial stores: release them and count the piece. Returns the
// count before it (the caller may read it much later: nothing waits for the atomic until then).
__device__ __forceinline__ int count_piece(const DecodeParams& p, int unit) {
  int* count = reinterpret_cast<int*>(p.merge_count) + unit;
  int old;
  asm volatile("fence.acq_rel.gpu;\n\tatom.relaxed.gpu.global.add.s32 %0, [%1], 1;\n"
               : "=r"(old)
               : "l"(count)
               : "memory");
  return old;
}

// Thread 0, with count_piece's answer: whether the piece was its unit's last; the last one resets the counter for the
// next launch (every piece has counted itself) and acquires the other pieces' stores (a barrier must follow before
// the block reads them).
__device__ __forceinline__ bool last_piece(const DecodeParams& p, int unit, int pieces, int old) {
  const bool last = old == pieces - 1;
  if (last) {
    reinterpret_cast<int*>(p.merge_count)[unit] = 0;
    asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  }
  return last;
}

// Thread 0, both at once where the answer is needed now (the synchronous merge): one acq_rel atomic (one MEMBAR
// before it; count_piece then last_piece take a second MEMBAR for the last piece). Measured with count_piece and
// last_piece in the CUDA-core kernel: fp8 D10 / D5-e4m3 / D9-e4m3 1.5-2 % slower (h200-2026-12-04c, call 6).
__device__ __forceinline__ bool count_last_piece(const DecodeParams& p, int unit, int pieces) {
  int* count = reinterpret_cast<int*>(p.merge_count) + unit;
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(count) : "memory");
  const bool last = old == pieces - 1;
  if (last) *count = 0;
  return last;
}

// Merge the unit's pieces into o / lse (the last piece's block, after last_piece and a barrier; all threads call it).
// With softmax and at most kLoadAll pieces every thread issues all its loads (the pieces' lse and rows) before using
// any: one memory round trip instead of two (0: never; kernels at the register limit, whose 18 more live values
// would spill).
template <class V, typename O, int D, bool kLse, int kThreads, int kLoadAll = 2, class VP>
__device__ __forceinline__ void merge_rows(const DecodeParams& p, const VP& v, const SplitUnit& s) {
  constexpr int kN = kLoadAll > 0 ? kLoadAll : 1;
  const int rows = s.rows, pieces = s.pieces;
  const float* plse = reinterpret_cast<const float*>(p.partial_lse) + s.unit;
  const float* po = reinterpret_cast<const float*>(p.partial_o) + i64(s.unit) * D;
  constexpr int kChunks = D / 8;
  for (int u = threadIdx.x; u < rows * kChunks; u += kThreads) {
    const int x = u / kChunks, c = u % kChunks;
    state::Merger<8> mg;
    float lse;
    if constexpr (V::kSoftmax) {
      if (kLoadAll > 0 && pieces <= kLoadAll) {
        float l[kN];
        float4 lo[kN], hi[kN];
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          if (j < pieces) {
            const float4* src = reinterpret_cast<const float4*>(po + i64(j * rows + x) * D + c * 8);
            l[j] = __ldcg(plse + j * rows + x);
            lo[j] = __ldcg(src);
            hi[j] = __ldcg(src + 1);
          }
        }
        float mx = neg_inf();
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          if (j < pieces) mx = fmaxf(mx, l[j]);
        }
        mg.init(mx);
        if (mx != neg_inf()) {
#pragma unroll
          for (int j = 0; j < kN; ++j) {
            if (j < pieces) {
              const float xs[8] = {lo[j].x, lo[j].y, lo[j].z, lo[j].w, hi[j].x, hi[j].y, hi[j].z, hi[j].w};
              mg.add(mg.weight(l[j]), 1.f, xs);  // an empty piece (-inf) weighs 0
            }
          }
        }
      } else {
        float mx = neg_inf();
        for (int j = 0; j < pieces; ++j) mx = fmaxf(mx, __ldcg(plse + j * rows + x));
        mg.init(mx);
        if (mx != neg_inf()) {
          for (int j = 0; j < pieces; ++j) {
            const float w = mg.weight(__ldcg(plse + j * rows + x));  // an empty piece (-inf) weighs 0
            const float4* src = reinterpret_cast<const float4*>(po + i64(j * rows + x) * D + c * 8);
            const float4 lo = __ldcg(src), hi = __ldcg(src + 1);
            const float xs[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            mg.add(w, 1.f, xs);
          }
        }
      }
      if constexpr (V::kSink) {
        mg.add_sink(variant::sink_log2<V>(v, row_index<D>(s.req, s.head0 + x, s.kv_head, s.kv_len)));
      }
      lse = mg.finish();
    } else {
      mg.init(0.f);
      for (int j = 0; j < pieces; ++j) {
        const float l = __ldcg(plse + j * rows + x);
        if (l != neg_inf()) {  // (a piece without keys holds o = 0)
          const float4* src = reinterpret_cast<const float4*>(po + i64(j * rows + x) * D + c * 8);
          const float4 lo = __ldcg(src), hi = __ldcg(src + 1);
          const float xs[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          mg.add(1.f, fmath::ex2(l), xs);
        }
      }
      lse = mg.finish_sum();
    }
    if constexpr (V::kOutputTransform) {
      const variant::Index ix = row_index<D>(s.req, s.head0 + x, s.kv_head, s.kv_len);
#pragma unroll
      for (int i = 0; i < 8; ++i) mg.acc[i] = V::output_transform(v, ix, c * 8 + i, mg.acc[i], lse);
    }
    Vec<O, 8> ov;  // (the partials already carry v_scale)
#pragma unroll
    for (int i = 0; i < 8; ++i) ov[i] = from_float<O>(mg.acc[i]);
    const int head = s.head0 + x;
    ov.store_global(reinterpret_cast<O*>(p.o) + i64(s.req) * p.o_stride_b + i64(head) * p.o_stride_h + c * 8);
    if constexpr (kLse) {
      if (c == 0) reinterpret_cast<float*>(p.lse)[i64(s.req) * p.lse_stride_b + i64(head) * p.lse_stride_h] = lse;
    }
  }
}

// The whole of it at once, right after the piece's partial stores: count, and merge if this piece was the last. All
// threads call it; `flag` is one int of shared memory.
template <class V, typename O, int D, bool kLse, int kThreads, class VP>
__device__ __forceinline__ void merge_split(const DecodeParams& p, const VP& v, const SplitUnit& s, int* flag) {
  __syncthreads();
  if (threadIdx.x == 0) *flag = count_last_piece(p, s.unit, s.pieces);
  __syncthreads();
  if (*flag) merge_rows<V, O, D, kLse, kThreads>(p, v, s);
}

// 8 fp32 values from 16-byte aligned p (shared memory or an L1-cached global row).
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

}  // namespace decode
}  // namespace cuinfer
