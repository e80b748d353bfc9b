// The epilogues of the FA2-class prefill kernel: normalise the item's o rows and write them (16-bit o and fp32 lse
// straight to the outputs, or fp32 partial states of a split item for the merge kernel).
//
// The variant acts here on final rows: its sink is folded into each unsplit row and into the partial state of the
// first piece of a split row (once per row: the merge kernel then carries it), its output transform is applied to
// unsplit rows (plans with one are never split), and without softmax o is the weights' sum (not normalised).
//
//   * cross-item tiles (one warp per row block): straight from the registers, no barrier, 16 bytes per store: on
//     sm_90 each warp stages its rows in its own Q rows (stmatrix, then 16-byte reads), on sm_80 an in-quad transpose
//     of the accumulators gives the same pieces;
//   * small query tiles (WARPS_KV > 1, each warp a slice of the keys): the warps' states meet in shared memory and
//     merge there.
#pragma once
#include "attention/prefill_sm80/cta.cuh"
#include "attention/prefill_sm80/loader.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "debug/trace.cuh"
#include "plan/work.cuh"
#include "state/merge.cuh"
#include "variants/contract.cuh"

namespace cuinfer {
namespace prefill {

// Whether the epilogue builds each row's variant index (for the sink and the output transform).
template <class V> constexpr bool kRowIndex = V::kSink || V::kOutputTransform;
// Whether the variant changes a row's normalisation or lse (row_scale).
template <class V> constexpr bool kRescale = V::kSink || !V::kSoftmax;

// The factor that normalises a row's o~ and its lse, from the row's state (reference max m2 and weight sum d, base 2):
// the softmax's, with the row's sink folded in when `sink` (an unsplit row, or the first piece of a split one);
// without softmax 1 (o is the weights' sum) and lse = log2 d. (Called only by variants that change either:
// kRescale; the plain epilogue keeps its own two lines, and so its code.)
template <class V, class VP>
__device__ __forceinline__ float row_scale(const VP& v, const variant::Index& ix, float m2, float d, bool sink,
                                           float& lse) {
  if constexpr (!V::kSoftmax) {
    lse = state::lse_of(0.f, d);
    return 1.f;
  } else {
    if constexpr (V::kSink) {
      if (sink) return state::fold_sink(m2, d, variant::sink_log2<V>(v, ix), lse);
    }
    lse = state::lse_of(m2, d);
    return state::inv_of(d);
  }
}

// Output element `dim` of a final row: x scaled by inv, through the variant's output transform.
template <class V, class VP>
__device__ __forceinline__ float final_value(const VP& v, const variant::Index& ix, int dim, float x, float inv,
                                             float lse) {
  if constexpr (V::kOutputTransform) {
    return V::output_transform(v, ix, dim, x * inv, lse);
  } else {
    return x * inv;
  }
}

// 4 x 4 transpose of 32-bit words inside a lane quad (t = lane % 4): on entry a[k] is part t of block k, on exit a[k]
// is part k of block t. Two shuffle rounds: lanes t, t ^ 1 swap the words whose block and part differ in bit 0,
// then lanes t, t ^ 2 in bit 1. Every lane of the warp must call it.
__device__ __forceinline__ void quad_transpose(u32 a[4], int t) {
  u32 x0 = (t & 1) ? a[0] : a[1], x1 = (t & 1) ? a[2] : a[3];
  x0 = __shfl_xor_sync(0xffffffffu, x0, 1), x1 = __shfl_xor_sync(0xffffffffu, x1, 1);
  if (t & 1) {
    a[0] = x0, a[2] = x1;
  } else {
    a[1] = x0, a[3] = x1;
  }
  u32 y0 = (t & 2) ? a[0] : a[2], y1 = (t & 2) ? a[1] : a[3];
  y0 = __shfl_xor_sync(0xffffffffu, y0, 2), y1 = __shfl_xor_sync(0xffffffffu, y1, 2);
  if (t & 2) {
    a[0] = y0, a[1] = y1;
  } else {
    a[2] = y0, a[3] = y1;
  }
}

// Where tile row r of an item goes: packed row row0 + r is a token (its row of o) and a head of the group.
struct OutRows {
  int row0, kvh, qo_base, g;
  u32 g_mul, g_shift;
  int b, qo_len, kv_len;  // the request (for the variant's row index; 0 when the variant needs none: kRowIndex)
  __device__ __forceinline__ void at(int r, i64& row, int& head) const {
    const int pr = row0 + r;
    const int token = static_cast<int>(fast_div(static_cast<u32>(pr), g_mul, g_shift));
    head = kvh * g + (pr - token * g);
    row = qo_base + token;
  }
  // The variant's index of tile row r.
  template <int D> __device__ __forceinline__ variant::Index index(int r) const {
    const int pr = row0 + r;
    const int token = static_cast<int>(fast_div(static_cast<u32>(pr), g_mul, g_shift));
    return variant::Index{b, token, token + kv_len - qo_len, kvh * g + (pr - token * g), kvh, qo_len, kv_len, D};
  }
};

// Staged epilogue (sm_90, unsplit items): normalised o rows (16-bit) into this warp's Q rows, one stmatrix per 16 x 16
// block (the A-fragment layout: the ldmatrix addresses of Q), then each lane reads 16-byte pieces (chunks t + 4b) of
// its own 4 rows back and stores them: 64 contiguous bytes per row and instruction, as the shuffle transpose gave.
template <class C, class P, class VP>
__device__ __forceinline__ void store_staged(const P& p, const VP& v, const Cta<C>& c, const OutRows& out, int e_rows,
                                             int e_r0, const float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4],
                                             const float (&row_max)[C::kMmaQ][2], const float (&row_sum)[C::kMmaQ][2],
                                             float x_scale) {
  using V = typename C::Variant;
  using DTypeO = typename C::DTypeO;
  using LdQK = LdmatrixAddr<C::kChunksQK>;
  constexpr int MMA_Q = C::kMmaQ, DVO = C::kHeadDimVO;
  const int e_lane = static_cast<int>(threadIdx.x % 32u);
  float inv[MMA_Q][2], lse[MMA_Q][2];
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq) {
    variant::Index ix[2] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float d = mma::quad_sum(row_sum[mq][h]);
      inv[mq][h] = state::inv_of(d);
      lse[mq][h] = state::lse_of(row_max[mq][h] * x_scale, d);
      if constexpr (kRowIndex<V>) ix[h] = out.index<C::kHeadDimQK>(e_r0 + mq * 16 + 8 * h);
      if constexpr (kRescale<V>) inv[mq][h] = row_scale<V>(v, ix[h], row_max[mq][h] * x_scale, d, true, lse[mq][h]);
    }
    const int t = 2 * (e_lane % 4);  // (column of element 0 within an n8 block: output transforms)
#pragma unroll
    for (int s = 0; s < DVO / 16; ++s) {
      const int j0 = 16 * s + t, j1 = j0 + 8;  // (dims of a[0], a[1] and of a[2], a[3])
      u32 a[4];
      a[0] = mma::pack2<DTypeO>(final_value<V>(v, ix[0], j0, o[mq][2 * s][0], inv[mq][0], lse[mq][0]),
                                final_value<V>(v, ix[0], j0 + 1, o[mq][2 * s][1], inv[mq][0], lse[mq][0]));
      a[1] = mma::pack2<DTypeO>(final_value<V>(v, ix[1], j0, o[mq][2 * s][2], inv[mq][1], lse[mq][1]),
                                final_value<V>(v, ix[1], j0 + 1, o[mq][2 * s][3], inv[mq][1], lse[mq][1]));
      a[2] = mma::pack2<DTypeO>(final_value<V>(v, ix[0], j1, o[mq][2 * s + 1][0], inv[mq][0], lse[mq][0]),
                                final_value<V>(v, ix[0], j1 + 1, o[mq][2 * s + 1][1], inv[mq][0], lse[mq][0]));
      a[3] = mma::pack2<DTypeO>(final_value<V>(v, ix[1], j1, o[mq][2 * s + 1][2], inv[mq][1], lse[mq][1]),
                                final_value<V>(v, ix[1], j1 + 1, o[mq][2 * s + 1][3], inv[mq][1], lse[mq][1]));
      mma::stmatrix_x4(LdQK::at(c.q_lane, s, mq * 16), a);
    }
  }
  __syncwarp();
  const int t = e_lane % 4;
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = e_r0 + mq * 16 + 8 * h;
      if (r < e_rows) {
        i64 row;
        int head;
        out.at(r, row, head);
        DTypeO* dst = static_cast<DTypeO*>(p.o) + row * p.o_stride_n + head * p.o_stride_h + 8 * t;
        const unsigned char* src = c.smem + r * (C::kChunksQK * 16);
#pragma unroll
        for (int b = 0; b < DVO / 32; ++b) {
          const int chunk = (t + 4 * b) ^ (r % 8);
          *reinterpret_cast<uint4*>(dst + b * 32) = *reinterpret_cast<const uint4*>(src + chunk * 16);
        }
        if (t == 0 && p.lse != nullptr) {
          static_cast<float*>(p.lse)[row * p.lse_stride_n + head * p.lse_stride_h] = lse[mq][h];
        }
      }
    }
  }
  __syncwarp();  // (the next item's Q copy overwrites these rows)
}

