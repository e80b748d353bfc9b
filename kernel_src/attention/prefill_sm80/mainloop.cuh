// The math of one KV tile of the FA2-class prefill kernel, on mma.sync tensor cores (sm_80+):
//
//   S = Q·K^T (ldmatrix Q and K from swizzled smem, mma m16n8k16, fp32)  ->  the variant's logits transform and mask
//   (masks only on boundary tiles, unless the variant masks everywhere)  ->  online softmax in base 2 (exp2, lazy
//   reference max m, per-thread partial row sums d)  ->  O += P·V (P from the S registers, V by ldmatrix.trans).
//
// Warp (wq, wkv) owns MMA_Q m16 row blocks (rows wq*16*MMA_Q ...) of the query tile and MMA_KV 16-key slices (keys
// wkv*16*MMA_KV ...) of every KV tile. Causal boundary tiles: 16-key slices masked for every row of a warp skip their
// Q·K^T and P·V MMAs (with 4 heads packed per token a 128-row tile spans 32 tokens, so half of a 64-key boundary tile
// is typically dead).
#pragma once
#include "attention/prefill_sm80/cta.cuh"
#include "common/fp8.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "variants/contract.cuh"

namespace cuinfer {
namespace prefill {

// 2^x, 1 / d and log2(d) take the MUFU forms of common/math.cuh (fmath::ex2, rcp, lg2). exp2f and log2f without
// fast-math add denormal-range fix-ups and a ~25-instruction polynomial, and 1.f / d a Newton step with a slow-path call
// (~2 us per item in the epilogue). None is needed here: probabilities below 2^-126 flush to 0, far under the 16-bit
// output resolution, and d >= 1 whenever a row has a key (its largest p is 2^(x_max - m) with the reference m one of
// the row's logits).

// How far (base-2 units) a row's max may climb above the softmax's reference max before o is rescaled (see
// softmax_exact). 0 would be an exact running max.
constexpr float kRescaleSlack = 8.f;
// Max-free tiles (see tile_scores): a per-thread sum of one row's p over a tile above this sends the tile to the
// exact path. 2^12 keeps every p far inside fp16 (65504) with room for o and d. sm_90+ only: ptxas for sm_80 spills
// the 128 x 64 tile with it (12 bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kMaxFree = false;
#else
constexpr bool kMaxFree = true;
#endif
constexpr float kMaxFreeSum = 4096.f;

// S (+)= Q K^T for one KV tile: MMA_Q row blocks x MMA_KV 16-key slices of this warp. GUARD: slices >= `live` hold
// only keys masked in every row of the warp (causal boundary tile) and are skipped; their scores stay 0 and the
// mask turns them into -inf.
template <class C, bool GUARD>
__device__ __forceinline__ void qk_tile(float (&s)[C::kMmaQ][2 * C::kMmaKV][4], u32 q_lane, u32 k_stage, int live) {
  using T = typename C::DTypeQK;  // (q's type, or float16 for fp8 K with kHalfQK: traits.cuh)
  using LdQK = LdmatrixAddr<C::kChunksQK>;
#pragma unroll
  for (int kk = 0; kk < C::kHeadDimQK / 16; ++kk) {
    u32 a[C::kMmaQ][4];
#pragma unroll
    for (int mq = 0; mq < C::kMmaQ; ++mq) mma::ldmatrix_x4(a[mq], LdQK::at(q_lane, kk, mq * 16));
#pragma unroll
    for (int nn = 0; nn < C::kMmaKV; ++nn) {
      if (!GUARD || nn < live) {
        u32 bk[4];
        mma::ldmatrix_x4(bk, LdQK::at(k_stage, kk, nn * 16));
#pragma unroll
        for (int mq = 0; mq < C::kMmaQ; ++mq) mma::mma_m16n16k16<T>(s[mq][2 * nn], s[mq][2 * nn + 1], a[mq], bk);
      }
    }
  }
}

// O += P V for one KV tile; GUARD: slices >= `live` have P = 0 exactly (masked) and are skipped.
template <class C, bool GUARD>
__device__ __forceinline__ void pv_tile(float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4],
                                        const u32 (&pa)[C::kMmaQ][C::kMmaKV][4], u32 v_stage, int live) {
  using T = typename C::DTypePV;  // (q's type, or float16 for fp8 V converted to float16: traits.cuh)
  using LdVO = LdmatrixAddr<C::kChunksVMma>;
#pragma unroll
  for (int kk = 0; kk < C::kMmaKV; ++kk) {
    if (!GUARD || kk < live) {
#pragma unroll
      for (int dn = 0; dn < C::kHeadDimVO / 16; ++dn) {
        u32 bv[4];
        mma::ldmatrix_x4_trans(bv, LdVO::at(v_stage, dn, kk * 16));
#pragma unroll
        for (int mq = 0; mq < C::kMmaQ; ++mq) mma::mma_m16n16k16<T>(o[mq][2 * dn], o[mq][2 * dn + 1], pa[mq][kk], bv);
      }
    }
  }
}

// fp8 K/V (C::kKV8): the same products with fragments converted in registers (common/fp8.cuh). K: one ldmatrix x4 per
// 32 keys (x2 for a lone 16-key slice) and k-step (one fp8 chunk), the Q fragments read in the matching dim order
// (q8_lane: 8 bytes per row and k-step). GUARD as in qk_tile.
template <class C, bool GUARD>
__device__ __forceinline__ void qk_tile_fp8(float (&s)[C::kMmaQ][2 * C::kMmaKV][4], u32 q8_lane, u32 k_stage,
                                            int live) {
  using T = typename C::DTypeQ;
  using F8 = typename C::DTypeKV;
  using LdQK = LdmatrixAddr<C::kChunksQK>;
  using KAddr = ChunkAddr<C::kChunksK>;
#pragma unroll
  for (int kk = 0; kk < C::kHeadDimQK / 16; ++kk) {
    u32 a[C::kMmaQ][4];
#pragma unroll
    for (int mq = 0; mq < C::kMmaQ; ++mq) {
      fp8::q_frag_fp8k(a[mq], LdQK::at(q8_lane, kk, mq * 16), LdQK::at(q8_lane, kk, mq * 16 + 8));
    }
#pragma unroll
    for (int nn = 0; nn < C::kMmaKV; nn += 2) {
      if (!GUARD || nn < live) {
        u32 r[4];
        if (nn + 1 < C::kMmaKV) {
          mma::ldmatrix_x4(r, KAddr::at(k_stage, kk, nn * 16));  // keys 16 nn + 8 i .. + 7 in register i
        } else {
          mma::ldmatrix_x2(r, KAddr::at(k_stage, kk, nn * 16));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (i < 2 || (nn + 1 < C::kMmaKV && (!GUARD || nn + 1 < live))) {
            u32 b[2];
            fp8::k_frag<T, F8>(r[i], b);
            // (n8 tile 2 nn + i; clamped so that the x2 branch's unused tiles index nothing past the array)
            constexpr int kLastTile = 2 * C::kMmaKV - 1;
            const int j = 2 * nn + i < kLastTile ? 2 * nn + i : kLastTile;
#pragma unroll
            for (int mq = 0; mq < C::kMmaQ; ++mq) mma::mma_m16n8k16<T>(s[mq][j], a[mq], b);
          }
        }
      }
    }
  }
}

// O += P V for one KV tile of fp8 V: one ldmatrix.trans x4 per 16 keys and 32 output dims, 4 n8 tiles (the even /
// odd tiles of two chunks: o[][4 c2 + 0..3]; pv_acc_to_natural restores the usual order once per item).
template <class C, bool GUARD>
__device__ __forceinline__ void pv_tile_fp8(float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4],
                                            const u32 (&pa)[C::kMmaQ][C::kMmaKV][4], u32 v_stage, int live) {
  using T = typename C::DTypeQ;
  using F8 = typename C::DTypeKV;
  using LdVO = LdmatrixAddr<C::kChunksVO>;
#pragma unroll
  for (int kk = 0; kk < C::kMmaKV; ++kk) {
    if (!GUARD || kk < live) {
#pragma unroll
      for (int c2 = 0; c2 < C::kHeadDimVO / 32; ++c2) {
        u32 r[4];
        mma::ldmatrix_x4_trans(r, LdVO::at(v_stage, c2, kk * 16));
        u32 b[4][2];
        fp8::v_frag<T, F8>(r[0], b[0][0], b[1][0]);  // tokens 0-7 of the step, chunk 2 c2: even, odd tile
        fp8::v_frag<T, F8>(r[1], b[0][1], b[1][1]);  // tokens 8-15
        fp8::v_frag<T, F8>(r[2], b[2][0], b[3][0]);  // chunk 2 c2 + 1
        fp8::v_frag<T, F8>(r[3], b[2][1], b[3][1]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int mq = 0; mq < C::kMmaQ; ++mq) mma::mma_m16n8k16<T>(o[mq][4 * c2 + j], pa[mq][kk], b[j]);
        }
      }
    }
  }
}

