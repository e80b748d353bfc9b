// Hopper prefill: a consumer warpgroup (two per CTA, 64 query rows each). Per K / V tile: S = Q K^T (8 wgmma
// m64n128k16 from shared memory), the variant's logits and masks, the online softmax in registers, O += P V (8 wgmma
// with P from registers, V MN-major; float16 for fp8 K / V, bfloat16 Q rows converted once per item). Tile i's Q K^T
// is issued before tile i-1's P V (FA3's intra-warpgroup overlap)
// and the two consumers take turns to issue (ping-pong, named barriers 1 and 2), so one's softmax runs while the
// other's MMAs do. A stage's K is handed back when its Q K^T retires, its V when its P V does. The epilogue writes o
// and the base-2 lse (an unsplit item) or the fp32 partial state (a split item, merged by the merge kernel).
//
// Register rule (ptxas C7513 otherwise serialises every wgmma of the kernel): no register an issued wgmma reads is
// written before its wait, so P is packed only after the previous P V retired.
#pragma once
#include "attention/prefill_sm90/unit.cuh"
#include "common/fp8.cuh"
#include "common/math.cuh"
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/wgmma.cuh"
#include "debug/sm90_probe.cuh"
#include "state/merge.cuh"

namespace cuinfer {
namespace prefill_sm90 {

// What a consumer thread knows of its two rows of a unit (h = 0: row my_row, h = 1: my_row + 8): the variant's Index
// and RowState, the key range [lo, hi) (hi clipped to a split piece's end), the leading slope in accumulator units
// (kFoldSlope), the online softmax's running max m and partial sum l (this thread's share of the row), and q_inv: an
// accumulator unit in units of q·k (the inverse of the row's Q scale: bfloat16 q with fp8 K / V, convert_q_rows; 1
// otherwise).
template <class V> struct Rows {
  variant::Index ix[2];
  typename V::RowState rs[2];
  int lo[2], hi[2];
  float slope_acc[2];
  float m[2], l[2];
  float q_inv[2];
};

template <class V, class P, class VP>
__device__ __forceinline__ void init_rows(Rows<V>& r, const P& p, const VP& vp, const Unit& w, int my_row,
                                          float sm_scale, const float (&q_inv)[2]) {
  const int diag = w.kv_len - w.qo_len;  // row i is at kv position i + diag
  const int kvh = w.head / p.group_size;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = my_row + 8 * h;
    r.ix[h] = variant::Index{w.req, row, row + diag, w.head, kvh, w.qo_len, w.kv_len, 128};
    r.rs[h] = {};
    if constexpr (V::kRowState) r.rs[h] = V::row_state(vp, r.ix[h]);
    r.lo[h] = variant::kNoLowerBound, r.hi[h] = w.kv_len;
    V::key_range(vp, r.ix[h], r.lo[h], r.hi[h]);
    r.hi[h] = min(r.hi[h], w.key_hi);  // (a split piece's end)
    r.q_inv[h] = q_inv[h];
    r.slope_acc[h] = 0.f;
    if constexpr (variant::kFoldSlope<V>) r.slope_acc[h] = V::slope_lead(vp, r.ix[h], r.rs[h]) / (sm_scale * q_inv[h]);
    r.m[h] = neg_inf();
    r.l[h] = 0.f;
  }
}

// S = Q K^T of the K tile at `kt` (keys from key0), issued, not waited for. Leading slopes (ALiBi: kFoldSlope) start
// the accumulators at the rows' linear key bias in accumulator units (one FFMA per logit before the MMAs), so only the
// chain's other logits pieces run per logit after them.
template <class T, class V>
__device__ __forceinline__ void issue_qk(float (&sc)[64], u32 q_base, u32 kt, const Rows<V>& r, int key0, int t) {
  using namespace sm90;
  constexpr bool kFold = variant::kFoldSlope<V>;
  if constexpr (kFold) {  // element (j, e) of row h: a (dist0 + 8 j + e % 2), a the slope in accumulator units
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float b = r.slope_acc[h] * static_cast<float>(key0 + 2 * t - r.ix[h].qpos);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) sc[4 * j + e] = fmaf(r.slope_acc[h], float(8 * j + (e & 1)), b);
      }
    }
  }
  fence_regs(sc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 128 / 16; ++kk) {
    const u32 off = (kk % 4) * 32;
    const u64 da = smem_desc_sw128(q_base + (kk / 4) * Sw128Tile<kBlockM>::kBlockBytes + off, 16, 1024);
    const u64 db = smem_desc_sw128(kt + (kk / 4) * Sw128Tile<kBlockN>::kBlockBytes + off, 16, 1024);
    wgmma_m64n128k16_ss<T, 0>(sc, da, db, kFold || kk > 0);
  }
  wgmma_commit();
}

