// Lab prototype of the Hopper prefill kernel (wgmma + TMA + warp specialisation): ragged K/V, 16-bit q/k/v, head dim
// 128, one q head per work unit, any softmax variant of logits, key ranges and masks (the contract of
// kernel_src/variants/contract.cuh: the translation unit starts with the rendered chain, `Variant` and
// `VariantParams`, as the product kernels do). It measures what the sm90 kernel's design is worth before the product
// kernel is built on the seams of prefill_sm80 (work items, epilogue, paged loader). Run by bench/lab/sm90_proto.py.
//
// Persistent CTAs of 3 warpgroups. Warpgroup 0, the producer (24 registers; 56 with cp.async), loads a unit's 128 q
// rows and its K and V tiles of 128 keys into a ring of stages (TMA boxes, or cp.async with PROTO_TMA=0), signalling
// each tile on mbarriers, K and V apart. Warpgroups 1 and 2, the consumers (240 registers; 224), own 64 q rows each:
// per tile S = Q K^T (8 wgmma m64n128k16 from shared memory), the variant's logits and masks, the online softmax in
// registers, O += P V (8 wgmma with P from registers, V MN-major); tile i's Q K^T is issued before tile i-1's P V
// (FA3's intra-warpgroup overlap) and the two consumers take turns to issue (ping-pong), so one's softmax runs while
// the other's MMAs do. A stage's K is handed back when its Q K^T retires, its V when its P V does. Compile-time
// switches (PROTO_*) keep the earlier steps for A/B runs.
#include "common/cp_async.cuh"
#include "common/math.cuh"
#include "common/mbarrier.cuh"
#include "common/mma.cuh"
#include "common/types.cuh"
#include "common/wgmma.cuh"

using namespace cuinfer;
using namespace cuinfer::sm90;
using cuinfer::mma::pack2;
using cuinfer::mma::quad_max;
using cuinfer::mma::quad_sum;
using cuinfer::mma::smem_addr;
using cuinfer::fmath::ex2;
using cuinfer::fmath::lg2;

#ifndef PROTO_T
#define PROTO_T __nv_bfloat16
#endif
#ifndef PROTO_OVERLAP
#define PROTO_OVERLAP 1
#endif
#ifndef PROTO_PINGPONG
#define PROTO_PINGPONG 1
#endif
#ifndef PROTO_PRODUCER_FENCE
#define PROTO_PRODUCER_FENCE 1
#endif
#ifndef PROTO_SPLIT_RELEASE
#define PROTO_SPLIT_RELEASE 1
#endif
#ifndef PROTO_TMA
#define PROTO_TMA 1
#endif
#ifndef PROTO_DYNAMIC  // 1: units handed out by an atomic counter (heaviest first: LPT), TMA builds only
#define PROTO_DYNAMIC 0
#endif
#ifndef PROTO_STAGES
#define PROTO_STAGES 2
#endif