// Register epilogue: normalise each row and store o (16-byte stores after an in-quad transpose) and lse, or the fp32
// partial state of a split item. Rows already stored by store_staged are skipped.
// `first_piece`: a split item that is the first piece of its rows (the sink goes into its partial state).
template <class C, class P, class VP>
__device__ __forceinline__ void store_rows(const P& p, const VP& v, const OutRows& out, int e_rows, int e_r0,
                                           int e_partial, bool first_piece,
                                           const float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4],
                                           const float (&row_max)[C::kMmaQ][2], const float (&row_sum)[C::kMmaQ][2],
                                           float x_scale) {
  using V = typename C::Variant;
  using DTypeO = typename C::DTypeO;
  constexpr int MMA_Q = C::kMmaQ, DVO = C::kHeadDimVO;
  const int e_lane = static_cast<int>(threadIdx.x % 32u);
#pragma unroll
  for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (C::kStagedEpi && e_partial < 0) break;
      const float d = mma::quad_sum(row_sum[mq][h]);
      float inv = state::inv_of(d);
      float lse = state::lse_of(row_max[mq][h] * x_scale, d);
      const int r = e_r0 + mq * 16 + 8 * h;
      variant::Index ix{};
      if constexpr (kRowIndex<V>) ix = out.index<C::kHeadDimQK>(r);
      if constexpr (kRescale<V>) {
        inv = row_scale<V>(v, ix, row_max[mq][h] * x_scale, d, e_partial < 0 || first_piece, lse);
      }
      if (e_partial < 0) {
        // 16-byte stores: a 4 x 4 transpose inside each lane quad gives lane t all 8 columns of n8 block 4b + t of
        // its row, where the accumulator layout gives it 2 columns of every block (4-byte stores: 4x the store
        // instructions, half-filled sectors). The shuffles run in every lane, rows past the tile included; only the
        // stores are predicated.
        const int t = e_lane % 4;
        u32 pk[DVO / 8];
#pragma unroll
        for (int j = 0; j < DVO / 8; ++j) {
          pk[j] = mma::pack2<DTypeO>(final_value<V>(v, ix, j * 8 + 2 * t, o[mq][j][2 * h], inv, lse),
                                     final_value<V>(v, ix, j * 8 + 2 * t + 1, o[mq][j][2 * h + 1], inv, lse));
        }
#pragma unroll
        for (int b = 0; b < DVO / 32; ++b) quad_transpose(pk + 4 * b, t);
        if (r < e_rows) {
          i64 row;
          int head;
          out.at(r, row, head);
          DTypeO* dst = static_cast<DTypeO*>(p.o) + row * p.o_stride_n + head * p.o_stride_h + 8 * t;
#pragma unroll
          for (int b = 0; b < DVO / 32; ++b) {
            *reinterpret_cast<uint4*>(dst + b * 32) =
                make_uint4(pk[4 * b], pk[4 * b + 1], pk[4 * b + 2], pk[4 * b + 3]);
          }
          if (t == 0 && p.lse != nullptr) static_cast<float*>(p.lse)[row * p.lse_stride_n + head * p.lse_stride_h] = lse;
        }
      } else if (r < e_rows) {
        float* dst = static_cast<float*>(p.partial_o) + static_cast<i64>(e_partial + r) * DVO + 2 * (e_lane % 4);
#pragma unroll
        for (int j = 0; j < DVO / 8; ++j) {
          *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[mq][j][2 * h] * inv, o[mq][j][2 * h + 1] * inv);
        }
        if (e_lane % 4 == 0) static_cast<float*>(p.partial_lse)[e_partial + r] = lse;
      }
    }
  }
}