// O += P V of the V tile at `vt` (P as the 16-bit A fragments), issued, not waited for.
template <class T>
__device__ __forceinline__ void issue_pv(float (&o_acc)[64], const u32 (&pa)[8][4], u32 vt) {
  using namespace sm90;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const u64 db = smem_desc_sw128(vt + kk * 16 * 128, Sw128Tile<kBlockN>::kBlockBytes, 1024);
    wgmma_m64n128k16_rs<T, 1>(o_acc, pa[kk], db);
  }
  wgmma_commit();
}

// The base-2 exponent per score unit of row half h: sl2, times the row's q_inv where the scores are in accumulator
// units of a scaled Q (kRowScale; per-logit pieces return natural logits, sm_scale and q_inv already applied).
template <bool kRowScale, class V> __device__ __forceinline__ float row_sl2(float sl2, const Rows<V>& r, int h) {
  return kRowScale && !variant::kTileLogits<V> ? sl2 * r.q_inv[h] : sl2;
}

// Scaled logits (variant::kScaledLogits: the soft cap's c · r(x / c), |r| <= 1): the scores become r, the variant's
// core of x / c (1 / c folded into the one multiply by sm_scale), and c into sl2, the exponent per score unit.
template <class V> constexpr bool kScaledTiles = variant::kTileLogits<V> && V::kScaledLogits && !variant::kFoldSlope<V>;

// The max-free softmax of bounded logits (kMaxFree, the host's choice: scaled logits, bfloat16 P, c log2(e) <= 79,
// MAX_FREE_BOUND in cuinfer/prefill/sm90.py): every tile's exponentials are taken against the fixed reference c log2(e) - kMaxFreeHeadroom, so
// p = 2^(s - ref) lies in [2^(kMaxFreeHeadroom - 2 c log2 e), 2^kMaxFreeHeadroom]: a normal float (and bfloat16)
// for c log2(e) <= 79, and a row sum of 2^31 keys' p stays below float's largest. No running max, no quad shuffles,
// no rescaling of the output accumulators; the lse is ref + log2(l) as before (r.m holds ref in score units).
constexpr float kMaxFreeHeadroom = 32.f;

