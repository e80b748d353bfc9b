// FA2-class batch prefill: one persistent kernel template for ragged and paged KV, on mma.sync tensor cores (sm_80+).
//
// Work: the plan (docs/internals.md, "Work plans") gives CTA c the items work_indptr[c]..work_indptr[c+1], then the
// CTAs share a tail of items (work_indptr[P]..work_indptr[P+1], often empty), taken one at a time by an atomic counter.
// An item is one query tile (TILE_Q packed rows, packed row = token * g + head_in_group) of one request for one KV
// head, over the KV token range [kv_start, kv_end) already clipped by causal / window limits. Unsplit items
// (partial < 0) write o and lse straight to the outputs; split items write fp32 partial states for the merge kernel.
//
// CTA = WARPS_Q x WARPS_KV warps. Warp (wq, wkv) owns MMA_Q m16 row blocks (rows wq*16*MMA_Q ...) of the query tile
// and MMA_KV 16-key slices (keys wkv*16*MMA_KV ...) of every KV tile of TILE_KV = 16 * MMA_KV * WARPS_KV keys. With
// WARPS_KV > 1 (small query tiles) each warp keeps its own softmax state and the states merge in the epilogue.
// GROUPS = 2 (paired blocks, cross-item tiles): a block holds two such CTAs of the plan, side by side (see
// batch_prefill); the policy pairs the ragged 128-row tiles (cuinfer/prefill_policy.py, block_groups).
//
// Per KV tile:  S = Q·K^T (ldmatrix Q and K from swizzled smem, mma m16n8k16, fp32)  ->  logits transform and mask
// (mask only on boundary tiles)  ->  online softmax in base 2 (exp2, lazy reference max m, per-thread partial row
// sum d)  ->  O += P·V (P from the S registers, V by ldmatrix.trans). Q stays in smem for the whole item.
//
// Pipeline (STAGES >= 2 buffers each for K and V, cp.async groups in issue order Q+K0, V0, K1, V1, ...):
//   iteration it:  wait K[it]; barrier; issue K[it+STAGES-1] into the buffer of K[it-1]; S = Q K[it]^T; softmax;
//                  wait V[it]; barrier; issue V[it+STAGES-1] into the buffer of V[it-1]; O += P V[it]
// The barrier after each wait is also the one that proves every warp is done with the buffer being refilled (it was
// read in iteration it-1), so there are two barriers per tile and the loads run STAGES-1 tiles ahead.
//
// Paged KV: each thread finds the address of its rows of a tile by page-table lookup when it issues the K copy, keeps
// the 64-bit offsets in a thread-private smem slot, and reuses them for the V copy of the same tile (K and V caches
// share strides). Any page size works (rows are gathered one by one); NHD / HND / 5-D cache / (k, v) tuple are only
// different base pointers and strides.
//
// Across items (WARPS_KV == 1, every long-prefill tile): a CTA runs many short items (P3: ~18 per CTA), and an item
// that starts cold waits for its metadata (two dependent global reads), then for Q and its first K tile from DRAM, and
// ends with an epilogue of three barriers: several microseconds per item with the tensor cores of this CTA idle. So
//   * the facts of the next 16 items are resolved at once into an smem table (one item per thread, one wait);
//   * the epilogue normalises o in registers and stores it to global memory without a barrier, 16 bytes per store:
//     on sm_90 each warp stages its rows in its own Q rows (stmatrix, then 16-byte reads), on sm_80 an in-quad
//     transpose of the accumulators gives the same pieces;
//   * each warp then issues its share of the NEXT item's Q and first K/V tile (Q and that buffer are free once every
//     warp has passed the last iteration's barriers), which land while the other CTA of the SM computes; paged: the
//     page numbers of that tile are read where the loop would read those of the tile past the item's end.
// The K/V buffer index runs on across items: the next item's first tile goes into the buffer after the last one.
//
// Causal boundary tiles: 16-key slices that are masked for every row of a warp skip their Q.K^T and P.V MMAs (with
// 4 heads packed per token a 128-row tile spans 32 tokens, so half of a 64-key boundary tile is typically dead).
#pragma once
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "common/types.cuh"

namespace cuinfer {
namespace prefill {

// ---- cp.async (16-byte, zero-fill when the row is out of range) ------------------------------------------------------

__device__ __forceinline__ void cp_async_16(u32 smem, const void* gmem, bool valid) {
  // src-size 0 writes 16 zero bytes: rows past the range read as 0, never as stale data (0 * NaN would be NaN).
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// Commits this thread's uncommitted copies as a group, then waits for all of its groups.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

// Rows past a tile's end are copied with src-size 0 (no byte is read), so their address need not point anywhere
// valid: it is the row's would-be address (paged: page 0's, read_pages gives page 0 past the end). Selecting a dummy
// address for them (A/B build -DCUINFER_PREFILL_ADDR_SELECT) split the 64-bit pointers into halves that ptxas then
// moved into register pairs, reusing the pairs of copies still in the LSU queue (long-scoreboard waits).
#ifdef CUINFER_PREFILL_ADDR_SELECT
constexpr bool kAddrSelect = true;
#else
constexpr bool kAddrSelect = false;
#endif

template <bool B> struct Bool {
  static constexpr bool value = B;
};

// n / d for n < 2^31 with a host-computed multiplier (round-up method): q = (umulhi(n, mul) + n) >> shift.
__device__ __forceinline__ u32 fast_div(u32 n, u32 mul, u32 shift) { return (__umulhi(n, mul) + n) >> shift; }

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ int ldg_i32(const int* p) { return __ldg(p); }

// Where item `it`'s facts are in the plan's item arrays, and its KV head. A compact plan (p.natural_groups = G > 0:
// natural order, nothing split; planner.layout.pack_compact) holds only the G group entries: item it is group it % G
// of KV head it / G, with no partial state. Otherwise every item has its own entry (item_kv_head, item_partial).
struct ItemRef {
  int entry, kv_head, partial;
};
__device__ __forceinline__ ItemRef item_ref(const PrefillParams& p, int it) {
  ItemRef r;
  const int ng = p.natural_groups;
  if (ng > 0) {
    r.kv_head = it / ng;
    r.entry = it - r.kv_head * ng;
    r.partial = -1;
  } else {
    r.entry = it;
    r.kv_head = static_cast<const int*>(p.item_kv_head)[it];
    r.partial = static_cast<const int*>(p.item_partial)[it];
  }
  return r;
}

// A shared-memory int read where it is used (not kept in a register across the KV loop).
__device__ __forceinline__ int lds_volatile(const int* p) { return *static_cast<const volatile int*>(p); }

// A load the compiler may not merge with an earlier one: the epilogue re-reads the item's fields instead of keeping
// them in registers across the KV loop (where every register is taken by accumulators).
__device__ __forceinline__ int reload_i32(const void* p, int i) {
  int v;
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(static_cast<const int*>(p) + i));
  return v;
}

// 2^x, 1 / d and log2(d) take the MUFU forms of common/math.cuh (fmath::ex2, rcp, lg2). exp2f and log2f without
// fast-math add denormal-range fix-ups and a ~25-instruction polynomial, and 1.f / d a Newton step with a slow-path call
// (~2 us per item in the epilogue). None is needed here: probabilities below 2^-126 flush to 0, far under the 16-bit
// output resolution, and d >= 1 whenever a row has a key (its largest p is 2^(x_max - m) with the reference m one of
// the row's logits).

// p = 2^(x * x_scale - base) in place for the elements of row half h of one S row block this thread holds, added in
// order to `sum` (returned): the exponentials of both softmax paths of batch_prefill.
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

enum : int { kMaskCausal = 1, kMaskWindow = 2, kMaskCustom = 4 };

// How far (base-2 units) a row's max may climb above the softmax's reference max before o is rescaled (see the
// online softmax in batch_prefill). 0 is an exact running max: the A/B build -DCUINFER_PREFILL_EAGER_RESCALE.
#ifdef CUINFER_PREFILL_EAGER_RESCALE
constexpr float kRescaleSlack = 0.f;
#else
constexpr float kRescaleSlack = 8.f;
#endif
// Max-free tiles (see batch_prefill): a per-thread sum of one row's p over a tile above this sends the tile to the
// exact path. 2^12 keeps every p far inside fp16 (65504) with room for o and d. -DCUINFER_PREFILL_NO_MAX_FREE: off.
// sm_90+ only: ptxas for sm_80 spills the 128 x 64 tile with it (12 bytes).
#if defined(CUINFER_PREFILL_NO_MAX_FREE) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900)
constexpr bool kMaxFree = false;
#else
constexpr bool kMaxFree = true;
#endif
constexpr float kMaxFreeSum = 4096.f;

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

}  // namespace prefill

// Compile-time configuration of one specialisation (the Python side picks it: cuinfer/prefill_policy.py).
template <typename DTypeKV_, typename DTypeO_, int HEAD_DIM_QK_, int HEAD_DIM_VO_, int TILE_Q_, int WARPS_Q_,
          int WARPS_KV_, int MMA_KV_, int STAGES_, bool PAGED_, int MASK_, bool SOFT_CAP_, bool ALIBI_, int GROUPS_>
struct PrefillTraits {
  using DTypeKV = DTypeKV_;  // q, k and v share it (fp16 or bf16)
  using DTypeO = DTypeO_;
  static constexpr int kHeadDimQK = HEAD_DIM_QK_;
  static constexpr int kHeadDimVO = HEAD_DIM_VO_;
  static constexpr int kTileQ = TILE_Q_;
  static constexpr int kWarpsQ = WARPS_Q_;
  static constexpr int kWarpsKV = WARPS_KV_;
  static constexpr int kMmaKV = MMA_KV_;
  static constexpr int kStages = STAGES_;
  static constexpr bool kPaged = PAGED_;
  static constexpr bool kCausal = (MASK_ & prefill::kMaskCausal) != 0;
  static constexpr bool kWindow = (MASK_ & prefill::kMaskWindow) != 0;
  static constexpr bool kCustomMask = (MASK_ & prefill::kMaskCustom) != 0;
  static constexpr bool kSoftCap = SOFT_CAP_;
  static constexpr bool kAlibi = ALIBI_;