// Cross-item epilogue of the item in table slot e_slot, then the start of the next item of the table: its Q and first
// K/V tile into buffer `stage`, after this item's last tile (every warp is done with Q and that buffer: barriers of
// the last iteration). Issued after the o stores rather than during the last P.V, where those copies queued in front
// of that P.V's ldmatrix reads and the stores (P3 +4 %, measured with bench/lab/tune_prefill.py); the other CTA of the
// SM covers their latency. (Facts re-read from the table rather than kept live across the loop.)
template <class C, class P, class VP>
__device__ __forceinline__ void epilogue_cross_item(const P& p, const VP& v, const Cta<C>& c, const Loader<C, P>& ld,
                                                    int item, int e_slot, int stage,
                                                    const int (&pages)[C::kKVRowsPerThread],
                                                    const float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4],
                                                    const float (&row_max)[C::kMmaQ][2],
                                                    const float (&row_sum)[C::kMmaQ][2], float x_scale) {
  const int* e = c.table + e_slot * C::kTableFields;
  // An item without KV tiles starts the next one here (after its own Q copy, issued by the item before, landed);
  // other items start it after their epilogue (below). (Staged epilogue: after it, like the others. The staging
  // overwrites this item's Q rows, so their copy, which no loop iteration waited for, must have landed first, next
  // item or not.)
  if (e[kFKvStart] >= e[kFKvEnd]) {
    if constexpr (C::kStagedEpi) {
      cp_async_wait_all();
    } else if (c.next_in_table(item, e_slot)) {
      cp_async_wait_all();
      ld.issue_first(e_slot + 1, stage, pages);  // (pages: read before the loop)
      cp_async_commit();
    }
  }
  const int e_row0 = e[kFRow0], e_partial = e[kFPartial];
  const int e_rows = min(C::kTileQ, e[kFQoLen] * p.group_size - e_row0);
  using V = typename C::Variant;
  const OutRows out{e_row0, e[kFKvHead], e[kFQoBase], p.group_size, p.group_mul, p.group_shift,
                    kRowIndex<V> ? e[kFReq] : 0, kRowIndex<V> ? e[kFQoLen] : 0, kRowIndex<V> ? e[kFKvLen] : 0};
  bool first_piece = false;  // (a split item whose rows get the sink: see the file comment)
  if constexpr (V::kSink) first_piece = e_partial >= 0 && e_partial == plan::merge_unit(p, item);
  // Thread coordinates recomputed from threadIdx (cheaper than keeping them live across the loop).
  const int e_r0 = static_cast<int>((threadIdx.x % C::kThreads) / 32u) * C::kMmaQ * 16 + (threadIdx.x % 32u) / 4;
  if (C::kStagedEpi && e_partial < 0) store_staged<C>(p, v, c, out, e_rows, e_r0, o, row_max, row_sum, x_scale);
  store_rows<C>(p, v, out, e_rows, e_r0, e_partial, first_piece, o, row_max, row_sum, x_scale);
  CUINFER_PREFILL_TRACE_STAMP(4);
  if ((C::kStagedEpi || e[kFKvStart] < e[kFKvEnd]) && c.next_in_table(item, e_slot)) {
    ld.issue_first(e_slot + 1, stage, pages);  // (paged: pages holds that tile's page numbers, read in the loop)
    cp_async_commit();
  }
}