// Masks the scores of the tile at key0 (kMasked: a boundary tile, tile_masked), moves the running max, turns the
// scores into P in place and gives the factor the output accumulators take for the new max (per row half; 1 with
// kMaxFree). Element (j, e) of sc is the logit of row h = e / 2 and key key0 + 8 j + 2 t + e % 2. `sl2`: the base-2
// exponent per score unit (kRowScale: per unit of q·k, the rows' q_inv applied here).
template <bool kRowScale, bool kMaxFree, bool kMasked, class V, class VP>
__device__ __forceinline__ void softmax_tile(float (&sc)[64], Rows<V>& r, const VP& vp, int key0, int t, float sm_scale,
                                             float sl2, float (&corr)[2]) {
  constexpr bool kFold = variant::kFoldSlope<V>;
  constexpr bool kScaled = kScaledTiles<V>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sms = (kRowScale ? sm_scale * r.q_inv[h] : sm_scale) * (kScaled ? V::logits_inv_scale(vp) : 1.f);
    const float dist0 = static_cast<float>(key0 + 2 * t - r.ix[h].qpos);  // kv_dist of the row's first key here
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        const int key = key0 + 8 * j + 2 * t + (e & 1);
        float x = sc[4 * j + e];
        if constexpr (variant::kTileLogits<V>) {
          const float dist = dist0 + static_cast<float>(8 * j + (e & 1));
          if constexpr (kScaled) {
            x = V::logits_core(vp, r.ix[h], r.rs[h], key, dist, x * sms);
          } else if constexpr (kFold) {
            x = V::logits_rest(vp, r.ix[h], r.rs[h], key, dist, x * sms);
          } else {
            x = V::logits(vp, r.ix[h], r.rs[h], key, dist, x * sms);
          }
        }
        if constexpr (kMasked) {
          bool keep = key < r.hi[h];
          if constexpr (V::kLowerBound) keep = keep && key >= r.lo[h];
          if constexpr (V::kMask) {
            if (keep) keep = V::mask(vp, r.ix[h], key);
          }
          x = keep ? x : neg_inf();
        }
        sc[4 * j + e] = x;
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float s2 = row_sl2<kRowScale>(sl2, r, h);
    float ms;
    if constexpr (kMaxFree) {
      ms = r.m[h] * s2;
      corr[h] = 1.f;
    } else {
      float mx = r.m[h];
#pragma unroll
      for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * h], sc[4 * j + 2 * h + 1]));
      mx = mma::quad_max(mx);
      ms = mx == neg_inf() ? 0.f : mx * s2;
      corr[h] = fmath::ex2(r.m[h] * s2 - ms);  // m = -inf: 0
      r.m[h] = mx;
    }
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      sc[4 * j + 2 * h] = fmath::ex2(fmaf(sc[4 * j + 2 * h], s2, -ms));
      sc[4 * j + 2 * h + 1] = fmath::ex2(fmaf(sc[4 * j + 2 * h + 1], s2, -ms));
      sum += sc[4 * j + 2 * h] + sc[4 * j + 2 * h + 1];
    }
    r.l[h] = kMaxFree ? r.l[h] + sum : r.l[h] * corr[h] + sum;
  }
}

// Whether the tile at key0 needs its keys masked: a custom mask, or keys past some row's bounds.
template <class V> __device__ __forceinline__ bool tile_masked(const Unit& w, int key0) {
  return V::kMask || key0 + kBlockN > w.mask_hi || key0 < w.mask_lo;
}

// softmax_tile in two copies, chosen per tile (the choice is uniform): interior tiles run no key compares at all.
// With one copy and a runtime condition ptxas folded the condition into a compare and select per logit on every tile,
// and moved the softmax below the P V wait; the two copies keep it between the waits, overlapping P V
// (tests/compile/test_sm90_schedule.py). A custom mask (every tile) keeps one copy after the wait: before it, with
// the mask's registers, the kernel spilled 120-160 bytes.
template <bool kRowScale, bool kMaxFree, class V, class VP>
__device__ __forceinline__ void softmax_any_tile(float (&sc)[64], Rows<V>& r, const VP& vp, const Unit& w, int key0,
                                                 int t, float sm_scale, float sl2, float (&corr)[2]) {
  if (tile_masked<V>(w, key0)) {
    softmax_tile<kRowScale, kMaxFree, true>(sc, r, vp, key0, t, sm_scale, sl2, corr);
  } else if constexpr (!V::kMask) {
    softmax_tile<kRowScale, kMaxFree, false>(sc, r, vp, key0, t, sm_scale, sl2, corr);
  }
}

// P as the 16-bit A fragments of P V
template <class T> __device__ __forceinline__ void pack_p(const float (&sc)[64], u32 (&pa)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) pa[kk][e] = mma::pack2<T>(sc[8 * kk + 2 * e], sc[8 * kk + 2 * e + 1]);
  }
}