// p = 2^(x * x_scale - base) in place for the elements of row half h of one S row block this thread holds, added in
// order to `sum` (returned): the exponentials of both softmax paths.
template <int MMA_KV>
__device__ __forceinline__ float exp2_row(float (&s)[2 * MMA_KV][4], int h, float x_scale, float base, float sum) {
#pragma unroll
  for (int j = 0; j < 2 * MMA_KV; ++j) {
#pragma unroll
    for (int e = 2 * h; e < 2 * h + 2; ++e) {
      const float pe = fmath::ex2(fmaf(s[j][e], x_scale, -base));
      s[j][e] = pe;
      sum += pe;
    }
  }
  return sum;
}

// This thread's shared-memory slot of the RowState of its row (mq, h) (Traits::kRowStateSmem).
template <class C>
__device__ __forceinline__ typename C::Variant::RowState* row_slot(const Cta<C>& c, int mq, int h) {
  return reinterpret_cast<typename C::Variant::RowState*>(
      c.smem + C::kRowsOff + ((2 * mq + h) * C::kThreads + c.tid) * C::kRowStateBytes);
}

// The variant's Index of packed row pr (token pr / g, query head kv_head * g + pr % g) of request `batch`, whose query
// token i sits at kv position i + q_shift.
template <class C, class P>
__device__ __forceinline__ variant::Index row_index(const P& p, int pr, int q_shift, int kv_head, int batch,
                                                    int kv_len) {
  const int g = p.group_size;
  variant::Index ix;
  ix.qo_idx = static_cast<int>(fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
  ix.qpos = ix.qo_idx + q_shift;  // kv position of this query row
  ix.kv_head = kv_head;
  ix.qo_head = kv_head * g + (pr - ix.qo_idx * g);
  ix.batch = batch;
  ix.kv_len = kv_len;
  ix.qo_len = kv_len - q_shift;
  ix.head_dim = C::kHeadDimQK;
  return ix;
}

// The RowState of this thread's row (mq, h): from its shared-memory slot (Traits::kRowStateSmem), else from `rows`.
template <class C>
__device__ __forceinline__ typename C::Variant::RowState row_state_of(
    const Cta<C>& c, const typename C::Variant::RowState (&rows)[C::kMmaQ][2], int mq, int h) {
  if constexpr (C::kRowStateSmem) {
    return *row_slot<C>(c, mq, h);
  } else {
    return rows[mq][h];
  }
}

// The variant's logits transform and the tile's masks on this warp's S: the element of row (mq, h) and n8 tile j,
// component e, is the logit of packed row row0 + warp_row0 + lane/4 + 16 mq + 8 h and key wkey0 + 8 j + 2 (lane % 4)
// + e % 2. Keys outside the row's key range [lo, hi) (the variant's key_range clipped to the item's kv_end) and keys
// the variant's mask drops become -inf (without softmax: weight 0). `rows`: the rows' RowStates (row_states).
template <class C, class P, class VP>
__device__ __forceinline__ void logits_and_mask(const P& p, const VP& v, const Cta<C>& c,
                                                float (&s)[C::kMmaQ][2 * C::kMmaKV][4], int wkey0, int kv_end,
                                                bool need_mask,
                                                const typename C::Variant::RowState (&rows)[C::kMmaQ][2]) {
  using V = typename C::Variant;
  const int q_shift = c.info[kIQShift];
  // Packed row of this thread's element (mq = 0, h = 0); rows + 16 mq + 8 h hold elements 2h, 2h+1.
  const int thread_row0 = c.info[kIRow0] + c.warp_row0 + c.lane / 4;
#pragma unroll
  for (int mq = 0; mq < C::kMmaQ; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pr = thread_row0 + mq * 16 + 8 * h;
      const variant::Index ix =
          row_index<C>(p, pr, q_shift, c.info[kIKvHead], c.info[kIReq], c.info[kIKvLen]);
      int lo = variant::kNoLowerBound, hi = kv_end;  // keys < lo and >= hi are masked
      V::key_range(v, ix, lo, hi);
      // kv_dist of the row's first key in this tile: each element's is this plus a constant, exactly (integers below
      // 2^24), one FADD instead of an integer add and a conversion per logit.
      const float dist0 = static_cast<float>(wkey0 + 2 * (c.lane % 4) - ix.qpos);
      const typename V::RowState row = row_state_of<C>(c, rows, mq, h);
#pragma unroll
      for (int j = 0; j < 2 * C::kMmaKV; ++j) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const int key = wkey0 + j * 8 + 2 * (c.lane % 4) + (e % 2);
          float x = s[mq][j][e];
          if constexpr (variant::kTileLogits<V>) {  // (the leading slopes' bias is in S already: kFoldSlope)
            const float dist = dist0 + static_cast<float>(j * 8 + e % 2);
            if constexpr (variant::kFoldSlope<V>) {
              x = V::logits_rest(v, ix, row, key, dist, x * p.sm_scale);
            } else {
              x = V::logits(v, ix, row, key, dist, x * p.sm_scale);
            }
          }
          if (need_mask) {
            bool keep = key < hi;
            if constexpr (V::kLowerBound) keep = keep && key >= lo;
            if constexpr (V::kMask) {
              if (keep) keep = V::mask(v, ix, key);
            }
            x = keep ? x : (V::kSoftmax ? neg_inf() : 0.f);
          }
          s[mq][j][e] = x;
        }
      }
    }
  }
}