  static constexpr int kThreads = 32 * kWarpsQ * kWarpsKV;
  static constexpr int kMmaQ = kTileQ / (16 * kWarpsQ);
  static constexpr int kTileKV = 16 * kMmaKV * kWarpsKV;
  static constexpr int kChunksQK = kHeadDimQK * 2 / 16;  // 16-byte chunks per row of Q / K
  static constexpr int kChunksVO = kHeadDimVO * 2 / 16;
  static constexpr int kRowsPerPass = kThreads / 8;  // global -> smem copies: 8 threads per row, a 128-byte line
  static constexpr int kKVRowsPerThread = kTileKV / kRowsPerPass;
  static constexpr int kQRowsPerThread = (kTileQ + kRowsPerPass - 1) / kRowsPerPass;

  static constexpr int kQBytes = kTileQ * kHeadDimQK * 2;
  static constexpr int kKBytes = kTileKV * kHeadDimQK * 2;
  static constexpr int kVBytes = kTileKV * kHeadDimVO * 2;
  static constexpr int kKOff = kQBytes;
  static constexpr int kVOff = kKOff + kStages * kKBytes;
  static constexpr int kPageOff = kVOff + kStages * kVBytes;
  static constexpr int kPageBytes = kPaged ? kThreads * kKVRowsPerThread * 8 : 0;
  static constexpr int kMainBytes = kPageOff + kPageBytes;
  // Cross-item pipeline (see the header): one warp per row block, so the epilogue needs no cross-warp merge.
  // (CUINFER_PREFILL_NO_CROSS_ITEM / _NO_SLICE_SKIP switch the two optimisations off: A/B runs of bench/tune_prefill.)
#ifdef CUINFER_PREFILL_NO_CROSS_ITEM
  static constexpr bool kCrossItem = false;
#else
  static constexpr bool kCrossItem = kWarpsKV == 1;
#endif
#ifdef CUINFER_PREFILL_NO_SLICE_SKIP
  static constexpr bool kSliceSkip = false;
#else
  static constexpr bool kSliceSkip = true;
#endif
  // Epilogue staging (WARPS_KV > 1 only; overlays everything): fp32 o rows padded by 8 floats (conflict-free float2
  // stores), then (m, d).
  static constexpr int kEpiPitch = kHeadDimVO + 8;
  static constexpr int kEpiOBytes = kCrossItem ? 0 : kWarpsKV * kTileQ * kEpiPitch * 4;
  static constexpr int kEpiBytes = kCrossItem ? 0 : kEpiOBytes + kWarpsKV * kTileQ * 2 * 4;
  // Item facts used only occasionally inside the KV loop (copy addresses, boundary masks) live in smem, not in
  // registers, which the accumulators fill: kInfoInts per item + kWarpInts per warp, after everything else.
  static constexpr int kInfoInts = 12;  // [0..6] the item's facts, [8..11] the work ranges (sched in batch_prefill)
  static constexpr int kWarpInts = 8;  // a warp's bounds and its own copy of the copy facts (see batch_prefill)
  static constexpr int kInfoOff = kMainBytes > kEpiBytes ? kMainBytes : kEpiBytes;
  // Cross-item: the resolved facts of up to kTableItems consecutive items of this CTA, kTableFields ints each
  // (16: d256 paged 64-row tiles still fit a 100 KB-smem GPU).
  static constexpr int kTableItems = 16;
  // Staged epilogue (cross-item, sm_90+): each warp writes its normalised o rows into its own rows of the Q buffer
  // with stmatrix and reads them back as 16-byte row pieces for the stores (in place of an in-register quad
  // transpose: ~250 fewer instructions per thread and item). Each warp then also copies only its own Q rows, so no
  // warp's next-item Q copy lands in rows another warp is still staging in. A/B: -DCUINFER_PREFILL_SHUFFLE_EPI.
#if defined(CUINFER_PREFILL_SHUFFLE_EPI) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900)
  static constexpr bool kStagedEpi = false;
#else
  static constexpr bool kStagedEpi = kCrossItem && kHeadDimVO <= kHeadDimQK;
#endif
  static constexpr int kTableFields = 10;
  static constexpr int kTableOff = kInfoOff + (kInfoInts + kWarpInts * kWarpsQ * kWarpsKV) * 4;
  static constexpr int kSmemBytes = kTableOff + (kCrossItem ? kTableItems * kTableFields * 4 : 0);
  // Paired blocks (GROUPS = 2, cross-item tiles only): two groups of kThreads per block, each one CTA of the plan
  // with kSmemBytes of its own at a 128-byte aligned offset (see batch_prefill).
  static constexpr int kGroups = GROUPS_;
  static constexpr int kBlockThreads = kGroups * kThreads;
  static constexpr int kGroupBytes = (kSmemBytes + 127) / 128 * 128;