template <bool kMaxFree> __device__ __forceinline__ void rescale(float (&o_acc)[64], const float (&corr)[2]) {
  if constexpr (!kMaxFree) {  // (max-free: corr is 1)
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o_acc[4 * j + 0] *= corr[0];
      o_acc[4 * j + 1] *= corr[0];
      o_acc[4 * j + 2] *= corr[1];
      o_acc[4 * j + 3] *= corr[1];
    }
  }
}

// The unit's rows: o / l (times v_scale: fp8 V) in the output dtype and the base-2 lse, or the fp32 partial state of
// a split item.
template <class T, bool kRowScale, class V, class P>
__device__ __forceinline__ void store_rows(const P& p, const Unit& w, const Rows<V>& r, const float (&o_acc)[64],
                                           int my_row, int t, float sl2, float v_scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = mma::quad_sum(r.l[h]);
    const float inv = state::inv_of(sum) * v_scale;
    const float lse = state::lse_of(r.m[h] * row_sl2<kRowScale>(sl2, r, h), sum);
    const int row = my_row + 8 * h;
    if (row >= w.qo_len) continue;
    if (w.partial < 0) {
      const i64 token = w.q0 + row;
      T* orow = static_cast<T*>(p.o) + token * p.o_stride_n + w.head * p.o_stride_h;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        *reinterpret_cast<u32*>(orow + 8 * j + 2 * t) =
            mma::pack2<T>(o_acc[4 * j + 2 * h] * inv, o_acc[4 * j + 2 * h + 1] * inv);
      }
      if (p.lse != nullptr && t == 0) static_cast<float*>(p.lse)[token * p.lse_stride_n + w.head * p.lse_stride_h] = lse;
    } else {
      const i64 prow = static_cast<i64>(w.partial) + (row - w.row0);
      float* dst = static_cast<float*>(p.partial_o) + prow * 128 + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) =
            make_float2(o_acc[4 * j + 2 * h] * inv, o_acc[4 * j + 2 * h + 1] * inv);
      }
      if (t == 0) static_cast<float*>(p.partial_lse)[prow] = lse;
    }
  }
}

// bfloat16 q with fp8 K / V (the MMAs in float16): this consumer's 64 Q rows to float16 in place, each times the power
// of two that puts its largest |q| in [2^14, 2^15) (fp8::q_f16_scale: nothing overflows, every bfloat16 value within
// 2^28 of the row's largest converts exactly, as the FA2-class kernel's convert_q). Thread t converts the 64 elements
// of row t / 2 in column block t % 2 (eight 16-byte chunks; the swizzle only permutes chunks within a row, so the
// chunk order does not matter: thread t starts at chunk t % 8, and a quarter-warp's accesses hit distinct banks) and
// returns its row's inverse scale 2^-s. The warpgroup synchronises (named barrier 4 + cw) before its wgmma read Q.
__device__ __forceinline__ float convert_q_rows(u32 q_base, int cw, int tid) {
  const u32 row = q_base + (tid % 2) * sm90::Sw128Tile<kBlockM>::kBlockBytes + (tid / 2) * 128;
  __nv_bfloat162 m2 = __float2bfloat162_rn(0.f);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint4 x;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w) : "r"(row + ((i + tid) % 8) * 16));
    const u32 w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) m2 = fp8::q_abs_max2(m2, w[j]);
  }
  u32 b = *reinterpret_cast<const u32*>(&m2);
  b = __shfl_xor_sync(0xffffffffu, b, 1);  // (the row's other column block)
  m2 = __hmax2(m2, *reinterpret_cast<const __nv_bfloat162*>(&b));
  float inv;
  const u32 sc2 = fp8::q_f16_pow2(m2, inv);  // 2^s in both bfloat16 halves
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const u32 a = row + ((i + tid) % 8) * 16;
    u32 w[4];
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(a));
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = fp8::q_f16_times(w[j], sc2);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
  }
  sm90::fence_proxy_async();  // (generic-proxy stores, read by the async proxy of wgmma)
  sm90::named_barrier_sync(4 + cw, 128);
  return inv;
}