// Leading slopes (variant::kFoldSlope: ALiBi): S starts as the rows' linear key bias in accumulator units, so Q·K^T
// adds the scores to it and no instruction per logit applies the bias after the MMAs. Element (mq, h, j, e) (rows and
// keys as logits_and_mask's) gets a · (dist0 + 8 j + e % 2) as fmaf(a, 8 j + e % 2, a · dist0), one FFMA, with a the
// row's slope_lead times `inv_nat` (accumulator units per natural logit unit) and dist0 its first key's kv_dist.
template <class C, class P, class VP>
__device__ __forceinline__ void slope_scores(const P& p, const VP& v, const Cta<C>& c,
                                             float (&s)[C::kMmaQ][2 * C::kMmaKV][4], int wkey0, float inv_nat,
                                             const typename C::Variant::RowState (&rows)[C::kMmaQ][2]) {
  const int first_row = c.info[kIRow0] + c.warp_row0 + c.lane / 4;  // (packed row of element mq = 0, h = 0)
#pragma unroll
  for (int r = 0; r < 2 * C::kMmaQ; ++r) {  // this thread's rows (mq, h) = (r / 2, r % 2)
    const int mq = r / 2, h = r % 2;
    const variant::Index ix = row_index<C>(p, first_row + mq * 16 + 8 * h, c.info[kIQShift], c.info[kIKvHead],
                                           c.info[kIReq], c.info[kIKvLen]);
    const float a = C::Variant::slope_lead(v, ix, row_state_of<C>(c, rows, mq, h)) * inv_nat;
    const float b = a * static_cast<float>(wkey0 + 2 * (c.lane % 4) - ix.qpos);
#pragma unroll
    for (int j = 0; j < 2 * C::kMmaKV; ++j) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) s[mq][j][e] = fmaf(a, static_cast<float>(j * 8 + e % 2), b);
    }
  }
}