namespace {

constexpr int kD = 128;           // head dim
constexpr int kBlockM = 128;      // q rows per CTA (64 per consumer warpgroup)
constexpr int kBlockN = 128;      // keys per tile
constexpr int kStages = PROTO_STAGES;
constexpr int kTileBytes = kBlockN * kD * 2;  // one K or V tile
constexpr int kQBytes = kBlockM * kD * 2;

using T = PROTO_T;
using Tile = Sw128Tile<kBlockN>;
using QTile = Sw128Tile<kBlockM>;

struct Bars {
  u32 base;
  __device__ u32 q_full() const { return base; }
  __device__ u32 q_empty() const { return base + 8; }
  __device__ u32 k_full(int s) const { return base + 8 * (2 + s); }
  __device__ u32 v_full(int s) const { return base + 8 * (2 + kStages + s); }
  __device__ u32 k_empty(int s) const { return base + 8 * (2 + 2 * kStages + s); }
  __device__ u32 v_empty(int s) const { return base + 8 * (2 + 3 * kStages + s); }
#if PROTO_DYNAMIC
  __device__ u32 unit_slot() const { return base + 8 * (2 + 4 * kStages); }  // a Unit (48 bytes)
#endif
};

// Copies `rows` rows (stride `stride` elements) of 128 16-bit elements from `src` into a swizzled tile, zero-filling
// rows at and past `valid_rows`. 128 threads: thread t copies chunk t % 16 of rows t / 16 + 8 i, which share the
// swizzle (r % 8): one shared address plus i * 1024, one global pointer plus i * 8 rows.
template <int ROWS>
__device__ __forceinline__ void copy_tile(u32 dst, const T* src, i64 stride, int valid_rows, int tid) {
  const int c = tid % 16, r0 = tid / 16;
  const u32 s0 = dst + Sw128Tile<ROWS>::chunk_offset(r0, c);
  const T* g = src + r0 * stride + c * 8;
  const u32 step = static_cast<u32>(8 * stride);  // elements between rows r and r + 8 (< 2^31: checked by the host)
#pragma unroll
  for (int i = 0; i < ROWS / 8; ++i) {
    const bool ok = r0 + 8 * i < valid_rows;
    cp_async_16(s0 + i * 1024, ok ? g : src, ok);
    g += step;
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(384, 1)
    sm90_prefill_proto(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                       float* __restrict__ lse, const int* __restrict__ qo_indptr, const int* __restrict__ kv_indptr,
                       const int* __restrict__ items, int* __restrict__ sched, int n_items, int num_qo_heads,
                       int num_kv_heads,
                       float scale_log2, const __grid_constant__ VariantParams vp,
                       const __grid_constant__ TmaDesc tm_q,
                       const __grid_constant__ TmaDesc tm_k, const __grid_constant__ TmaDesc tm_v) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 smem0 = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const u32 sq = smem0;
  const u32 sk = sq + kQBytes;                  // stage s: sk + s * kTileBytes
  const u32 sv = sk + kStages * kTileBytes;     // stage s: sv + s * kTileBytes
  const Bars bars{sv + kStages * kTileBytes};

  // Persistent CTAs: work unit u = (item u / H, q head u % H) for u = blockIdx.x, + gridDim.x, ...; items[2 w] =
  // request, items[2 w + 1] = q block, in the host's order (heaviest first), so the q heads of one block run side by
  // side and share their K/V tiles in the L2. The producer runs ahead across units: it loads the next unit's Q once
  // the consumers release the Q tile (q_empty) and keeps the K/V ring's stage count running.
  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    constexpr u32 kFillArrivals = PROTO_TMA ? 1 : 128;  // TMA: one elected thread; cp.async: every producer thread
    mbar_init(bars.q_full(), kFillArrivals);
    mbar_init(bars.q_empty(), 256);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bars.k_full(s), kFillArrivals);
      mbar_init(bars.v_full(s), kFillArrivals);
      mbar_init(bars.k_empty(s), 256);
      mbar_init(bars.v_empty(s), 256);
    }
  }
  __syncthreads();

  const i64 q_stride = static_cast<i64>(num_qo_heads) * kD;
  [[maybe_unused]] const i64 kv_stride = static_cast<i64>(num_kv_heads) * kD;  // (cp.async producer)
  const int group = num_qo_heads / num_kv_heads;
  const int n_units = n_items * num_qo_heads;
  using V = Variant;  // (the rendered chain of the preamble: cuinfer/variants/render.py)
  static_assert(V::kSoftmax && !V::kQueryTransform && !V::kKeyTransform && !V::kValueTransform && !V::kSink &&
                    !V::kOutputTransform,
                "the prototype runs softmax variants of logits, key ranges and masks only");

  // A unit's keys: the variant's key ranges of its first and last rows (monotone in the row, as causal and window
  // are) give the keys it loads, [t_first * kBlockN, key_hi), and the bounds inside which a tile needs no range mask.
  struct Unit {
    int req, head, q0, qo_len, k0, kv_len, row0;
    int key_hi, mask_lo, mask_hi;  // keys loaded < key_hi; tiles inside [mask_lo, mask_hi) need no range mask
    int t_first, n_tiles;          // tiles t_first .. t_first + n_tiles - 1
  };
  auto unit = [&](int u) {
    Unit w;
    const int item = u / num_qo_heads;
    w.head = u - item * num_qo_heads;
    w.req = items[2 * item];
    w.q0 = qo_indptr[w.req];
    w.qo_len = qo_indptr[w.req + 1] - w.q0;
    w.k0 = kv_indptr[w.req];
    w.kv_len = kv_indptr[w.req + 1] - w.k0;
    w.row0 = items[2 * item + 1] * kBlockM;
    const int diag = w.kv_len - w.qo_len, r_last = min(w.row0 + kBlockM, w.qo_len) - 1;
    const variant::Index first{w.req, w.row0, w.row0 + diag, w.head, w.head / group, w.qo_len, w.kv_len, kD};
    const variant::Index last{w.req, r_last, r_last + diag, w.head, w.head / group, w.qo_len, w.kv_len, kD};
    int lo_f = variant::kNoLowerBound, hi_f = w.kv_len, lo_l = variant::kNoLowerBound, hi_l = w.kv_len;
    V::key_range(vp, first, lo_f, hi_f);
    V::key_range(vp, last, lo_l, hi_l);
    w.key_hi = max(0, min(w.kv_len, max(hi_f, hi_l)));
    const int key_lo = max(0, min(w.key_hi, min(lo_f, lo_l)));
    w.mask_lo = max(lo_f, lo_l);
    w.mask_hi = min(w.key_hi, min(hi_f, hi_l));
    w.t_first = key_lo / kBlockN;
    w.n_tiles = max(0, (w.key_hi + kBlockN - 1) / kBlockN - w.t_first);
    return w;
  };