  static_assert(is_same<DTypeKV, half>::value || is_same<DTypeKV, __nv_bfloat16>::value, "q/k/v are fp16 or bf16");
  static_assert(sizeof(DTypeO) == 2, "o is fp16 or bf16 (16-bit output stores)");
  static_assert(kTileQ % (16 * kWarpsQ) == 0 && kMmaQ >= 1, "TILE_Q must be a multiple of 16 * WARPS_Q");
  static_assert(kHeadDimQK % 64 == 0 && kHeadDimVO % 64 == 0, "head dims are multiples of 64 (swizzle)");
  static_assert(kTileKV % kRowsPerPass == 0, "TILE_KV must be a multiple of threads / 8");
  static_assert(kStages >= 2, "the pipeline refills the buffer of the previous tile: at least 2 stages");
  static_assert(kHeadDimVO % 8 == 0, "epilogue writes 8 elements per thread");
  static_assert(kTableItems <= kThreads, "the item table is filled one item per thread");
  static_assert(kGroups == 1 || (kGroups == 2 && kCrossItem), "paired blocks run cross-item tiles (WARPS_KV == 1)");
};

namespace prefill {
// Fields of an item-table entry (cross-item path).
enum : int { kFReq, kFRow0, kFKvHead, kFKvStart, kFKvEnd, kFPartial, kFQoBase, kFQoLen, kFKvBase, kFKvLen };

// S (+)= Q K^T for one KV tile: MMA_Q row blocks x MMA_KV 16-key slices of this warp. GUARD: slices >= `live` hold
// only keys masked in every row of the warp (causal boundary tile) and are skipped; their scores stay 0 and the
// mask turns them into -inf.
template <class C, bool GUARD>
__device__ __forceinline__ void qk_tile(float (&s)[C::kMmaQ][2 * C::kMmaKV][4], u32 q_lane, u32 k_stage, int live) {
  using T = typename C::DTypeKV;
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
  using T = typename C::DTypeKV;
  using LdVO = LdmatrixAddr<C::kChunksVO>;
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
}  // namespace prefill

template <class C>
__global__ void __launch_bounds__(C::kBlockThreads) batch_prefill(const __grid_constant__ PrefillParams p) {
  using T = typename C::DTypeKV;
  using DTypeO = typename C::DTypeO;
  constexpr int MMA_Q = C::kMmaQ, MMA_KV = C::kMmaKV, DVO = C::kHeadDimVO;
  constexpr int NT = C::kThreads, TILE_Q = C::kTileQ, TILE_KV = C::kTileKV, STAGES = C::kStages;
  constexpr bool XI = C::kCrossItem;
  constexpr int KR = C::kKVRowsPerThread;
  constexpr int NF = C::kTableFields;

  extern __shared__ __align__(128) unsigned char smem_block[];
  // Paired blocks: thread group wg (the kThreads threads from wg * kThreads) is CTA 2 blockIdx.x + wg of the plan's
  // 2 gridDim.x, with its own shared memory, items and named barrier; nothing else is shared. Measured on the H200
  // (bench/tune_prefill.py): +3-4 % on the ragged 128 x 64 tiles, 4-9 % slower on the paged and 64-row ones (those
  // keep one group per block).
  constexpr int GROUPS = C::kGroups;
  const u32 wg = GROUPS > 1 ? threadIdx.x / NT : 0u;
  const u32 cta = GROUPS > 1 ? blockIdx.x * 2u + wg : blockIdx.x;
  const u32 num_ctas = GROUPS > 1 ? gridDim.x * 2u : gridDim.x;
  unsigned char* smem = smem_block + (GROUPS > 1 ? wg * C::kGroupBytes : 0u);
  // The group's barrier: named barrier 1 + wg of its kThreads threads in a paired block, else the block's.
  auto group_sync = [&]() {
    if constexpr (GROUPS > 1) {
      asm volatile("bar.sync %0, %1;" ::"r"(1 + wg), "n"(NT) : "memory");
    } else {
      __syncthreads();
    }
  };
  const u32 smem_base = mma::smem_addr(smem);
  const u32 q_smem = smem_base;
  const u32 k_smem = smem_base + C::kKOff;
  const u32 v_smem = smem_base + C::kVOff;
  i64* page_off = reinterpret_cast<i64*>(smem + C::kPageOff);
  int* info = reinterpret_cast<int*>(smem + C::kInfoOff);
  int* table = reinterpret_cast<int*>(smem + C::kTableOff);

  // The thread within its group, taken modulo the group size in every build (the bound lets ptxas fold the copy
  // and table addressing: +3-4 % on the paged P4-P6 kernels, measured; the index is the same).
  const u32 ltid = threadIdx.x % NT;
  const int tid = static_cast<int>(ltid), lane = static_cast<int>(threadIdx.x % 32u);
  const int wq = static_cast<int>((ltid / 32u) % C::kWarpsQ), wkv = static_cast<int>(ltid / 32u / C::kWarpsQ);
  const int warp_row0 = wq * MMA_Q * 16;    // first tile row of this warp
  const int warp_col0 = wkv * MMA_KV * 16;  // first key of this warp within a KV tile

  // ldmatrix lane addresses for k-step 0 (item independent): A from Q, B from K (n-major), B from V (k-major, .trans).
  using LdQK = LdmatrixAddr<C::kChunksQK>;
  using LdVO = LdmatrixAddr<C::kChunksVO>;
  const u32 q_lane = LdQK::make(q_smem, warp_row0 + lane % 16, lane / 16);
  const u32 k_lane = LdQK::make(k_smem, warp_col0 + lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
  const u32 v_lane = LdVO::make(v_smem, warp_col0 + lane % 16, lane / 16);

  // Copy mapping: thread -> chunks (tid % 8) + 8c of rows (tid / 8) + kRowsPerPass * i. Every row it touches has the
  // same row % 8, so its swizzled smem offsets are one base plus immediates: cp_qk_dst + i * pass + c * 128.
  const int cp_row = tid / 8, cp_chunk = tid % 8;
  const u32 cp_qk_dst = cp_row * (C::kChunksQK * 16) + ((cp_chunk ^ (cp_row % 8)) * 16);
  const u32 cp_vo_dst = cp_row * (C::kChunksVO * 16) + ((cp_chunk ^ (cp_row % 8)) * 16);
  constexpr u32 kPassQK = C::kRowsPerPass * C::kChunksQK * 16, kPassVO = C::kRowsPerPass * C::kChunksVO * 16;

  const int g = p.group_size;
  const T* q_ptr = static_cast<const T*>(p.q);
  const T* k_ptr = static_cast<const T*>(p.k);
  const T* v_ptr = static_cast<const T*>(p.v);
  const int* qo_indptr = static_cast<const int*>(p.qo_indptr);
  const int* kv_indptr = static_cast<const int*>(p.kv_indptr);
  const int* work_indptr = static_cast<const int*>(p.work_indptr);
  const int* kv_indices = static_cast<const int*>(p.kv_indices);

  // ---- copies (addresses are rebuilt from a few ints at every copy instead of keeping 64-bit pointers live) ----
  // Q rows [row0, row0 + valid_rows) of the tile (packed rows of request rows from qo_base, KV head kvh).
  auto load_q = [&](int row0, int valid_rows, int qo_base, int kvh) {
    if constexpr (C::kStagedEpi) {
      // Warp w copies its own rows warp_row0 .. + 16 MMA_Q: lane -> rows lane / 8 + 4i, chunks lane % 8 + 8c.
      const int qr = lane / 8, qc = lane % 8;
#pragma unroll
      for (int i = 0; i < MMA_Q * 4; ++i) {
        const int r = warp_row0 + qr + 4 * i;
        const int pr = row0 + r;
        const bool valid = r < valid_rows;
        const int token = static_cast<int>(prefill::fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
        const int head = kvh * g + (pr - token * g);
        const T* src = valid ? q_ptr + static_cast<i64>(qo_base + token) * p.q_stride_n + head * p.q_stride_h : q_ptr;
        const u32 dst = q_smem + r * (C::kChunksQK * 16) + ((qc ^ (r % 8)) * 16);
#pragma unroll
        for (int c = 0; c < C::kChunksQK / 8; ++c) prefill::cp_async_16(dst + c * 128, src + (c * 8 + qc) * 8, valid);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < C::kQRowsPerThread; ++i) {
      const int r = cp_row + i * C::kRowsPerPass;
      if (C::kTileQ % C::kRowsPerPass == 0 || r < TILE_Q) {
        const int pr = row0 + r;
        const bool valid = r < valid_rows;
        const int token = static_cast<int>(prefill::fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
        const int head = kvh * g + (pr - token * g);
        const T* src = valid ? q_ptr + static_cast<i64>(qo_base + token) * p.q_stride_n + head * p.q_stride_h : q_ptr;
#pragma unroll
        for (int c = 0; c < C::kChunksQK / 8; ++c) {
          prefill::cp_async_16(q_smem + cp_qk_dst + i * kPassQK + c * 128, src + (c * 8 + cp_chunk) * 8, valid);
        }
      }
    }
  };
  // Paged: the page-table entries of a thread's rows of the tile at `key0` (one read each; 0 past kv_end). The loop
  // reads them one tile early, during P.V, so that the K copy at the top of the next iteration does not wait on them.
  auto read_pages = [&](int key0, int kv_base, int kv_end, int (&pages)[KR]) {
    const int rem = kv_end - key0 - cp_row;
#pragma unroll
    for (int i = 0; i < KR; ++i) {
      const int key = key0 + cp_row + i * C::kRowsPerPass;
      const u32 pg = prefill::fast_div(static_cast<u32>(key), p.page_mul, p.page_shift);
      pages[i] = i * C::kRowsPerPass < rem ? prefill::ldg_i32(kv_indices + kv_base + pg) : 0;
    }
  };
  // K rows of the tile at `key0` into buffer `stage`; paged: remember each row's offset for the matching V copy.
  auto load_k = [&](int key0, int stage, int kv_base, int kvh, int kv_end, const int (&pages)[KR]) {
    const int rem = kv_end - key0 - cp_row;  // row i of this thread is valid iff i * kRowsPerPass < rem
    // Ragged: one 64-bit address per tile, rows kRowsPerPass apart are a constant stride further.
    const T* row0 = k_ptr + (static_cast<i64>(kv_base + key0 + cp_row) * p.k_stride_n +
                             static_cast<i64>(kvh) * p.k_stride_h + cp_chunk * 8);
#pragma unroll
    for (int i = 0; i < KR; ++i) {
      const bool valid = i * C::kRowsPerPass < rem;
      const T* src;
      if constexpr (C::kPaged) {
        i64 off = 0;
        if (prefill::kAddrSelect ? valid : true) {
          const int key = key0 + cp_row + i * C::kRowsPerPass;
          const int pg = static_cast<int>(prefill::fast_div(static_cast<u32>(key), p.page_mul, p.page_shift));
          off = static_cast<i64>(pages[i]) * p.k_stride_page + static_cast<i64>(key - pg * p.page_size) * p.k_stride_n +
                static_cast<i64>(kvh) * p.k_stride_h;
        }
        page_off[i * NT + tid] = off;
        src = k_ptr + off + cp_chunk * 8;
      } else {
        src = row0 + static_cast<i64>(i * C::kRowsPerPass) * p.k_stride_n;
        if (prefill::kAddrSelect && !valid) src = k_ptr;
      }
      const u32 dst = k_smem + stage * C::kKBytes + cp_qk_dst + i * kPassQK;
#pragma unroll
      for (int c = 0; c < C::kChunksQK / 8; ++c) prefill::cp_async_16(dst + c * 128, src + c * 64, valid);
    }
  };
  // Paged: this thread's row offsets of the last K copy (its own smem slots, so no barrier is needed to read them).
  auto own_offsets = [&](i64 (&offs)[KR]) {
#pragma unroll
    for (int i = 0; i < KR; ++i) offs[i] = C::kPaged ? page_off[i * NT + tid] : 0;
  };
  // V rows of the tile at `key0` into buffer `stage`; paged: at the offsets `offs` of the K copy (own_offsets).
  auto load_v = [&](int key0, int stage, int kv_base, int kvh, int kv_end, const i64 (&offs)[KR]) {
    const int rem = kv_end - key0 - cp_row;
    const T* row0 = v_ptr + (static_cast<i64>(kv_base + key0 + cp_row) * p.v_stride_n +
                             static_cast<i64>(kvh) * p.v_stride_h + cp_chunk * 8);
#pragma unroll
    for (int i = 0; i < KR; ++i) {
      const bool valid = i * C::kRowsPerPass < rem;
      const T* src;
      if constexpr (C::kPaged) {
        src = v_ptr + offs[i] + cp_chunk * 8;
      } else {
        src = row0 + static_cast<i64>(i * C::kRowsPerPass) * p.v_stride_n;
        if (prefill::kAddrSelect && !valid) src = v_ptr;
      }
      const u32 dst = v_smem + stage * C::kVBytes + cp_vo_dst + i * kPassVO;
#pragma unroll
      for (int c = 0; c < C::kChunksVO / 8; ++c) prefill::cp_async_16(dst + c * 128, src + c * 64, valid);
    }
  };

  // Cross-item: Q and the first K/V tile of the item in table slot `ns` into buffer `st`. Commits the group Q + K (the
  // one the item's first iteration waits for) and leaves V in the caller's next group, like the prologue.
  // Paged: `pages` holds that tile's page numbers (read_first_pages).
  auto issue_first = [&](int ns, int st, const int (&pages)[KR]) {
    const int* e = table + ns * NF;
    const int row0 = e[prefill::kFRow0], kvh = e[prefill::kFKvHead];
    const int kv_start = e[prefill::kFKvStart], kv_end = e[prefill::kFKvEnd], kv_base = e[prefill::kFKvBase];
    load_q(row0, min(TILE_Q, e[prefill::kFQoLen] * g - row0), e[prefill::kFQoBase], kvh);
    if (kv_start < kv_end) load_k(kv_start, st, kv_base, kvh, kv_end, pages);
    prefill::cp_async_commit();
    if (kv_start < kv_end) {
      i64 offs[KR];
      own_offsets(offs);
      load_v(kv_start, st, kv_base, kvh, kv_end, offs);
    }
  };
  // Paged, cross-item: the page numbers of the first tile of the item in table slot `ns`.
  auto read_first_pages = [&](int ns, int (&pages)[KR]) {
    const int* e = table + ns * NF;
    read_pages(e[prefill::kFKvStart], e[prefill::kFKvBase], e[prefill::kFKvEnd], pages);
  };

  // Work ranges: this CTA's own list work_indptr[c] .. [c + 1], then items of the plan's shared tail (the pool,
  // work_indptr[P] .. [P + 1], P = num_ctas) taken one at a time by an atomic counter until it runs dry, so the CTAs
  // that run fast finish the work of those that run slow (docs/internals.md, "Dynamic tail"). sched[0..1] is the
  // current range [first item, end), sched[2..3] the pool; all written by thread 0 between two barriers and read from
  // smem where needed (fewer registers across the KV loop; in the info block, whose address costs no register).
  int* sched = info + 8;
  if (tid == 0) {
    sched[0] = work_indptr[cta], sched[1] = work_indptr[cta + 1];
    sched[2] = work_indptr[num_ctas], sched[3] = work_indptr[num_ctas + 1];
  }
  group_sync();

  int stage = 0;  // buffer of the next KV tile; runs on across items (the next item's first tile follows the last)
  // (item_end, and on the cross-item path the item's table slot, are re-derived each time: fewer registers across the
  // KV loop.)
  for (;;) {
    for (int item = prefill::lds_volatile(sched); item < prefill::lds_volatile(sched + 1); ++item) {
#ifdef CUINFER_TRACE
      // Diagnostic builds only (bench/tune_sched.py): thread 0 stamps each item's start and end (global ns timer) and
      // the SM clock at its phases: start, loop start (table and prologue done), first tile ready (after the first
      // barrier), loop end, o stored, end (next item's copies issued).
      // (smem, not registers: the accumulators fill the file; one slot per group of a paired block)
      __shared__ unsigned long long trace_t0[C::kGroups], trace_c[C::kGroups][6];
      if (tid == 0) {
        unsigned long long t0;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        trace_t0[wg] = t0;
        trace_c[wg][0] = clock64();
        trace_c[wg][2] = 0;
      }
#define CUINFER_TRACE_STAMP(k) \
    if (tid == 0) trace_c[wg][k] = clock64();
#else
#define CUINFER_TRACE_STAMP(k)
#endif
      int b, row0, kvh, kv_start, kv_end, qo_base, qo_len, kv_base, kv_len;
      bool has_next = false;  // cross-item: the next item is in the table, and this one starts it
      // cross-item: the item's table slot (items of a CTA fill the table kTableItems at a time)
      const int slot = XI ? (item - prefill::lds_volatile(sched)) % C::kTableItems : 0;
      if constexpr (XI) {
        const int item_end = prefill::lds_volatile(sched + 1);
        if (slot == 0) {
          // Resolve the facts of the next kTableItems items, one per thread: two dependent reads, paid once.
          group_sync();  // every warp is done with the previous entries (epilogue)
          if (tid < min(C::kTableItems, item_end - item)) {
            const int it = item + tid;
            int* e = table + tid * NF;
            const prefill::ItemRef ref = prefill::item_ref(p, it);
            const int eb = static_cast<const int*>(p.item_req)[ref.entry];
            const int qb = qo_indptr[eb], kb = kv_indptr[eb];
            int len;
            if constexpr (C::kPaged) {
              const int num_pages = kv_indptr[eb + 1] - kb;
              len = num_pages > 0 ? (num_pages - 1) * p.page_size + static_cast<const int*>(p.kv_last_page_len)[eb] : 0;
            } else {
              len = kv_indptr[eb + 1] - kb;
            }
            e[prefill::kFReq] = eb;
            e[prefill::kFRow0] = static_cast<const int*>(p.item_qo_tile)[ref.entry] * TILE_Q;
            e[prefill::kFKvHead] = ref.kv_head;
            e[prefill::kFKvStart] = static_cast<const int*>(p.item_kv_start)[ref.entry];
            e[prefill::kFKvEnd] = static_cast<const int*>(p.item_kv_end)[ref.entry];
            e[prefill::kFPartial] = ref.partial;
            e[prefill::kFQoBase] = qb;
            e[prefill::kFQoLen] = qo_indptr[eb + 1] - qb;
            e[prefill::kFKvBase] = kb;
            e[prefill::kFKvLen] = len;
          }
          group_sync();
        }
        const int* e = table + slot * NF;
        b = e[prefill::kFReq], row0 = e[prefill::kFRow0], kvh = e[prefill::kFKvHead];
        kv_start = e[prefill::kFKvStart], kv_end = e[prefill::kFKvEnd];
        qo_base = e[prefill::kFQoBase], qo_len = e[prefill::kFQoLen];
        kv_base = e[prefill::kFKvBase], kv_len = e[prefill::kFKvLen];
        has_next = slot + 1 < C::kTableItems && item + 1 < item_end;
      } else {
        const prefill::ItemRef ref = prefill::item_ref(p, item);
        b = static_cast<const int*>(p.item_req)[ref.entry];
        row0 = static_cast<const int*>(p.item_qo_tile)[ref.entry] * TILE_Q;
        kvh = ref.kv_head;
        kv_start = static_cast<const int*>(p.item_kv_start)[ref.entry];
        kv_end = static_cast<const int*>(p.item_kv_end)[ref.entry];
        qo_base = qo_indptr[b];
        qo_len = qo_indptr[b + 1] - qo_base;
        kv_base = kv_indptr[b];  // ragged: first kv row; paged: first page-table entry
        if constexpr (C::kPaged) {
          const int num_pages = kv_indptr[b + 1] - kv_base;
          kv_len = num_pages > 0 ? (num_pages - 1) * p.page_size + static_cast<const int*>(p.kv_last_page_len)[b] : 0;
        } else {
          kv_len = kv_indptr[b + 1] - kv_base;
        }
      }
      const int packed_rows = qo_len * g;
      const int valid_rows = min(TILE_Q, packed_rows - row0);
      const int q_shift = kv_len - qo_len;  // query token i sits at kv position i + q_shift
      if (tid == 0) {
        info[0] = kv_base, info[1] = kvh, info[2] = q_shift, info[3] = kv_len, info[4] = row0, info[5] = b;
        // cross-item: the next item's table slot, 0 when this item does not start it (slot 0 starts itself)
        info[6] = has_next ? slot + 1 : 0;
      }

      // ---- prologue: Q + tile 0 (already issued by the previous item on the cross-item path, except at the start of
      // a table), then tiles 1 .. STAGES-2, into the buffers after `stage`. Groups: Q+K0, V0, K1, V1, ...
      int pages[KR];
      if (!XI || slot == 0) {
        load_q(row0, valid_rows, qo_base, kvh);
        if (kv_start < kv_end) {
          if constexpr (C::kPaged) read_pages(kv_start, kv_base, kv_end, pages);
          load_k(kv_start, stage, kv_base, kvh, kv_end, pages);
        }
        prefill::cp_async_commit();
        if (kv_start < kv_end) {
          i64 offs[KR];
          own_offsets(offs);
          load_v(kv_start, stage, kv_base, kvh, kv_end, offs);
        }
        prefill::cp_async_commit();
      }
#pragma unroll
      for (int s = 1; s < STAGES - 1; ++s) {
        const int st = stage + s >= STAGES ? stage + s - STAGES : stage + s;
        if (kv_start + s * TILE_KV < kv_end) {
          if constexpr (C::kPaged) read_pages(kv_start + s * TILE_KV, kv_base, kv_end, pages);
          load_k(kv_start + s * TILE_KV, st, kv_base, kvh, kv_end, pages);
        }
        prefill::cp_async_commit();
        if (kv_start + s * TILE_KV < kv_end) {
          i64 offs[KR];
          own_offsets(offs);
          load_v(kv_start + s * TILE_KV, st, kv_base, kvh, kv_end, offs);
        }
        prefill::cp_async_commit();
      }

      // ---- warp-uniform bounds: "does this tile need a mask at all" and "is it fully masked for this warp" ----
      // Kept in smem (read once per tile after the barrier) rather than in registers.
      {
        const int warp_first = row0 + warp_row0;
        const int warp_last = min(warp_first + MMA_Q * 16, packed_rows) - 1;
        const int tok_first = static_cast<int>(prefill::fast_div(static_cast<u32>(warp_first), p.group_mul, p.group_shift));
        const int tok_last = static_cast<int>(prefill::fast_div(static_cast<u32>(max(warp_last, 0)), p.group_mul, p.group_shift));
        int* wb = info + C::kInfoInts + C::kWarpInts * (tid / 32);
        if (lane == 0) {
          // [0] keys >= this need the upper mask in some row; [1] keys >= this are masked in every row (skip);
          // [2] keys < this need the window mask in some row; [3] keys < this are masked in every row;
          // [4], [5]: kv_base and kvh (info[0], info[1]) for this warp's copies. The warp's own copy can be read before
          // a barrier (its lane 0 wrote it): the loop reads it there, so that the read overlaps the wait.
          wb[4] = kv_base, wb[5] = kvh;
          wb[0] = C::kCausal ? min(tok_first + q_shift + 1, kv_end) : kv_end;
          wb[1] = warp_first >= packed_rows ? -2147483647 : (C::kCausal ? min(tok_last + q_shift + 1, kv_end) : kv_end);
          wb[2] = C::kWindow ? tok_last + q_shift - p.window_left : -2147483647;
          wb[3] = C::kWindow ? tok_first + q_shift - p.window_left : -2147483647;
        }
        __syncwarp();  // (the loop reads them before its first barrier)
      }

      float o[MMA_Q][DVO / 8][4];
      float row_max[MMA_Q][2];  // reference max of the transformed logits x (base-2 logit = x * x_scale)
      float row_sum[MMA_Q][2];  // this thread's partial of sum 2^(x * x_scale - m * x_scale)
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
        for (int j = 0; j < DVO / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mq][j][e] = 0.f;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          row_max[mq][h] = neg_inf();
          row_sum[mq][h] = 0.f;
        }
      }
      // x = q.k (scaled at the exp) in the plain case; with ALiBi / soft cap x is the final natural logit.
      const float x_scale = (C::kSoftCap || C::kAlibi) ? kLog2e : p.sm_scale_log2;

      if constexpr (C::kPaged) {
        // Pages of tile STAGES-1, which the first iteration copies; past the item's end (cross-item), those of the
        // next item's first tile instead, which the copies after its epilogue (pages[] is not touched in between).
        if (kv_start + (STAGES - 1) * TILE_KV < kv_end) {
          read_pages(kv_start + (STAGES - 1) * TILE_KV, kv_base, kv_end, pages);
        } else if (XI && has_next) {
          read_first_pages(slot + 1, pages);
        }
      }

      CUINFER_TRACE_STAMP(1)
      // Loop over KV tiles by first key (key0) and buffer (stage); the tile STAGES-1 ahead starts at `ahead`.
      for (int key0 = kv_start; key0 < kv_end; key0 += TILE_KV) {
        const int ahead = key0 + (STAGES - 1) * TILE_KV;
        const int wkey0 = key0 + warp_col0;  // first key of this warp's slice
        // This warp's bounds, read before the barrier: the read then overlaps the wait (read after the copies below,
        // it also waited for their address registers, which ptxas reused for it).
        const int* wb = info + C::kInfoInts + C::kWarpInts * (tid / 32);
        const int wb0 = wb[0], wb1 = wb[1], cp_base = wb[4], cp_head = wb[5];
        const int wb2 = C::kWindow ? wb[2] : 0, wb3 = C::kWindow ? wb[3] : 0;
        prefill::cp_async_wait<2 * STAGES - 3>();
        group_sync();
#ifdef CUINFER_TRACE
        if (key0 == kv_start) CUINFER_TRACE_STAMP(2)
#endif
        {
          const int st = stage == 0 ? STAGES - 1 : stage - 1;  // buffer of the previous tile == of the tile ahead
          if (ahead < kv_end) load_k(ahead, st, cp_base, cp_head, kv_end, pages);
          prefill::cp_async_commit();
        }
        // Fully masked for this warp (all keys past every row's limit, or before every row's window): skip the math.
        const bool skip = wkey0 >= wb1 || (C::kWindow && wkey0 + MMA_KV * 16 <= wb3);
        u32 pa[MMA_Q][MMA_KV][4];  // P as bf16/fp16 A fragments (packed before the V copy is issued: half the registers)
        if (!skip) {
          const bool need_mask = C::kCustomMask || wkey0 + MMA_KV * 16 > wb0 || (C::kWindow && wkey0 < wb2);
          // 16-key slices holding a key that some row of this warp may see (wb1 > wkey0 here: >= 1)
          const int live = C::kSliceSkip ? min(MMA_KV, (wb1 - wkey0 + 15) >> 4) : MMA_KV;
          float s[MMA_Q][2 * MMA_KV][4];
          // Max-free tiles: once every row of the warp has a finite reference max m, a tile skips the row max (16
          // compares and 2 shuffles per row and thread, and their latency before the first exp2): it takes
          // p = 2^(x - m) directly and checks its per-thread row sums instead. A sum <= kMaxFreeSum bounds every p in
          // it (p >= 0), so o, d and the P fragments stay in range with the old m. A sum beyond it (or inf) means some
          // max climbed far above m: the tile is recomputed (Q.K^T again) on the exact path below, which rescales. With
          // the first tiles setting m near the rows' final max, that almost never happens.
          bool fast = false;
          if constexpr (prefill::kMaxFree) {
            fast = true;
#pragma unroll
            for (int mq = 0; mq < MMA_Q; ++mq) fast = fast && row_max[mq][0] != neg_inf() && row_max[mq][1] != neg_inf();
            fast = __all_sync(0xffffffffu, fast);
          }
#pragma unroll 1
          while (true) {
            // ---- S = Q K^T ----
#pragma unroll
            for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
              for (int j = 0; j < 2 * MMA_KV; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mq][j][e] = 0.f;
              }
            }
            const u32 k_stage = k_lane + stage * C::kKBytes;
            if (live < MMA_KV) {
              prefill::qk_tile<C, true>(s, q_lane, k_stage, live);
            } else {
              prefill::qk_tile<C, false>(s, q_lane, k_stage, live);
            }

            // ---- logits transform (variant) and mask ----
            if (C::kAlibi || C::kSoftCap || need_mask) {
              const int q_shift = info[2];
              // Packed row of this thread's element (mq = 0, h = 0); rows + 16 mq + 8 h hold elements 2h, 2h+1.
              const int thread_row0 = info[4] + warp_row0 + lane / 4;
#pragma unroll
              for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  const int pr = thread_row0 + mq * 16 + 8 * h;
                  const int token = static_cast<int>(prefill::fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
                  const int qpos = token + q_shift;  // kv position of this query row
                  const int lim_hi = C::kCausal ? min(qpos + 1, kv_end) : kv_end;  // keys >= lim_hi are masked
                  const int lim_lo = C::kWindow ? qpos - p.window_left : 0;        // keys < lim_lo are masked
                  float slope = 0.f;
                  if constexpr (C::kAlibi) {
                    // ALiBi slopes (FlashInfer / the paper's code): m = largest power of two <= num_qo_heads;
                    // head < m: 2^(-8 (head+1) / m), else 2^(-4 (2 (head - m) + 1) / m).
                    const int head = info[1] * g + (pr - token * g);
                    const float m = static_cast<float>(p.alibi_pow2);
                    slope = exp2f(head < p.alibi_pow2 ? -8.f * (head + 1) / m : -4.f * (2 * (head - p.alibi_pow2) + 1) / m);
                  }
                  i64 mask_bit0 = 0;
                  if constexpr (C::kCustomMask) {
                    mask_bit0 = static_cast<i64>(static_cast<const int*>(p.mask_indptr)[info[5]]) * 8 +
                                static_cast<i64>(token) * info[3];
                  }
#pragma unroll
                  for (int j = 0; j < 2 * MMA_KV; ++j) {
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; ++e) {
                      const int key = wkey0 + j * 8 + 2 * (lane % 4) + (e % 2);
                      float x = s[mq][j][e];
                      if constexpr (C::kAlibi || C::kSoftCap) {
                        x *= p.sm_scale;
                        if constexpr (C::kAlibi) x += slope * static_cast<float>(key - qpos);
                        if constexpr (C::kSoftCap) x = p.soft_cap * prefill::tanh_approx(x * p.inv_soft_cap);
                      }
                      if (need_mask) {
                        bool keep = key < lim_hi;
                        if constexpr (C::kWindow) keep = keep && key >= lim_lo;
                        if constexpr (C::kCustomMask) {
                          if (keep) {
                            const i64 bit = mask_bit0 + key;
                            const unsigned char byte = __ldg(static_cast<const unsigned char*>(p.mask) + (bit >> 3));
                            keep = (byte >> (bit & 7)) & 1;
                          }
                        }
                        x = keep ? x : neg_inf();
                      }
                      s[mq][j][e] = x;
                    }
                  }
                }
              }
            }


            if (prefill::kMaxFree && fast) {
              float tile_sum[MMA_Q][2];
              bool bad = false;
#pragma unroll
              for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                  const float sum = prefill::exp2_row<MMA_KV>(s[mq], h, x_scale, row_max[mq][h] * x_scale, 0.f);
                  tile_sum[mq][h] = sum;
                  bad |= !(sum <= prefill::kMaxFreeSum);
                }
              }
              if (!__any_sync(0xffffffffu, bad)) {
#pragma unroll
                for (int mq = 0; mq < MMA_Q; ++mq) {
                  row_sum[mq][0] += tile_sum[mq][0];
                  row_sum[mq][1] += tile_sum[mq][1];
                }
                break;
              }
              fast = false;  // recompute this tile on the exact path
              continue;
            }

            // ---- online softmax (base 2), with a lazy reference max ----
            // row_max is the reference m of the exponentials, not necessarily the true running max: it moves only when
            // a tile's max exceeds it by more than kRescaleSlack base-2 units, so p = 2^(x - m) stays
            // <= 2^kRescaleSlack (256: exact in fp32 and in the bf16 / fp16 P fragments) while o, the row sum and the
            // lse all use the same m, which is all the result needs. Past the first tiles the max rarely climbs that
            // far, so the O rescale (d/2 multiplies per row block and an exp2 per row, between S and P.V) is skipped
            // for the whole warp on almost every tile; with an exact running max it ran on most tiles of a causal
            // prefill.
            float alpha[MMA_Q][2];
            bool moved = false;
#pragma unroll
            for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const float m_old = row_max[mq][h];
                float mx = m_old;
#pragma unroll
                for (int j = 0; j < 2 * MMA_KV; ++j) mx = fmaxf(mx, fmaxf(s[mq][j][2 * h], s[mq][j][2 * h + 1]));
                mx = mma::quad_max(mx);
                // mx >= m_old. A row's first finite max always moves it (inf > slack); a row with no key yet keeps
                // m = -inf (-inf - -inf is NaN: not moved) and 0 as the exponent base, so exp2 never sees -inf - -inf.
                const bool row_moved = (mx - m_old) * x_scale > prefill::kRescaleSlack;
                const float m_new = row_moved ? mx : m_old;
                const float base = m_new == neg_inf() ? 0.f : m_new * x_scale;
                // (A row moving off -inf has o = 0, nothing to rescale: the first tile of an item skips the rescale
                // too.)
                moved |= row_moved && m_old != neg_inf();
                alpha[mq][h] = row_moved ? fmath::ex2(m_old * x_scale - base) : 1.f;
                row_max[mq][h] = m_new;
                row_sum[mq][h] = prefill::exp2_row<MMA_KV>(s[mq], h, x_scale, base, row_sum[mq][h] * alpha[mq][h]);
              }
            }
            if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
              for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
                for (int j = 0; j < DVO / 8; ++j) {
#pragma unroll
                  for (int e = 0; e < 4; ++e) o[mq][j][e] *= alpha[mq][e / 2];
                }
              }
            }
            break;
          }