// The RowStates of this thread's rows (those of logits_and_mask) for an item: row0 its first packed row. Computed once
// per item, before its KV loop (nothing when the variant has no row state), into this thread's shared-memory slots
// (kRowStateSmem: only this thread reads them, no barrier), else into `rows`.
template <class C, class P, class VP>
__device__ __forceinline__ void row_states(const P& p, const VP& v, const Cta<C>& c, int row0, int q_shift, int kv_head,
                                           int batch, int kv_len,
                                           typename C::Variant::RowState (&rows)[C::kMmaQ][2]) {
  using V = typename C::Variant;
  if constexpr (V::kRowState) {
#pragma unroll
    for (int mq = 0; mq < C::kMmaQ; ++mq) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int pr = row0 + c.warp_row0 + c.lane / 4 + mq * 16 + 8 * h;
        const typename V::RowState r = V::row_state(v, row_index<C>(p, pr, q_shift, kv_head, batch, kv_len));
        if constexpr (C::kRowStateSmem) {
          *row_slot<C>(c, mq, h) = r;
        } else {
          rows[mq][h] = r;
        }
      }
    }
  }
}

// No softmax (the variant's kSoftmax is false): S holds the keys' weights (logits_and_mask); add them to the row sums
// and keep S as P (no max, no rescale: o accumulates the plain weighted sum).
template <class C>
__device__ __forceinline__ void weights_sum(const float (&s)[C::kMmaQ][2 * C::kMmaKV][4],
                                            float (&row_sum)[C::kMmaQ][2]) {
#pragma unroll
  for (int mq = 0; mq < C::kMmaQ; ++mq) {
#pragma unroll
    for (int j = 0; j < 2 * C::kMmaKV; ++j) {
      row_sum[mq][0] += s[mq][j][0] + s[mq][j][1];
      row_sum[mq][1] += s[mq][j][2] + s[mq][j][3];
    }
  }
}