#if PROTO_DYNAMIC
  // The unit the producer hands out next: written before the Q barrier's arrival (its release), read after the wait
  Unit* const unit_slot = reinterpret_cast<Unit*>(smem_raw + (bars.unit_slot() - smem_addr(smem_raw)));
#endif

  // PROTO_PRODUCER_FENCE: a producer thread waits for its own copies (cp.async groups: Q, then K and V of each tile),
  // fences the generic proxy it wrote through against the async proxy of the consumers' wgmma reads, and arrives
  // (Q with the unit's first K tile); else its arrival is tied to the copies' completion (cp.async.mbarrier.arrive)
  // and each consumer fences before its MMAs read the tile.
#if PROTO_TMA
  // PROTO_TMA: one thread of the producer issues every copy as TMA boxes of 128 rows x 64 columns (the maps'
  // 128-byte swizzle is the wgmma layout); the boxes complete on the stage's barrier by its transaction count. Rows
  // past a request's end are read from the next request (or zero-filled past the tensor's end) and masked.
  if (wg == 0) {
    setmaxnreg_dec<PROTO_DYNAMIC ? 32 : 24>();  // (the unit counter's loop takes a few more)
    if (tid == 0) {
      int tile = 0, n_q = 0;
#if PROTO_DYNAMIC
      // Units after the first come from the counter in the host's order (heaviest first); each goes to the consumers
      // in the shared-memory slot; past the last unit the slot says so and the arrival comes without a copy.
      for (int u = blockIdx.x;; u = gridDim.x + atomicAdd(sched, 1), ++n_q) {
        if (n_q > 0) mbar_wait(bars.q_empty(), (n_q - 1) & 1);
        if (u >= n_units) {
          unit_slot->n_tiles = -1;  // (no unit left)
          mbar_arrive(bars.q_full());
          break;
        }
        const Unit w = unit(u);
        *unit_slot = w;  // (the consumers read the unit here instead of from global memory)
#else
      for (int u = blockIdx.x; u < n_units; u += gridDim.x, ++n_q) {
        if (n_q > 0) mbar_wait(bars.q_empty(), (n_q - 1) & 1);
        const Unit w = unit(u);
#endif
        mbar_arrive_expect_tx(bars.q_full(), kQBytes);
        tma_load_3d(sq, &tm_q, bars.q_full(), 0, w.head, w.q0 + w.row0);
        tma_load_3d(sq + QTile::kBlockBytes, &tm_q, bars.q_full(), 64, w.head, w.q0 + w.row0);
        const int kvh = w.head / group;
        for (int i = 0; i < w.n_tiles; ++i, ++tile) {
          const int s = tile % kStages, n = tile / kStages;
          const int key = w.k0 + (w.t_first + i) * kBlockN;
          if (n > 0) mbar_wait(bars.k_empty(s), (n - 1) & 1);
          mbar_arrive_expect_tx(bars.k_full(s), kTileBytes);
          tma_load_3d(sk + s * kTileBytes, &tm_k, bars.k_full(s), 0, kvh, key);
          tma_load_3d(sk + s * kTileBytes + Tile::kBlockBytes, &tm_k, bars.k_full(s), 64, kvh, key);
          if (n > 0) mbar_wait(bars.v_empty(s), (n - 1) & 1);
          mbar_arrive_expect_tx(bars.v_full(s), kTileBytes);
          tma_load_3d(sv + s * kTileBytes, &tm_v, bars.v_full(s), 0, kvh, key);
          tma_load_3d(sv + s * kTileBytes + Tile::kBlockBytes, &tm_v, bars.v_full(s), 64, kvh, key);
        }
      }
    }
    return;
  }
  setmaxnreg_inc<PROTO_DYNAMIC ? 232 : 240>();
#else
  if (wg == 0) {  // producer
    setmaxnreg_dec<56>();
    int tile = 0;  // K/V tiles loaded so far (all units): ring stage tile % kStages, fill tile / kStages
    int n_q = 0;   // Q tiles loaded so far
    for (int u = blockIdx.x; u < n_units; u += gridDim.x, ++n_q) {
      const Unit w = unit(u);
      if (n_q > 0) mbar_wait(bars.q_empty(), (n_q - 1) & 1);
      copy_tile<kBlockM>(sq, q + (w.q0 + w.row0) * q_stride + w.head * kD, q_stride, w.qo_len - w.row0, tid);
#if PROTO_PRODUCER_FENCE
      cp_async_commit();
      if (w.n_tiles == 0) {
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(bars.q_full());
      }
#else
      mbar_arrive_cp_async(bars.q_full());
#endif
      const T* kh = k + w.k0 * kv_stride + (w.head / group) * kD;
      const T* vh = v + w.k0 * kv_stride + (w.head / group) * kD;
      for (int i = 0; i < w.n_tiles; ++i, ++tile) {
        const int s = tile % kStages, n = tile / kStages;
        const int key0 = (w.t_first + i) * kBlockN;
        if (n > 0) mbar_wait(bars.k_empty(s), (n - 1) & 1);
        copy_tile<kBlockN>(sk + s * kTileBytes, kh + key0 * kv_stride, kv_stride, w.key_hi - key0, tid);
#if PROTO_PRODUCER_FENCE
        cp_async_commit();
        cp_async_wait<0>();  // (Q and) K landed
        fence_proxy_async();
        if (i == 0) mbar_arrive(bars.q_full());
        mbar_arrive(bars.k_full(s));
#else
        mbar_arrive_cp_async(bars.k_full(s));
#endif
        if (n > 0) mbar_wait(bars.v_empty(s), (n - 1) & 1);
        copy_tile<kBlockN>(sv + s * kTileBytes, vh + key0 * kv_stride, kv_stride, w.key_hi - key0, tid);
#if PROTO_PRODUCER_FENCE
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(bars.v_full(s));
#else
        mbar_arrive_cp_async(bars.v_full(s));
#endif
      }
    }
    cp_async_wait_all();
    return;
  }
  setmaxnreg_inc<224>();
#endif

  // consumers
  const int cw = wg - 1;  // consumer warpgroup: rows 64 cw .. 64 cw + 63 of the block
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const u32 q_base = sq + cw * 64 * 128;
  const float sm_scale = scale_log2 / kLog2e;
  // Leading slopes (ALiBi: variant::kFoldSlope) start each tile's Q·K^T accumulators at the rows' linear key bias in
  // accumulator units (one FFMA per logit before the MMAs), so no instruction per logit applies it after them; only the
  // chain's other logits pieces (logits_rest) run per logit.
  constexpr bool kFold = variant::kFoldSlope<V>;
  constexpr bool kTileLogits = variant::kTileLogits<V>;
  // The softmax's base-2 exponent: per-logit pieces return natural logits (sm_scale applied); otherwise the scores are
  // in accumulator units and sm_scale folds in here
  const float sl2 = kTileLogits ? kLog2e : scale_log2;

  // PROTO_PINGPONG: the two consumers take turns to issue their MMAs (named barriers 1 and 2), so that one's softmax
  // runs while the other's MMAs do (FA3's warp scheduling); consumer 1 lets consumer 0 go first.
  auto my_turn = [&]() {
    if (PROTO_PINGPONG) named_barrier_sync(1 + cw, 256);
  };
  auto their_turn = [&]() {
    if (PROTO_PINGPONG) named_barrier_arrive(2 - cw, 256);
  };
  if (PROTO_PINGPONG && cw == 1) named_barrier_arrive(1, 256);

  int tile0 = 0;  // K/V tiles consumed before this unit
  int n_q = 0;
#if PROTO_DYNAMIC
  for (;; ++n_q) {
    mbar_wait(bars.q_full(), n_q & 1);
    const Unit w = *unit_slot;
    if (w.n_tiles < 0) break;
#else
  for (int u = blockIdx.x; u < n_units; u += gridDim.x, ++n_q) {
    const Unit w = unit(u);
#endif
    const int n_tiles = w.n_tiles, t_first = w.t_first;
    const int my_row = w.row0 + cw * 64 + warp * 16 + g;  // rows my_row and my_row + 8 of the request
    const int diag = w.kv_len - w.qo_len;               // row r is at kv position r + diag
    // this thread's two rows (h = 0: my_row, h = 1: my_row + 8): their Index, RowState and key range [lo, hi)
    variant::Index ix[2];
    typename V::RowState rs[2] = {};
    int lo[2], hi[2];
    float slope_acc[2] = {0.f, 0.f};  // (kFold) the rows' leading slope in accumulator units (1 / sm_scale each)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = my_row + 8 * h;
      ix[h] = variant::Index{w.req, r, r + diag, w.head, w.head / group, w.qo_len, w.kv_len, kD};
      if constexpr (V::kRowState) rs[h] = V::row_state(vp, ix[h]);
      lo[h] = variant::kNoLowerBound, hi[h] = w.kv_len;
      V::key_range(vp, ix[h], lo[h], hi[h]);
      if constexpr (kFold) slope_acc[h] = V::slope_lead(vp, ix[h], rs[h]) / sm_scale;
    }

    float o_acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
    float m[2] = {neg_inf(), neg_inf()};
    float l[2] = {0.f, 0.f};
    if (!PROTO_DYNAMIC) mbar_wait(bars.q_full(), n_q & 1);

    // S = Q K_i^T for tile i of the unit (issued, not waited for)
    auto issue_qk = [&](float (&sc)[64], int i) {
      const int s = (tile0 + i) % kStages;
      const u32 kt = sk + s * kTileBytes;
      mbar_wait(bars.k_full(s), ((tile0 + i) / kStages) & 1);
      if (!PROTO_PRODUCER_FENCE && !PROTO_TMA) fence_proxy_async();
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
      for (int kk = 0; kk < kD / 16; ++kk) {
        const u32 off = (kk % 4) * 32;
        const u64 da = smem_desc_sw128(q_base + (kk / 4) * QTile::kBlockBytes + off, 16, 1024);
        const u64 db = smem_desc_sw128(kt + (kk / 4) * Tile::kBlockBytes + off, 16, 1024);
        wgmma_m64n128k16_ss<T, 0>(sc, da, db, kFold || kk > 0);
      }
      wgmma_commit();
    };
    // O += P V_i (issued, not waited for)
    auto issue_pv = [&](u32 (&pa)[8][4], int i) {
      const int s = (tile0 + i) % kStages;
      const u32 vt = sv + s * kTileBytes;
      mbar_wait(bars.v_full(s), ((tile0 + i) / kStages) & 1);
      if (!PROTO_PRODUCER_FENCE && !PROTO_TMA) fence_proxy_async();
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const u64 db = smem_desc_sw128(vt + kk * 16 * 128, Tile::kBlockBytes, 1024);
        wgmma_m64n128k16_rs<T, 1>(o_acc, pa[kk], db);
      }
      wgmma_commit();
    };
    // PROTO_SPLIT_RELEASE: a stage's K tile is handed back once its Q·K^T has retired, its V tile once its P·V has
    // (else both after the P·V)
    auto release_k = [&](int i) {
      if (PROTO_SPLIT_RELEASE) mbar_arrive(bars.k_empty((tile0 + i) % kStages));
    };
    auto release_v = [&](int i) {
      if (!PROTO_SPLIT_RELEASE) mbar_arrive(bars.k_empty((tile0 + i) % kStages));
      mbar_arrive(bars.v_empty((tile0 + i) % kStages));
    };
    // masks tile i's scores, moves the running max, turns the scores into P in place and returns the factor the
    // output accumulators take for the new max (per row half)
    auto softmax = [&](float (&sc)[64], int i, float (&corr)[2]) {
      const int key0 = (t_first + i) * kBlockN;
      // The variant's logits and masks on S: element (j, e) is the logit of row h = e / 2 and key key0 + 8 j + 2 t + e % 2
      const bool need_mask = V::kMask || key0 + kBlockN > w.mask_hi || key0 < w.mask_lo;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // kv_dist of the row's first key in this tile; each element's is this plus a constant, exactly
        const float dist0 = static_cast<float>(key0 + 2 * t - ix[h].qpos);
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
    // P as the 16-bit A fragments of P·V
    auto pack_p = [&](const float (&sc)[64], u32 (&pa)[8][4]) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        pa[kk][0] = pack2<T>(sc[8 * kk + 0], sc[8 * kk + 1]);
        pa[kk][1] = pack2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
        pa[kk][2] = pack2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
        pa[kk][3] = pack2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
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

#if PROTO_OVERLAP
    // FA3's intra-warpgroup overlap: tile i's Q·K^T is issued, then (after the rescale for tile i - 1's max) tile
    // i - 1's P·V behind it; the softmax of tile i runs while that P·V completes. P is packed only once no MMA is
    // in flight: ptxas serialises every wgmma of the kernel if registers an issued wgmma reads are written before
    // its wait.
    u32 pa[8][4];
    float corr[2];
    if (n_tiles > 0) {  // (none: e.g. rows of a causal request with fewer keys than rows, that see no key)
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
#else
    for (int i = 0; i < n_tiles; ++i) {
      float sc[64];
      float corr[2];
      u32 pa[8][4];
      issue_qk(sc, i);
      wgmma_wait<0>();
      fence_regs(sc);
      release_k(i);
      softmax(sc, i, corr);
      pack_p(sc, pa);
      rescale(corr);
      issue_pv(pa, i);
      wgmma_wait<0>();
      fence_regs(o_acc);
      release_v(i);
    }
    mbar_arrive(bars.q_empty());
#endif
    tile0 += n_tiles;

    // epilogue: O / l to global (16-bit), lse base 2
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(l[h]);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const int row = my_row + 8 * h;
      if (row < w.qo_len) {
        T* orow = o + (w.q0 + row) * q_stride + w.head * kD;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          *reinterpret_cast<u32*>(orow + 8 * j + 2 * t) =
              pack2<T>(o_acc[4 * j + 2 * h] * inv, o_acc[4 * j + 2 * h + 1] * inv);
        }
        if (lse != nullptr && t == 0) {
          lse[(w.q0 + row) * num_qo_heads + w.head] = sum > 0.f ? m[h] * sl2 + lg2(sum) : neg_inf();
        }
      }
    }
  }
}