// The consumer warpgroup `cw` (0 or 1): every unit the producer hands over, until it says there is none left.
// T: q's and o's type; TM: the MMAs' operand type (T, or float16 for fp8 K / V); KVT: K / V's element type (fp8: the
// k_scale, the number folded into sm_scale times the KV head's from k_scales, scales the logits, v_scale the output).
// kFenceStages: the stages were written through the generic proxy and nobody fenced the proxies (paged K / V:
// cp.async; fp8: the producer's conversion; mbarrier.cuh). kMaxFree: the max-free softmax (softmax_tile).
template <class T, class TM, class KVT, class V, bool kFenceStages, bool kMaxFree, class P, class VP>
__device__ __forceinline__ void consume(const P& p, const VP& vp, const Bars& bars, u32 sq, u32 sk, u32 sv,
                                        const Unit* slot, int cw, int tid) {
  using namespace sm90;
  constexpr int kTileBytes = Shape<128>::kTileBytes;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const u32 q_base = sq + cw * 64 * 128;
  constexpr bool kFp8 = fp8::IsFp8<KVT>::value;
  constexpr bool kRowScale = !is_same<T, TM>::value;  // bfloat16 q, float16 MMAs: Q scaled per row (convert_q_rows)
  static_assert(!kMaxFree || (kScaledTiles<V> && is_same<TM, __nv_bfloat16>::value),
                "the max-free softmax is for scaled logits with bfloat16 P (its p reach 2^32)");
  auto my_turn = [&]() {
    SM90_PROBE_START(probe_t);
    named_barrier_sync(1 + cw, 256);
    SM90_PROBE_STOP(probe_t, 3);
  };
  auto their_turn = [&]() { named_barrier_arrive(2 - cw, 256); };
  if (cw == 1) named_barrier_arrive(1, 256);  // consumer 0 goes first

  int tile0 = 0;  // K / V tiles consumed before this unit (stage and fill count of tile i: tile0 + i)
  for (int n_q = 0;; ++n_q) {
    SM90_PROBE_START(probe_q);
    mbar_wait(bars.q_full(), n_q & 1);
    SM90_PROBE_STOP(probe_q, 4);
    const Unit w = *slot;
    if (w.n_tiles < 0) break;
    const int kvh = w.head / p.group_size;
    const float k_scale = kFp8 ? fp8::head_scale(p.k_scales, p.k_scales_stride, kvh) : 1.f;
    const float sm_scale = kFp8 ? p.sm_scale * k_scale : p.sm_scale;
    // the softmax's base-2 exponent per score unit: per-logit pieces return natural logits (sm_scale applied);
    // otherwise the scores are in accumulator units and sm_scale folds in here
    // (scaled logits: the scores are the variant's core r, the logit c r)
    const float sl2 = variant::kTileLogits<V> ? kLog2e * (kScaledTiles<V> ? V::logits_scale(vp) : 1.f)
                      : kFp8                  ? p.sm_scale_log2 * k_scale
                                              : p.sm_scale_log2;
    const int n_tiles = w.n_tiles;
    const int my_row = w.row0 + cw * 64 + warp * 16 + g;  // rows my_row and my_row + 8 of the request
    float q_inv[2] = {1.f, 1.f};
    if constexpr (kRowScale) {
      if (n_tiles > 0) {  // (rows my_row, my_row + 8 of the warpgroup were converted by its lanes 2 g, 2 g + 16)
        const float inv = convert_q_rows(q_base, cw, tid);
        q_inv[0] = __shfl_sync(0xffffffffu, inv, 2 * g);
        q_inv[1] = __shfl_sync(0xffffffffu, inv, 2 * g + 16);
      }
    }
    Rows<V> r;
    init_rows(r, p, vp, w, my_row, sm_scale, q_inv);
    if constexpr (kMaxFree) {  // the reference in score units: (c log2(e) - headroom) / (c log2(e))
      r.m[0] = r.m[1] = 1.f - kMaxFreeHeadroom * (1.f / kLog2e) * V::logits_inv_scale(vp);
    }
    float o_acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
    auto k_tile = [&](int i) {
      const int n = tile0 + i;
      SM90_PROBE_START(probe_k);
      mbar_wait(bars.k_full(n % kStages), (n / kStages) & 1);
      SM90_PROBE_STOP(probe_k, 1);
      if constexpr (kFenceStages) fence_proxy_async();  // (generic-proxy writes to the stage: mbarrier.cuh)
      return sk + (n % kStages) * kTileBytes;
    };
    auto v_tile = [&](int i) {
      const int n = tile0 + i;
      SM90_PROBE_START(probe_v);
      mbar_wait(bars.v_full(n % kStages), (n / kStages) & 1);
      SM90_PROBE_STOP(probe_v, 2);
      if constexpr (kFenceStages) fence_proxy_async();
      return sv + (n % kStages) * kTileBytes;
    };
    auto key0 = [&](int i) { return (w.t_first + i) * kBlockN; };
    // Tile i's Q K^T is issued, then (after the rescale for tile i - 1's max) tile i - 1's P V behind it; the
    // softmax of tile i runs while that P V completes. A stage's K goes back when its Q K^T retired, its V when its
    // P V did.
    u32 pa[8][4];
    float corr[2];
    if (n_tiles > 0) {  // (none: e.g. rows of a causal request with more rows than keys, that see no key)
      float sc[64];
      my_turn();
      issue_qk<TM, V>(sc, q_base, k_tile(0), r, key0(0), t);
      their_turn();
      wgmma_wait<0>();
      fence_regs(sc);
      mbar_arrive(bars.k_empty(tile0 % kStages));
      softmax_any_tile<kRowScale, kMaxFree>(sc, r, vp, w, key0(0), t, sm_scale, sl2, corr);
      pack_p<TM>(sc, pa);
    }
    for (int i = 1; i < n_tiles; ++i) {
      float sc[64];
      my_turn();
      issue_qk<TM, V>(sc, q_base, k_tile(i), r, key0(i), t);
      rescale<kMaxFree>(o_acc, corr);
      issue_pv<TM>(o_acc, pa, v_tile(i - 1));
      their_turn();
      SM90_PROBE_START(probe_w1);
      wgmma_wait<1>();
      SM90_PROBE_STOP(probe_w1, 6);
      fence_regs(sc);
      mbar_arrive(bars.k_empty((tile0 + i) % kStages));
      SM90_PROBE_START(probe_s);
      softmax_any_tile<kRowScale, kMaxFree>(sc, r, vp, w, key0(i), t, sm_scale, sl2, corr);
      SM90_PROBE_STOP(probe_s, 5);
      SM90_PROBE_START(probe_w0);
      wgmma_wait<0>();
      SM90_PROBE_STOP(probe_w0, 7);
      fence_regs(o_acc);
      mbar_arrive(bars.v_empty((tile0 + i - 1) % kStages));
      pack_p<TM>(sc, pa);
    }
    mbar_arrive(bars.q_empty());  // every Q K^T of the unit has retired
    if (n_tiles > 0) {
      rescale<kMaxFree>(o_acc, corr);
      my_turn();
      issue_pv<TM>(o_acc, pa, v_tile(n_tiles - 1));
      their_turn();
      wgmma_wait<0>();
      fence_regs(o_acc);
      mbar_arrive(bars.v_empty((tile0 + n_tiles - 1) % kStages));
    }
    tile0 += n_tiles;
    const float v_scale = kFp8 ? p.v_scale * fp8::head_scale(p.v_scales, p.v_scales_stride, kvh) : 1.f;
    store_rows<T, kRowScale>(p, w, r, o_acc, my_row, t, sl2, v_scale);
  }
}

}  // namespace prefill_sm90
}  // namespace cuinfer