#pragma unroll
          for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
            for (int kk = 0; kk < MMA_KV; ++kk) mma::frag_c_to_a<T>(pa[mq][kk], s[mq][2 * kk], s[mq][2 * kk + 1]);
          }
        }

        {
          const int* wv = info + C::kInfoInts + C::kWarpInts * (tid / 32);  // (read before the barrier, as above)
          const int v_base = wv[4], v_head = wv[5];
          i64 v_offs[KR];
          own_offsets(v_offs);
          prefill::cp_async_wait<2 * STAGES - 3>();
          group_sync();
          const int st = stage == 0 ? STAGES - 1 : stage - 1;
          if (ahead < kv_end) load_v(ahead, st, v_base, v_head, kv_end, v_offs);
          prefill::cp_async_commit();
          if constexpr (C::kPaged) {
            if (ahead + TILE_KV < kv_end) {
              read_pages(ahead + TILE_KV, v_base, kv_end, pages);
            } else if (XI && ahead < kv_end && info[6]) {
              // The first tile past the end (not the last iteration: thread 0 is still in this item): the next item's
              // first tile, copied after the epilogue.
              read_first_pages(info[6], pages);
            }
          }
        }
        if (!skip) {
          // ---- O += P V ----
          const u32 v_stage = v_lane + stage * C::kVBytes;
          // (recomputed rather than kept across the barrier; only this warp writes its bounds)
          const int live =
              C::kSliceSkip ? min(MMA_KV, (info[C::kInfoInts + C::kWarpInts * (tid / 32) + 1] - wkey0 + 15) >> 4) : MMA_KV;
          if (live < MMA_KV) {
            prefill::pv_tile<C, true>(o, pa, v_stage, live);
          } else {
            prefill::pv_tile<C, false>(o, pa, v_stage, live);
          }
        }
        stage = stage + 1 == STAGES ? 0 : stage + 1;
      }

      CUINFER_TRACE_STAMP(3)
      if constexpr (XI) {
        const int e_slot = (item - prefill::lds_volatile(sched)) % C::kTableItems;
        const int* e = table + e_slot * NF;
        // An item without KV tiles starts the next one here (after its own Q copy, issued by the item before, landed);
        // other items start it after their epilogue (below). (Facts re-read from the table rather than kept live across
        // the loop.)
        // (Staged epilogue: after it, like the others. The staging overwrites this item's Q rows, so their copy, which
        // no loop iteration waited for, must have landed first, next item or not.)
        if (e[prefill::kFKvStart] >= e[prefill::kFKvEnd]) {
          if constexpr (C::kStagedEpi) {
            prefill::cp_async_wait_all();
          } else if (e_slot + 1 < C::kTableItems && item + 1 < prefill::lds_volatile(sched + 1)) {
            prefill::cp_async_wait_all();
            issue_first(e_slot + 1, stage, pages);  // (pages: read before the loop)
            prefill::cp_async_commit();
          }
        }

        // ---- epilogue in registers: normalise, store o (or the fp32 partial state) and lse straight to global ----
        const int e_row0 = e[prefill::kFRow0], e_partial = e[prefill::kFPartial];
        const int e_rows = min(TILE_Q, e[prefill::kFQoLen] * g - e_row0);
        const int e_kvh = e[prefill::kFKvHead], e_qo_base = e[prefill::kFQoBase];
        // Thread coordinates recomputed from threadIdx (cheaper than keeping them live across the loop).
        const int e_lane = static_cast<int>(threadIdx.x % 32u);
        const int e_r0 = static_cast<int>((threadIdx.x % NT) / 32u) * MMA_Q * 16 + e_lane / 4;
        // The output row of tile row r: packed row e_row0 + r is a token (its row of o) and a head of the group.
        auto out_row = [&](int r, i64& row, int& head) {
          const int pr = e_row0 + r;
          const int token = static_cast<int>(prefill::fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
          head = e_kvh * g + (pr - token * g);
          row = e_qo_base + token;
        };
        if (C::kStagedEpi && e_partial < 0) {
          // Normalised o rows (16-bit) into this warp's Q rows, one stmatrix per 16 x 16 block (the A-fragment layout:
          // the ldmatrix addresses of Q), then each lane reads 16-byte pieces (chunks t + 4b) of its own 4 rows back
          // and stores them: 64 contiguous bytes per row and instruction, as the shuffle transpose gave.
          float inv[MMA_Q][2], lse[MMA_Q][2];
#pragma unroll
          for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float d = mma::quad_sum(row_sum[mq][h]);
              inv[mq][h] = d > 0.f ? fmath::rcp(d) : 0.f;
              lse[mq][h] = d > 0.f ? row_max[mq][h] * x_scale + fmath::lg2(d) : neg_inf();
            }
#pragma unroll
            for (int s = 0; s < DVO / 16; ++s) {
              u32 a[4];
              a[0] = mma::pack2<DTypeO>(o[mq][2 * s][0] * inv[mq][0], o[mq][2 * s][1] * inv[mq][0]);
              a[1] = mma::pack2<DTypeO>(o[mq][2 * s][2] * inv[mq][1], o[mq][2 * s][3] * inv[mq][1]);
              a[2] = mma::pack2<DTypeO>(o[mq][2 * s + 1][0] * inv[mq][0], o[mq][2 * s + 1][1] * inv[mq][0]);
              a[3] = mma::pack2<DTypeO>(o[mq][2 * s + 1][2] * inv[mq][1], o[mq][2 * s + 1][3] * inv[mq][1]);
              mma::stmatrix_x4(LdQK::at(q_lane, s, mq * 16), a);
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
                out_row(r, row, head);
                DTypeO* dst = static_cast<DTypeO*>(p.o) + row * p.o_stride_n + head * p.o_stride_h + 8 * t;
                const unsigned char* src = smem + r * (C::kChunksQK * 16);
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
#pragma unroll
        for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (C::kStagedEpi && e_partial < 0) break;
            const float d = mma::quad_sum(row_sum[mq][h]);
            const float inv = d > 0.f ? fmath::rcp(d) : 0.f;
            const float lse = d > 0.f ? row_max[mq][h] * x_scale + fmath::lg2(d) : neg_inf();
            const int r = e_r0 + mq * 16 + 8 * h;
            if (e_partial < 0) {
              // 16-byte stores: a 4 x 4 transpose inside each lane quad gives lane t all 8 columns of n8 block 4b + t
              // of its row, where the accumulator layout gives it 2 columns of every block (4-byte stores: 4x the store
              // instructions, half-filled sectors). The shuffles run in every lane, rows past the tile included; only
              // the stores are predicated.
              const int t = e_lane % 4;
              u32 v[DVO / 8];
#pragma unroll
              for (int j = 0; j < DVO / 8; ++j) v[j] = mma::pack2<DTypeO>(o[mq][j][2 * h] * inv, o[mq][j][2 * h + 1] * inv);
#pragma unroll
              for (int b = 0; b < DVO / 32; ++b) prefill::quad_transpose(v + 4 * b, t);
              if (r < e_rows) {
                i64 row;
                int head;
                out_row(r, row, head);
                DTypeO* dst = static_cast<DTypeO*>(p.o) + row * p.o_stride_n + head * p.o_stride_h + 8 * t;
#pragma unroll
                for (int b = 0; b < DVO / 32; ++b) {
                  *reinterpret_cast<uint4*>(dst + b * 32) = make_uint4(v[4 * b], v[4 * b + 1], v[4 * b + 2], v[4 * b + 3]);
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

        CUINFER_TRACE_STAMP(4)
        // Start the next item in the table: its Q and first K/V tile, into the buffer after this item's last tile
        // (every warp is done with Q and that buffer: barriers of the last iteration). Issued after the o stores rather
        // than during the last P.V, where those copies queued in front of that P.V's ldmatrix reads and the stores (P3
        // +4 %, measured with bench/tune_prefill.py); the other CTA of the SM covers their latency.
        if ((C::kStagedEpi || e[prefill::kFKvStart] < e[prefill::kFKvEnd]) && e_slot + 1 < C::kTableItems &&
            item + 1 < prefill::lds_volatile(sched + 1)) {
          issue_first(e_slot + 1, stage, pages);  // (paged: pages holds that tile's page numbers, read in the loop)
          prefill::cp_async_commit();
        }
      } else {
        // ---- epilogue: stage (o, m, d) of every warp in smem, merge across WARPS_KV, write 16-byte vectors ----
        prefill::cp_async_wait<0>();
        group_sync();
        float* epi_o = reinterpret_cast<float*>(smem);
        float* epi_md = reinterpret_cast<float*>(smem + C::kEpiOBytes);
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
                // Store m in base-2 units; an empty row (d = 0) stores -inf so the merge ignores it.
                epi_md[slot_r * 2] = d > 0.f ? row_max[mq][h] * x_scale : neg_inf();
                epi_md[slot_r * 2 + 1] = d;
              }
            }
          }
        }
        group_sync();

        // Item facts needed only here are re-read rather than kept live across the KV loop.
        const int ng = p.natural_groups;  // (prefill::item_ref, with the reloads)
        const int e_kvh = ng > 0 ? item / ng : prefill::reload_i32(p.item_kv_head, item);
        const int e_entry = ng > 0 ? item - e_kvh * ng : item;
        const int e_partial = ng > 0 ? -1 : prefill::reload_i32(p.item_partial, item);
        const int e_row0 = prefill::reload_i32(p.item_qo_tile, e_entry) * TILE_Q;
        const int e_req = prefill::reload_i32(p.item_req, e_entry);
        const int e_qo_base = prefill::reload_i32(p.qo_indptr, e_req);
        const int e_rows = min(TILE_Q, (prefill::reload_i32(p.qo_indptr, e_req + 1) - e_qo_base) * g - e_row0);
        constexpr int VPR = DVO / 8;  // 8-element vectors per row
        for (int idx = static_cast<int>(threadIdx.x % NT); idx < e_rows * VPR; idx += NT) {
          const int r = idx / VPR, cv = idx % VPR;
          float m_all = neg_inf();
#pragma unroll
          for (int w = 0; w < C::kWarpsKV; ++w) m_all = fmaxf(m_all, epi_md[(w * TILE_Q + r) * 2]);
          float acc[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] = 0.f;
          float d_all = 0.f;
          if (m_all != neg_inf()) {
#pragma unroll
            for (int w = 0; w < C::kWarpsKV; ++w) {
              const int sl = w * TILE_Q + r;
              const float wt = fmath::ex2(epi_md[sl * 2] - m_all);  // -inf (empty warp slice) -> 0
              d_all += epi_md[sl * 2 + 1] * wt;
              const float4 lo = *reinterpret_cast<const float4*>(epi_o + sl * C::kEpiPitch + cv * 8);
              const float4 hi = *reinterpret_cast<const float4*>(epi_o + sl * C::kEpiPitch + cv * 8 + 4);
              acc[0] += lo.x * wt, acc[1] += lo.y * wt, acc[2] += lo.z * wt, acc[3] += lo.w * wt;
              acc[4] += hi.x * wt, acc[5] += hi.y * wt, acc[6] += hi.z * wt, acc[7] += hi.w * wt;
            }
          }
          const float inv = d_all > 0.f ? fmath::rcp(d_all) : 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] *= inv;
          const float lse = d_all > 0.f ? m_all + fmath::lg2(d_all) : neg_inf();

          if (e_partial < 0) {
            const int pr = e_row0 + r;
            const int token = static_cast<int>(prefill::fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
            const int head = e_kvh * g + (pr - token * g);
            const i64 row = e_qo_base + token;
            DTypeO* dst = static_cast<DTypeO*>(p.o) + row * p.o_stride_n + head * p.o_stride_h + cv * 8;
            if constexpr (sizeof(DTypeO) == 2) {
              uint4 packed;
              packed.x = mma::pack2<DTypeO>(acc[0], acc[1]);
              packed.y = mma::pack2<DTypeO>(acc[2], acc[3]);
              packed.z = mma::pack2<DTypeO>(acc[4], acc[5]);
              packed.w = mma::pack2<DTypeO>(acc[6], acc[7]);
              *reinterpret_cast<uint4*>(dst) = packed;
            } else {
#pragma unroll
              for (int e = 0; e < 8; ++e) dst[e] = from_float<DTypeO>(acc[e]);
            }
            if (cv == 0 && p.lse != nullptr) {
              static_cast<float*>(p.lse)[row * p.lse_stride_n + head * p.lse_stride_h] = lse;
            }
          } else {
            float* dst = static_cast<float*>(p.partial_o) + static_cast<i64>(e_partial + r) * DVO + cv * 8;
            *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
            *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
            if (cv == 0) static_cast<float*>(p.partial_lse)[e_partial + r] = lse;
          }
        }
        group_sync();  // the next item's copies overwrite the staging area
      }
#ifdef CUINFER_TRACE
      if (tid == 0) {
        unsigned long long t1;
        unsigned sm;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        const unsigned long long c5 = clock64();
        auto* tr = (unsigned long long*)(p.mask_indptr) + 12 * item;  // NOLINT: diagnostic
        tr[0] = trace_t0[wg], tr[1] = t1, tr[2] = cta, tr[3] = sm;
#pragma unroll
        for (int k = 0; k < 5; ++k) tr[4 + k] = trace_c[wg][k];
        tr[9] = c5;
      }
#endif
#undef CUINFER_TRACE_STAMP
    }
    // Range done: take the next pool item (an empty range once the pool is dry, or when there is none).
    group_sync();  // every thread has read the old range
    if (tid == 0) {
      const int lo = sched[2], hi = sched[3];
      const int it = lo < hi ? lo + atomicAdd(static_cast<int*>(p.pool_count), 1) : hi;
      sched[0] = it, sched[1] = it < hi ? it + 1 : it;
    }
    group_sync();
    if (sched[0] >= sched[1]) break;
  }
  // The last CTA out returns both pool counters to 0 for the next launch (a CUDA graph replays it as is): every CTA
  // counts itself only after its last (failed) take, so no take of this launch follows the reset.
  // (p.pool_count[0]: items taken, [1]: CTAs done)
  if (tid == 0 && sched[2] < sched[3]) {
    int* count = static_cast<int*>(p.pool_count);
    if (atomicAdd(count + 1, 1) == static_cast<int>(num_ctas) - 1) count[0] = 0, count[1] = 0;
  }
}

}  // namespace cuinfer
