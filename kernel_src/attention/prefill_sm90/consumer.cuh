// Hopper prefill: a consumer warpgroup (two per CTA, 64 query rows each). Per K / V tile: S = Q K^T (8 wgmma
// m64n128k16 from shared memory), the variant's logits and masks, the online softmax in registers, O += P V (8 wgmma
// with P from registers, V MN-major). Tile i's Q K^T is issued before tile i-1's P V (FA3's intra-warpgroup overlap)
// and the two consumers take turns to issue (ping-pong, named barriers 1 and 2), so one's softmax runs while the
// other's MMAs do. A stage's K is handed back when its Q K^T retires, its V when its P V does. The epilogue writes o
// and the base-2 lse (an unsplit item) or the fp32 partial state (a split item, merged by the merge kernel).
//
// Register rule (ptxas C7513 otherwise serialises every wgmma of the kernel): no register an issued wgmma reads is
// written before its wait, so P is packed only after the previous P V retired.
#pragma once
#include "attention/prefill_sm90/unit.cuh"
#include "common/math.cuh"
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/wgmma.cuh"

namespace cuinfer {
namespace prefill_sm90 {

template <class T, class V, class P, class VP>
__device__ __forceinline__ void consume(const P& p, const VP& vp, const Bars& bars, u32 sq, u32 sk, u32 sv,
                                        const Unit* slot, int cw, int tid) {
  using namespace sm90;
  using mma::pack2;
  using mma::quad_max;
  using mma::quad_sum;
  using fmath::ex2;
  using fmath::lg2;
  constexpr int D = 128;
  constexpr int kTileBytes = Shape<D>::kTileBytes;
  using Tile = Sw128Tile<kBlockN>;
  using QTile = Sw128Tile<kBlockM>;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const u32 q_base = sq + cw * 64 * 128;
  const float sm_scale = p.sm_scale;
  // Leading slopes (ALiBi: variant::kFoldSlope) start each tile's Q·K^T accumulators at the rows' linear key bias in
  // accumulator units (one FFMA per logit before the MMAs); only the chain's other logits pieces run per logit.
  constexpr bool kFold = variant::kFoldSlope<V>;
  constexpr bool kTileLogits = variant::kTileLogits<V>;
  // the softmax's base-2 exponent: per-logit pieces return natural logits (sm_scale applied); otherwise the scores are
  // in accumulator units and sm_scale folds in here
  const float sl2 = kTileLogits ? kLog2e : p.sm_scale_log2;

  auto my_turn = [&]() { named_barrier_sync(1 + cw, 256); };
  auto their_turn = [&]() { named_barrier_arrive(2 - cw, 256); };
  if (cw == 1) named_barrier_arrive(1, 256);  // consumer 0 goes first

  int tile0 = 0;  // K / V tiles consumed before this unit
  for (int n_q = 0;; ++n_q) {
    mbar_wait(bars.q_full(), n_q & 1);
    const Unit w = *slot;
    if (w.n_tiles < 0) break;
    const int n_tiles = w.n_tiles, t_first = w.t_first;
    const int my_row = w.row0 + cw * 64 + warp * 16 + g;  // rows my_row and my_row + 8 of the request
    const int diag = w.kv_len - w.qo_len;                // row r is at kv position r + diag
    const int kvh = w.head / p.group_size;
    // this thread's two rows (h = 0: my_row, h = 1: my_row + 8): Index, RowState, key range [lo, hi)
    variant::Index ix[2];
    typename V::RowState rs[2] = {};
    int lo[2], hi[2];
    float slope_acc[2] = {0.f, 0.f};  // (kFold) the rows' leading slope in accumulator units
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = my_row + 8 * h;
      ix[h] = variant::Index{w.req, r, r + diag, w.head, kvh, w.qo_len, w.kv_len, D};
      if constexpr (V::kRowState) rs[h] = V::row_state(vp, ix[h]);
      lo[h] = variant::kNoLowerBound, hi[h] = w.kv_len;
      V::key_range(vp, ix[h], lo[h], hi[h]);
      hi[h] = min(hi[h], w.key_hi);  // (a split piece's end)
      if constexpr (kFold) slope_acc[h] = V::slope_lead(vp, ix[h], rs[h]) / sm_scale;
    }

    float o_acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
    float m[2] = {neg_inf(), neg_inf()};
    float l[2] = {0.f, 0.f};

    auto issue_qk = [&](float (&sc)[64], int i) {
      const int s = (tile0 + i) % kStages;
      const u32 kt = sk + s * kTileBytes;
      mbar_wait(bars.k_full(s), ((tile0 + i) / kStages) & 1);
      if constexpr (kFold) {  // element (j, e) of row h: a (dist0 + 8 j + e % 2), a the slope in accumulator units
        const int key0 = (t_first + i) * kBlockN;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float b = slope_acc[h] * static_cast<float>(key0 + 2 * t - ix[h].qpos);
#pragma unroll
          for (int j = 0; j < 16; ++j) {
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e) sc[4 * j + e] = fmaf(slope_acc[h], float(8 * j + (e & 1)), b);
          }
        }
      }
      fence_regs(sc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const u32 off = (kk % 4) * 32;
        const u64 da = smem_desc_sw128(q_base + (kk / 4) * QTile::kBlockBytes + off, 16, 1024);
        const u64 db = smem_desc_sw128(kt + (kk / 4) * Tile::kBlockBytes + off, 16, 1024);
        wgmma_m64n128k16_ss<T, 0>(sc, da, db, kFold || kk > 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](u32 (&pa)[8][4], int i) {
      const int s = (tile0 + i) % kStages;
      const u32 vt = sv + s * kTileBytes;
      mbar_wait(bars.v_full(s), ((tile0 + i) / kStages) & 1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const u64 db = smem_desc_sw128(vt + kk * 16 * 128, Tile::kBlockBytes, 1024);
        wgmma_m64n128k16_rs<T, 1>(o_acc, pa[kk], db);
      }
      wgmma_commit();
    };
    auto release_k = [&](int i) { mbar_arrive(bars.k_empty((tile0 + i) % kStages)); };
    auto release_v = [&](int i) { mbar_arrive(bars.v_empty((tile0 + i) % kStages)); };
    // masks tile i's scores, moves the running max, turns the scores into P in place and gives the factor the output
    // accumulators take for the new max (per row half)
    auto softmax = [&](float (&sc)[64], int i, float (&corr)[2]) {
      const int key0 = (t_first + i) * kBlockN;
      // element (j, e) is the logit of row h = e / 2 and key key0 + 8 j + 2 t + e % 2
      const bool need_mask = V::kMask || key0 + kBlockN > w.mask_hi || key0 < w.mask_lo;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float dist0 = static_cast<float>(key0 + 2 * t - ix[h].qpos);  // kv_dist of the row's first key here
#pragma unroll
        for (int j = 0; j < 16; ++j) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            const int key = key0 + 8 * j + 2 * t + (e & 1);
            float x = sc[4 * j + e];
            if constexpr (kTileLogits) {
              const float dist = dist0 + static_cast<float>(8 * j + (e & 1));
              if constexpr (kFold) {
                x = V::logits_rest(vp, ix[h], rs[h], key, dist, x * sm_scale);
              } else {
                x = V::logits(vp, ix[h], rs[h], key, dist, x * sm_scale);
              }
            }
            if (need_mask) {
              bool keep = key < hi[h];
              if constexpr (V::kLowerBound) keep = keep && key >= lo[h];
              if constexpr (V::kMask) {
                if (keep) keep = V::mask(vp, ix[h], key);
              }
              x = keep ? x : neg_inf();
            }
            sc[4 * j + e] = x;
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = m[h];
#pragma unroll
        for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * h], sc[4 * j + 2 * h + 1]));
        mx = quad_max(mx);
        const float ms = mx == neg_inf() ? 0.f : mx * sl2;
        corr[h] = ex2(m[h] * sl2 - ms);  // m = -inf: 0
        m[h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          sc[4 * j + 2 * h] = ex2(fmaf(sc[4 * j + 2 * h], sl2, -ms));
          sc[4 * j + 2 * h + 1] = ex2(fmaf(sc[4 * j + 2 * h + 1], sl2, -ms));
          sum += sc[4 * j + 2 * h] + sc[4 * j + 2 * h + 1];
        }
        l[h] = l[h] * corr[h] + sum;
      }
    };
    auto pack_p = [&](const float (&sc)[64], u32 (&pa)[8][4]) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
        for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<T>(sc[8 * kk + 2 * e], sc[8 * kk + 2 * e + 1]);
      }
    };
    auto rescale = [&](const float (&corr)[2]) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o_acc[4 * j + 0] *= corr[0];
        o_acc[4 * j + 1] *= corr[0];
        o_acc[4 * j + 2] *= corr[1];
        o_acc[4 * j + 3] *= corr[1];
      }
    };

    u32 pa[8][4];
    float corr[2];
    if (n_tiles > 0) {  // (none: e.g. rows of a causal request with more rows than keys, that see no key)
      float sc[64];
      my_turn();
      issue_qk(sc, 0);
      their_turn();
      wgmma_wait<0>();
      fence_regs(sc);
      release_k(0);
      softmax(sc, 0, corr);
      pack_p(sc, pa);
    }
    for (int i = 1; i < n_tiles; ++i) {
      float sc[64];
      my_turn();
      issue_qk(sc, i);
      rescale(corr);
      issue_pv(pa, i - 1);
      their_turn();
      wgmma_wait<1>();
      fence_regs(sc);
      release_k(i);
      softmax(sc, i, corr);
      wgmma_wait<0>();
      fence_regs(o_acc);
      release_v(i - 1);
      pack_p(sc, pa);
    }
    mbar_arrive(bars.q_empty());  // every Q·K^T of the unit has retired
    if (n_tiles > 0) {
      rescale(corr);
      my_turn();
      issue_pv(pa, n_tiles - 1);
      their_turn();
      wgmma_wait<0>();
      fence_regs(o_acc);
      release_v(n_tiles - 1);
    }
    tile0 += n_tiles;

    // epilogue: o / l in the output dtype and the base-2 lse, or the fp32 partial state of a split item
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(l[h]);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const float lse = sum > 0.f ? m[h] * sl2 + lg2(sum) : neg_inf();
      const int row = my_row + 8 * h;
      if (row >= w.qo_len) continue;
      if (w.partial < 0) {
        const i64 token = w.q0 + row;
        T* orow = static_cast<T*>(p.o) + token * p.o_stride_n + w.head * p.o_stride_h;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          *reinterpret_cast<u32*>(orow + 8 * j + 2 * t) =
              pack2<T>(o_acc[4 * j + 2 * h] * inv, o_acc[4 * j + 2 * h + 1] * inv);
        }
        if (p.lse != nullptr && t == 0) {
          static_cast<float*>(p.lse)[token * p.lse_stride_n + w.head * p.lse_stride_h] = lse;
        }
      } else {
        const i64 prow = static_cast<i64>(w.partial) + (row - w.row0);
        float* dst = static_cast<float*>(p.partial_o) + prow * D + 2 * t;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o_acc[4 * j + 2 * h] * inv, o_acc[4 * j + 2 * h + 1] * inv);
        }
        if (t == 0) static_cast<float*>(p.partial_lse)[prow] = lse;
      }
    }
  }
}

}  // namespace prefill_sm90
}  // namespace cuinfer