// Small query tiles: stage (o, m, d) of every warp in smem, merge across WARPS_KV, write 16-byte vectors.
template <class C, class P, class VP>
__device__ __forceinline__ void epilogue_merge_warps(const P& p, const VP& v, const Cta<C>& c, int item,
                                                     const float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4],
                                                     const float (&row_max)[C::kMmaQ][2],
                                                     const float (&row_sum)[C::kMmaQ][2], float x_scale) {
  using V = typename C::Variant;
  using DTypeO = typename C::DTypeO;
  constexpr int MMA_Q = C::kMmaQ, DVO = C::kHeadDimVO, NT = C::kThreads, TILE_Q = C::kTileQ;
  cp_async_wait<0>();
  c.sync();
  float* epi_o = reinterpret_cast<float*>(c.smem);
  float* epi_md = reinterpret_cast<float*>(c.smem + C::kEpiOBytes);
  {
    // Thread coordinates recomputed from threadIdx (cheaper than keeping them live across the loop).
    const u32 e_lane = threadIdx.x % 32u, e_warp = (threadIdx.x % NT) / 32u;
    const u32 e_slot0 = (e_warp / C::kWarpsQ) * TILE_Q + (e_warp % C::kWarpsQ) * MMA_Q * 16 + e_lane / 4;
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int slot_r = e_slot0 + mq * 16 + 8 * h;
        float* dst = epi_o + slot_r * C::kEpiPitch + 2 * (e_lane % 4);
#pragma unroll
        for (int j = 0; j < DVO / 8; ++j) {
          *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[mq][j][2 * h], o[mq][j][2 * h + 1]);
        }
        const float d = mma::quad_sum(row_sum[mq][h]);
        if (e_lane % 4 == 0) {
          // Store m in base-2 units; an empty row (d = 0) stores -inf so the merge ignores it. (No softmax: every
          // warp's state is a sum, merged with weight 1.)
          epi_md[slot_r * 2] = !V::kSoftmax ? 0.f : d > 0.f ? row_max[mq][h] * x_scale : neg_inf();
          epi_md[slot_r * 2 + 1] = d;
        }
      }
    }
  }
  c.sync();

  // Item facts needed only here are re-read rather than kept live across the KV loop.
  const plan::ItemTail it = plan::reload_item(p, item);
  const int g = p.group_size;
  const int e_row0 = it.qo_tile * TILE_Q;
  const int e_qo_base = reload_i32(p.qo_indptr, it.req);
  const int e_qo_len = reload_i32(p.qo_indptr, it.req + 1) - e_qo_base;
  const int e_rows = min(TILE_Q, e_qo_len * g - e_row0);
  const OutRows out{e_row0, it.kv_head, e_qo_base, g, p.group_mul, p.group_shift,
                    kRowIndex<V> ? it.req : 0, kRowIndex<V> ? e_qo_len : 0, kRowIndex<V> ? c.info[kIKvLen] : 0};
  bool sink_rows = it.partial < 0;  // the rows get the sink: unsplit, or the first piece of a split
  if constexpr (V::kSink) sink_rows = sink_rows || it.partial == plan::merge_unit(p, item);
  constexpr int VPR = DVO / 8;  // 8-element vectors per row
  for (int idx = static_cast<int>(threadIdx.x % NT); idx < e_rows * VPR; idx += NT) {
    const int r = idx / VPR, cv = idx % VPR;
    float m_all = neg_inf();
#pragma unroll
    for (int w = 0; w < C::kWarpsKV; ++w) m_all = fmaxf(m_all, epi_md[(w * TILE_Q + r) * 2]);
    state::Merger<8> mg;
    mg.init(m_all);
    if (m_all != neg_inf()) {
#pragma unroll
      for (int w = 0; w < C::kWarpsKV; ++w) {
        const int sl = w * TILE_Q + r;
        const float4 lo = *reinterpret_cast<const float4*>(epi_o + sl * C::kEpiPitch + cv * 8);
        const float4 hi = *reinterpret_cast<const float4*>(epi_o + sl * C::kEpiPitch + cv * 8 + 4);
        const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        mg.add(mg.weight(epi_md[sl * 2]), epi_md[sl * 2 + 1], x);  // -inf (empty warp slice) -> weight 0
      }
    }
    variant::Index ix{};
    if constexpr (kRowIndex<V>) ix = out.index<C::kHeadDimQK>(r);
    float lse;
    if constexpr (!V::kSoftmax) {
      lse = mg.finish_sum();
    } else {
      if constexpr (V::kSink) {
        if (sink_rows) mg.add_sink(variant::sink_log2<V>(v, ix));
      }
      lse = mg.finish();
    }
    float(&acc)[8] = mg.acc;
    if constexpr (V::kOutputTransform) {
      if (it.partial < 0) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = V::output_transform(v, ix, cv * 8 + i, acc[i], lse);
      }
    }

    if (it.partial < 0) {
      i64 row;
      int head;
      out.at(r, row, head);
      DTypeO* dst = static_cast<DTypeO*>(p.o) + row * p.o_stride_n + head * p.o_stride_h + cv * 8;
      uint4 packed;
      packed.x = mma::pack2<DTypeO>(acc[0], acc[1]);
      packed.y = mma::pack2<DTypeO>(acc[2], acc[3]);
      packed.z = mma::pack2<DTypeO>(acc[4], acc[5]);
      packed.w = mma::pack2<DTypeO>(acc[6], acc[7]);
      *reinterpret_cast<uint4*>(dst) = packed;
      if (cv == 0 && p.lse != nullptr) {
        static_cast<float*>(p.lse)[row * p.lse_stride_n + head * p.lse_stride_h] = lse;
      }
    } else {
      float* dst = static_cast<float*>(p.partial_o) + static_cast<i64>(it.partial + r) * DVO + cv * 8;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (cv == 0) static_cast<float*>(p.partial_lse)[it.partial + r] = lse;
    }
  }
  c.sync();  // the next item's copies overwrite the staging area
}

}  // namespace prefill
}  // namespace cuinfer