// Max-free tile: every row of the warp has a finite reference max m, so p = 2^(x - m) is taken directly (no row max:
// 16 compares and 2 shuffles per row and thread, and their latency before the first exp2) and the per-thread row sums
// are checked instead. A sum <= kMaxFreeSum bounds every p in it (p >= 0), so o, d and the P fragments stay in range
// with the old m. Returns false (nothing updated) when some max climbed far above m: the caller recomputes the tile
// on the exact path, which rescales. With the first tiles setting m near the rows' final max, that almost never happens.
template <class C>
__device__ __forceinline__ bool softmax_max_free(float (&s)[C::kMmaQ][2 * C::kMmaKV][4],
                                                 const float (&row_max)[C::kMmaQ][2], float (&row_sum)[C::kMmaQ][2],
                                                 float x_scale) {
  float tile_sum[C::kMmaQ][2];
  bool bad = false;
#pragma unroll
  for (int mq = 0; mq < C::kMmaQ; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = exp2_row<C::kMmaKV>(s[mq], h, x_scale, row_max[mq][h] * x_scale, 0.f);
      tile_sum[mq][h] = sum;
      bad |= !(sum <= kMaxFreeSum);
    }
  }
  if (__any_sync(0xffffffffu, bad)) return false;
#pragma unroll
  for (int mq = 0; mq < C::kMmaQ; ++mq) {
    row_sum[mq][0] += tile_sum[mq][0];
    row_sum[mq][1] += tile_sum[mq][1];
  }
  return true;
}

// Online softmax (base 2) with a lazy reference max: row_max is the reference m of the exponentials, not necessarily
// the true running max: it moves only when a tile's max exceeds it by more than kRescaleSlack base-2 units, so
// p = 2^(x - m) stays <= 2^kRescaleSlack (256: exact in fp32 and in the bf16 / fp16 P fragments) while o, the row sum
// and the lse all use the same m, which is all the result needs. Past the first tiles the max rarely climbs that far,
// so the O rescale (d/2 multiplies per row block and an exp2 per row, between S and P.V) is skipped for the whole warp
// on almost every tile; with an exact running max it ran on most tiles of a causal prefill.
template <class C>
__device__ __forceinline__ void softmax_exact(float (&s)[C::kMmaQ][2 * C::kMmaKV][4],
                                              float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4],
                                              float (&row_max)[C::kMmaQ][2], float (&row_sum)[C::kMmaQ][2],
                                              float x_scale) {
  float alpha[C::kMmaQ][2];
  bool moved = false;
#pragma unroll
  for (int mq = 0; mq < C::kMmaQ; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_old = row_max[mq][h];
      float mx = m_old;
#pragma unroll
      for (int j = 0; j < 2 * C::kMmaKV; ++j) mx = fmaxf(mx, fmaxf(s[mq][j][2 * h], s[mq][j][2 * h + 1]));
      mx = mma::quad_max(mx);
      // mx >= m_old. A row's first finite max always moves it (inf > slack); a row with no key yet keeps
      // m = -inf (-inf - -inf is NaN: not moved) and 0 as the exponent base, so exp2 never sees -inf - -inf.
      const bool row_moved = (mx - m_old) * x_scale > kRescaleSlack;
      const float m_new = row_moved ? mx : m_old;
      const float base = m_new == neg_inf() ? 0.f : m_new * x_scale;
      // (A row moving off -inf has o = 0, nothing to rescale: the first tile of an item skips the rescale too.)
      moved |= row_moved && m_old != neg_inf();
      alpha[mq][h] = row_moved ? fmath::ex2(m_old * x_scale - base) : 1.f;
      row_max[mq][h] = m_new;
      row_sum[mq][h] = exp2_row<C::kMmaKV>(s[mq], h, x_scale, base, row_sum[mq][h] * alpha[mq][h]);
    }
  }
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int mq = 0; mq < C::kMmaQ; ++mq) {
#pragma unroll
      for (int j = 0; j < C::kHeadDimVO / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mq][j][e] *= alpha[mq][e / 2];
      }
    }
  }
}

}  // namespace prefill
}  // namespace cuinfer
