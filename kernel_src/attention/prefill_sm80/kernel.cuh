// FA2-class batch prefill: one persistent kernel template for ragged and paged KV, on mma.sync tensor cores (sm_80+),
// assembled from its pieces: the CTA layout (cta.cuh), the copies (loader.cuh, through the KV format of kv/), the
// math of a tile (mainloop.cuh, through the attention variant of variants/) and the epilogues (epilogue.cuh). The plan
// is read through plan/work.cuh.
//
// Work: CTA c runs its items of the plan, then items of the shared tail taken one at a time (plan/work.cuh). An item
// is one query tile (TILE_Q packed rows, packed row = token * g + head_in_group) of one request for one KV head, over
// the KV token range [kv_start, kv_end) already clipped by the variant's key ranges. Unsplit items (partial < 0) write
// o and lse straight to the outputs; split items write fp32 partial states for the merge kernel.
//
// CTA = WARPS_Q x WARPS_KV warps. With WARPS_KV > 1 (small query tiles) each warp keeps its own softmax state and the
// states merge in the epilogue. GROUPS = 2 (paired blocks, cross-item tiles): a block holds two such CTAs of the plan,
// side by side (cta.cuh); the policy pairs the ragged 128-row tiles (cuinfer/prefill/policy.py, block_groups).
//
// Pipeline (STAGES >= 2 buffers each for K and V, cp.async groups in issue order Q+K0, V0, K1, V1, ...):
//   iteration it:  wait K[it]; barrier; issue K[it+STAGES-1] into the buffer of K[it-1]; S = Q K[it]^T; softmax;
//                  wait V[it]; barrier; issue V[it+STAGES-1] into the buffer of V[it-1]; O += P V[it]
// The barrier after each wait is also the one that proves every warp is done with the buffer being refilled (it was
// read in iteration it-1), so there are two barriers per tile and the loads run STAGES-1 tiles ahead.
//
// Paged KV: each thread finds the address of its rows of a tile by page-table lookup when it issues the K copy, keeps
// the 64-bit offsets in a thread-private smem slot, and reuses them for the V copy of the same tile (K and V caches
// share strides).
//
// Across items (WARPS_KV == 1, every long-prefill tile): a CTA runs many short items (P3: ~18 per CTA), and an item
// that starts cold waits for its metadata (two dependent global reads), then for Q and its first K tile from DRAM, and
// ends with an epilogue of three barriers: several microseconds per item with the tensor cores of this CTA idle. So
//   * the facts of the next 16 items are resolved at once into an smem table (one item per thread, one wait);
//   * the epilogue stores o from the registers without a barrier (epilogue.cuh);
//   * each warp then issues its share of the NEXT item's Q and first K/V tile (Q and that buffer are free once every
//     warp has passed the last iteration's barriers), which land while the other CTA of the SM computes; paged: the
//     page numbers of that tile are read where the loop would read those of the tile past the item's end.
// The K/V buffer index runs on across items: the next item's first tile goes into the buffer after the last one.
#pragma once
#include "attention/prefill_sm80/cta.cuh"
#include "attention/prefill_sm80/epilogue.cuh"
#include "attention/prefill_sm80/loader.cuh"
#include "attention/prefill_sm80/mainloop.cuh"
#include "attention/prefill_sm80/traits.cuh"
#include "attention/prefill_sm80/transform.cuh"
#include "common/cp_async.cuh"
#include "common/ldst.cuh"
#include "debug/trace.cuh"
#include "plan/work.cuh"

namespace cuinfer {
namespace prefill {

using fp8::head_scale;  // (fp8 scale arrays: common/fp8.cuh)

// The facts of the item being run.
struct ItemFacts {
  int b, row0, kvh, kv_start, kv_end, qo_base, qo_len, kv_base, kv_len;
};

// Cross-item: resolve the facts of the next kTableItems items (from `item`), one per thread: two dependent reads,
// paid once per table.
template <class C, class P>
__device__ __forceinline__ void fill_table(const P& p, const Cta<C>& c, int item, int item_end) {
  using KV = typename C::KV;
  c.sync();  // every warp is done with the previous entries (epilogue)
  if (c.tid < min(C::kTableItems, item_end - item)) {
    const int it = item + c.tid;
    int* e = c.table + c.tid * C::kTableFields;
    const plan::ItemRef ref = plan::item_ref(p, it);
    const int eb = plan::req(p, ref.entry);
    const int* qo_indptr = static_cast<const int*>(p.qo_indptr);
    const int qb = qo_indptr[eb], kb = static_cast<const int*>(p.kv_indptr)[eb];
    const int len = KV::len(p, eb, kb);
    e[kFReq] = eb;
    e[kFRow0] = plan::qo_tile(p, ref.entry) * C::kTileQ;
    e[kFKvHead] = ref.kv_head;
    e[kFKvStart] = plan::kv_start(p, ref.entry);
    e[kFKvEnd] = plan::kv_end(p, ref.entry);
    e[kFPartial] = ref.partial;
    e[kFQoBase] = qb;
    e[kFQoLen] = qo_indptr[eb + 1] - qb;
    e[kFKvBase] = kb;
    e[kFKvLen] = len;
  }
  c.sync();
}

// The facts of `item` (table slot `slot` on the cross-item path, which fills the table at slot 0).
template <class C, class P>
__device__ __forceinline__ ItemFacts resolve_item(const P& p, const Cta<C>& c, int item, int slot, int item_end) {
  ItemFacts f;
  if constexpr (C::kCrossItem) {
    if (slot == 0) fill_table<C>(p, c, item, item_end);
    const int* e = c.table + slot * C::kTableFields;
    f.b = e[kFReq], f.row0 = e[kFRow0], f.kvh = e[kFKvHead];
    f.kv_start = e[kFKvStart], f.kv_end = e[kFKvEnd];
    f.qo_base = e[kFQoBase], f.qo_len = e[kFQoLen];
    f.kv_base = e[kFKvBase], f.kv_len = e[kFKvLen];
  } else {
    const plan::ItemRef ref = plan::item_ref(p, item);
    const int* qo_indptr = static_cast<const int*>(p.qo_indptr);
    f.b = plan::req(p, ref.entry);
    f.row0 = plan::qo_tile(p, ref.entry) * C::kTileQ;
    f.kvh = ref.kv_head;
    f.kv_start = plan::kv_start(p, ref.entry);
    f.kv_end = plan::kv_end(p, ref.entry);
    f.qo_base = qo_indptr[f.b];
    f.qo_len = qo_indptr[f.b + 1] - f.qo_base;
    f.kv_base = static_cast<const int*>(p.kv_indptr)[f.b];  // ragged: first kv row; paged: first page-table entry
    f.kv_len = C::KV::len(p, f.b, f.kv_base);
  }
  return f;
}

// Q + tile 0 (already issued by the previous item on the cross-item path, except at the start of a table), then
// tiles 1 .. STAGES-2 (in TileOrder), into the buffers after `stage`. Groups: Q+K0, V0, K1, V1, ...
template <class C, class P>
__device__ __forceinline__ void prologue(const Loader<C, P>& ld, const ItemFacts& f, int valid_rows, int stage,
                                         bool first_tile, int (&pages)[C::kKVRowsPerThread]) {
  using O = TileOrder<C>;
  if (first_tile) {
    const int key_first = O::first(f.kv_start, f.kv_end);
    ld.load_q(f.row0, valid_rows, f.qo_base, f.kvh);
    if (f.kv_start < f.kv_end) {
      if constexpr (C::kPaged) ld.read_pages(key_first, f.kv_base, f.kv_end, pages);
      ld.load_k(key_first, stage, f.kv_base, f.kvh, f.kv_end, pages);
    }
    cp_async_commit();
    if (f.kv_start < f.kv_end) {
      i64 offs[C::kKVRowsPerThread];
      ld.own_offsets(offs);
      ld.load_v(key_first, stage, f.kv_base, f.kvh, f.kv_end, offs);
    }
    cp_async_commit();
  }
#pragma unroll
  for (int s = 1; s < C::kStages - 1; ++s) {
    const int st = stage + s >= C::kStages ? stage + s - C::kStages : stage + s;
    const int key0 = O::next(O::first(f.kv_start, f.kv_end), s);
    // (TileOrder::has written out: through the call, ptxas (NVRTC 12.9) scheduled 7 forward fp8 kernels differently)
    const bool any = key0 < f.kv_end && (!C::kBackwardTiles || key0 >= f.kv_start);
    if (any) {
      if constexpr (C::kPaged) ld.read_pages(key0, f.kv_base, f.kv_end, pages);
      ld.load_k(key0, st, f.kv_base, f.kvh, f.kv_end, pages);
    }
    cp_async_commit();
    if (any) {
      i64 offs[C::kKVRowsPerThread];
      ld.own_offsets(offs);
      ld.load_v(key0, st, f.kv_base, f.kvh, f.kv_end, offs);
    }
    cp_async_commit();
  }
}

// Warp-uniform bounds (WarpField): "does this tile need a mask at all" and "is it fully masked for this warp", from
// the variant's key ranges of the warp's first and last query token. Kept in smem (read once per tile after the
// barrier) rather than in registers; the loop reads them before its first barrier.
template <class C, class P, class VP>
__device__ __forceinline__ void write_warp_bounds(const P& p, const VP& v, const Cta<C>& c, const ItemFacts& f,
                                                  int packed_rows, int q_shift) {
  using V = typename C::Variant;
  const int warp_first = f.row0 + c.warp_row0;
  const int warp_last = min(warp_first + C::kMmaQ * 16, packed_rows) - 1;
  const int tok_first = static_cast<int>(fast_div(static_cast<u32>(warp_first), p.group_mul, p.group_shift));
  const int tok_last = static_cast<int>(fast_div(static_cast<u32>(max(warp_last, 0)), p.group_mul, p.group_shift));
  int* wb = c.warp_ints();
  if (c.lane == 0) {
    // (key ranges may not depend on the query head: a warp's rows hold several heads)
    const variant::Index first{f.b, tok_first, tok_first + q_shift, -1, f.kvh, f.qo_len, f.kv_len, C::kHeadDimQK};
    const variant::Index last{f.b, tok_last, tok_last + q_shift, -1, f.kvh, f.qo_len, f.kv_len, C::kHeadDimQK};
    int lo_first = variant::kNoLowerBound, hi_first = f.kv_end, lo_last = variant::kNoLowerBound, hi_last = f.kv_end;
    V::key_range(v, first, lo_first, hi_first);
    V::key_range(v, last, lo_last, hi_last);
    wb[kWKvBase] = f.kv_base, wb[kWKvHead] = f.kvh;
    if constexpr (C::kKV8) {
      wb[kWKScale] = __float_as_int(head_scale(p.k_scales, p.k_scales_stride, f.kvh));
      wb[kWVScale] = __float_as_int(p.v_scale * head_scale(p.v_scales, p.v_scales_stride, f.kvh));
    }
    wb[kWUpper] = hi_first;
    wb[kWSkip] = warp_first >= packed_rows ? -2147483647 : hi_last;
    wb[kWLower] = lo_last;
    wb[kWBelow] = lo_first;
  }
  __syncwarp();
}

// fp8 K/V, kConvert: the CTA converts the K (kIsK) or V tile in buffer `stage` into the 16-bit tile the 16-bit math
// reads (traits.cuh), each 16-byte chunk of 16 fp8 elements into two chunks of 8, both layouts swizzled
// (common/swizzle.cuh); rows past the item's end were zero-filled by the copy and stay zero.
//
// Each thread converts exactly the chunks it copied (the copy mapping of loader.cuh load_k / load_v: chunks kv_chunk
// + 8 k, kKVPairRows + 4 k, of rows kv_row + i * kKVRowsPerPass), so its own cp.async wait makes them visible to it and no barrier is
// needed between the wait and the conversion: kv_loop converts between its wait and the barrier it has anyway (two
// barriers per tile, as the 16-bit kernel). The 16-bit tile being written is free there: K16 was last read by the
// previous tile's Q.K^T (before the previous V barrier), V16 by its P.V (before this tile's K barrier). Addresses are
// the copy's (one base plus immediates); the loop is unrolled (independent pieces: their latencies overlap). A chunk
// is read as two 8-byte halves, half h = bit 0 of (ch ^ ch / 4 ^ ch / 8) first, and half h is written as 16-bit chunk
// 2 ch + h: with that order the 16 lanes of an 8-byte read phase (two rows whose swizzles differ in bit 0, or one
// row) and the 8 lanes of a 16-byte write phase hit distinct banks (tests/cpu/test_fp8_fragments.py checks both); half
// 0 first left every 16-byte write 2-way conflicted (even chunks only: 4 of the 8 bank groups).
// kKVPairRows (fp8 head dim 128): 4 threads per row, chunks kv_chunk and kv_chunk + 4, the half order from the row
// (bit 0 ^ bit 2 of kv_row: the 16 lanes of an 8-byte read phase hold rows r, r + 4, r + 1, r + 5, the 8 of a 16-byte
// write phase rows r, r + 4); chunk kv_chunk + 4 is at the copy's offset ^ 64 and its 16-bit chunks one 128-byte line
// further, with the same half order.
// Passes of convert_tile unrolled (kUnroll rows of each thread converted together). With 2 rows a thread (the paged
// 128 x 64 tile, kKVPairRows), ptxas (NVRTC 12.9) spills 4 bytes at 255 registers with both unrolled and none with
// either one rolled: K rolled (2 passes), V unrolled (the same instruction count as the converse, measured).
constexpr int kConvUnrollK = 1, kConvUnrollV = 2;
template <class C, bool kIsK, int kUnroll> __device__ __forceinline__ void convert_tile(const Cta<C>& c, int stage) {
  using T = typename Select<kIsK, typename C::DTypeQK, typename C::DTypePV>::type;  // (the products' operand types)
  using F8 = typename C::DTypeKV;
  constexpr int D = kIsK ? C::kHeadDimQK : C::kHeadDimVO, C8 = D / 16, C16 = D / 8;
  constexpr int TPR = C::kKVThreadsPerRow, PASS = C::kKVRowsPerPass;
  static_assert(C8 == C::kChunksK && C8 % TPR == 0 && PASS % 8 == 0, "the copy's mapping (rows 8k apart: one swizzle)");
  // (kKVPairRows: the half order follows the row, bits 0 and 2 of kv_row: see cta.cuh and the comment above)
  const int h0 = C::kKVPairRows ? (c.kv_row ^ (c.kv_row >> 2)) & 1 : (c.kv_chunk ^ (c.kv_chunk >> 2)) & 1;
  const unsigned char* src = c.smem + (kIsK ? C::kKOff + stage * C::kKBytes : C::kVOff + stage * C::kVBytes) +
                             (kIsK ? c.cp_k_dst : c.cp_v_dst);
  // kKVPairRows: chunk kv_chunk + 4 of the fp8 row (slot ^ 4: offset ^ 64)
  const unsigned char* src_hi = c.smem + (kIsK ? C::kKOff + stage * C::kKBytes : C::kVOff + stage * C::kVBytes) +
                                ((kIsK ? c.cp_k_dst : c.cp_v_dst) ^ 64u);
  unsigned char* dst = c.smem + (kIsK ? C::kK16Off : C::kV16Off);
  const u32 d0 = Swizzle<C16>::byte_offset(c.kv_row, 2 * c.kv_chunk + h0);  // (the other half: slot ^ 1, offset ^ 16)
#pragma unroll kUnroll
  for (int i = 0; i < C::kKVRowsPerThread; ++i) {
#pragma unroll
    for (int k = 0; k < C8 / TPR; ++k) {  // chunk kv_chunk + 8 k: h = h0 ^ k, 16-bit chunks 16 k further
      // kKVPairRows: chunk kv_chunk + 4 k, its 16-bit chunks 8 further (the next 128-byte line), same half order
      const unsigned char* a =
          C::kKVPairRows ? (k ? src_hi : src) + i * PASS * C8 * 16 : src + i * PASS * C8 * 16 + k * 128;
      const u32 o = i * PASS * C16 * 16 + k * (C::kKVPairRows ? 128 : 256);
      const u32 first = (!C::kKVPairRows && (k & 1)) ? d0 ^ 16u : d0, second = first ^ 16u;
      const int h = C::kKVPairRows ? h0 : h0 ^ (k & 1);
      const uint2 x = *reinterpret_cast<const uint2*>(a + 8 * h);
      const uint2 y = *reinterpret_cast<const uint2*>(a + 8 - 8 * h);
      uint4 u, w;
      fp8::quad<T, F8>(x.x, u.x, u.y);
      fp8::quad<T, F8>(x.y, u.z, u.w);
      fp8::quad<T, F8>(y.x, w.x, w.y);
      fp8::quad<T, F8>(y.y, w.z, w.w);
      *reinterpret_cast<uint4*>(dst + first + o) = u;
      *reinterpret_cast<uint4*>(dst + second + o) = w;
    }
  }
}

// fp8 K/V, whole-tile conversion (kConvert): the per-KV-head factor of a k scale array is folded into the item's
// base-2 logit scale x_scale when the variant's softmax takes the plain scores (no logits transform): the scores are
// only ever used as s * x_scale there (their max included, and the lse in the epilogue), so nothing multiplies each
// score of each tile (scale_scores) and no register holds the factor across the loop.
template <class C>
constexpr bool kFoldKScale =
    C::kKV8 && C::kConvert && C::Variant::kSoftmax && !variant::kTileLogits<typename C::Variant>;

// Max-free softmax tiles (softmax_max_free, sm_90+): 16-bit K/V, and fp8 K/V converted by the CTA (kConvert: with the
// k scale folded (kFoldKScale) and the item index kept in shared memory across the loop (run_item) the paged 128 x 64
// tile fits 255 registers with it, where it spilled 24 bytes before). Tiles whose warps convert their own fp8
// fragments take the exact path.
template <class C> constexpr bool kMaxFreeTiles = kMaxFree && (!C::kKV8 || (C::kConvert && C::kGroups == 1));

// Variants whose logits climb along the keys (Variant.rising_logits: ALiBi toward the diagonal, slope·64 keys is up to
// ~54 natural units a tile) run an item's tiles backwards (Traits::kBackwardTiles), so the max-free path mostly holds;
// where it still fails, a failed tile is computed twice (Q·K^T, the logits and the exponentials again on the exact
// path), so their warps keep the exact path for the rest of the item. Other kernels keep their code: a failure there
// is rare, and for the soft cap (bounded logits) the sticky flag cost 4-5 % on P1-P3 (H200, 2026-12-02). The flag is
// an int of the warp's in shared memory (kWExactSlot: 16-bit K/V use the fp8 scale's slot, CTA-converted fp8 the 10th
// of its 12 ints): in a register across the loop it spilled the soft-capped 128 x 64 tile (12-24 bytes). Lane 0 clears
// it at the item's start (run_item) and sets it on a failure; the warp reads it after the next tile's block barrier.
template <class C>
constexpr bool kStickyExact = kMaxFreeTiles<C> && C::Variant::kRisingLogits && C::Variant::kSoftmax;
template <class C> constexpr int kWExactSlot = C::kKV8 ? kWItem + 1 : kWKScale;

// kHalfQK (traits.cuh), at an item's first KV tile, after the cp.async wait that lands its Q rows: this warp's Q rows
// (the staged-epilogue copy mapping of loader.cuh load_q: rows lane / 8 + 4 i, chunks lane % 8 + 8 c of the warp's
// rows, so each lane reads only what it copied) from bfloat16 to float16 in place, times the power of two 2^s that
// puts their largest |q| in [2^14, 2^15) (fp8::q_f16_scale: nothing overflows, every bfloat16 value within 2^28 of it
// converts exactly). Returns 2^-s, which the caller folds into the logits' scale. Two passes over the lane's chunks
// (the max, then the conversion), so no Q data stays in registers beside the accumulators.
template <class C> __device__ __forceinline__ float convert_q(const Cta<C>& c) {
  constexpr int ROWS = C::kMmaQ * 4, CH = C::kChunksQK / 8, PITCH = C::kChunksQK * 16;
  const int qr = c.lane / 8, qc = c.lane % 8;
  unsigned char* q = c.smem;  // (the Q tile: offset 0)
  __nv_bfloat162 m2 = __float2bfloat162_rn(0.f);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int r = c.warp_row0 + qr + 4 * i;
#pragma unroll
    for (int k = 0; k < CH; ++k) {
      const uint4 x = *reinterpret_cast<const uint4*>(q + r * PITCH + ((qc ^ (r % 8)) * 16) + k * 128);
      const u32 w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) m2 = fp8::q_abs_max2(m2, w[j]);
    }
  }
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    u32 b = *reinterpret_cast<const u32*>(&m2);
    b = __shfl_xor_sync(0xffffffffu, b, o);
    m2 = __hmax2(m2, *reinterpret_cast<const __nv_bfloat162*>(&b));
  }
  float inv;
  const u32 sc2 = fp8::q_f16_pow2(m2, inv);  // 2^s in both bfloat16 halves
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int r = c.warp_row0 + qr + 4 * i;
#pragma unroll
    for (int k = 0; k < CH; ++k) {
      uint4* a = reinterpret_cast<uint4*>(q + r * PITCH + ((qc ^ (r % 8)) * 16) + k * 128);
      uint4 x = *a;
      u32* w = reinterpret_cast<u32*>(&x);
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = fp8::q_f16_times(w[j], sc2);
      *a = x;
    }
  }
  return inv;
}

// fp8 K/V: the per-KV-head k scale of a scale array (1 without one: the common case costs one compare per tile).
template <class C> __device__ __forceinline__ void scale_scores(float (&s)[C::kMmaQ][2 * C::kMmaKV][4], float k) {
  if (k == 1.f) return;
#pragma unroll
  for (int mq = 0; mq < C::kMmaQ; ++mq) {
#pragma unroll
    for (int j = 0; j < 2 * C::kMmaKV; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mq][j][e] *= k;
    }
  }
}

// fp8 K/V, after the item's last tile: the output accumulators scaled by v_scale (the number times the per-KV-head
// value of a scale array) and, when each warp converted its own V fragments (not kConvert), moved back to the usual C
// layout. Cross-item kernels with the staged epilogue (sm_90) move them through the warp's own Q rows (free once its
// last S is computed: in that mode only the warp itself copies into them, after its epilogue), one 16-row block and
// kPiece chunks at a time, with no registers beyond the accumulators; the others exchange them in registers
// (fp8::pv_acc_to_natural: 4 shuffles per 4 values), which at 255 registers would spill.
template <class C> __device__ __forceinline__ void finish_fp8_o(const Cta<C>& c, float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4]) {
  constexpr int MMA_Q = C::kMmaQ, DVO = C::kHeadDimVO;
  const float vs = __int_as_float(c.warp_ints()[kWVScale]);
  const int g = c.lane / 4, t = c.lane % 4;
  if constexpr (C::kConvert) {
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
      for (int j = 0; j < DVO / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mq][j][e] *= vs;
      }
    }
  } else if constexpr (C::kStagedEpi) {
    constexpr int kPitchQ = C::kChunksQK * 16;                     // bytes of a Q row
    constexpr int kRegion = MMA_Q * 16 * kPitchQ;                  // the warp's Q rows
    constexpr int kPiece = kRegion / 1024 < DVO / 16 ? kRegion / 1024 : DVO / 16;  // chunks per pass (16 x 16 x 4 B)
    static_assert(kPiece >= 1 && (DVO / 16) % kPiece == 0, "the warp's Q rows hold whole passes");
    constexpr int kUnits = 4 * kPiece;  // 16-byte units of a row of one pass
    unsigned char* buf = c.smem + c.warp_row0 * kPitchQ;
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
      for (int c0 = 0; c0 < DVO / 16; c0 += kPiece) {
        __syncwarp();
#pragma unroll
        for (int cc = 0; cc < kPiece; ++cc) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // thread t holds dims 16 c + 4t .. 4t+3 of rows g (h = 0) and g + 8
            const int r = g + 8 * h, swz = (r & 1) << 2;  // (units XOR 4 on odd rows: 8 lanes, 8 bank groups)
            const float* e = o[mq][2 * (c0 + cc)];
            const float* od = o[mq][2 * (c0 + cc) + 1];
            *reinterpret_cast<float4*>(buf + (r * kUnits + ((4 * cc + t) ^ swz)) * 16) =
                make_float4(e[2 * h] * vs, od[2 * h] * vs, e[2 * h + 1] * vs, od[2 * h + 1] * vs);
          }
        }
        __syncwarp();
#pragma unroll
        for (int cc = 0; cc < kPiece; ++cc) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // the usual layout: dims 16c + 2t + {0, 1} and 16c + 8 + 2t + {0, 1}
            const int r = g + 8 * h, swz = (r & 1) << 2;
            const float2 lo = *reinterpret_cast<const float2*>(buf + (r * kUnits + ((4 * cc + t / 2) ^ swz)) * 16 +
                                                               (t & 1) * 8);
            const float2 hi = *reinterpret_cast<const float2*>(
                buf + (r * kUnits + ((4 * cc + 2 + t / 2) ^ swz)) * 16 + (t & 1) * 8);
            o[mq][2 * (c0 + cc)][2 * h] = lo.x, o[mq][2 * (c0 + cc)][2 * h + 1] = lo.y;
            o[mq][2 * (c0 + cc) + 1][2 * h] = hi.x, o[mq][2 * (c0 + cc) + 1][2 * h + 1] = hi.y;
          }
        }
      }
    }
    __syncwarp();
  } else {
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
      for (int j = 0; j < DVO / 16; ++j) fp8::pv_acc_to_natural(o[mq][2 * j], o[mq][2 * j + 1], t);
#pragma unroll
      for (int j = 0; j < DVO / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mq][j][e] *= vs;
      }
    }
  }
}

// P as 16-bit A fragments of P·V from the probabilities in S.
template <class C>
__device__ __forceinline__ void pack_p(const float (&s)[C::kMmaQ][2 * C::kMmaKV][4],
                                       u32 (&pa)[C::kMmaQ][C::kMmaKV][4]) {
#pragma unroll
  for (int mq = 0; mq < C::kMmaQ; ++mq) {
#pragma unroll
    for (int kk = 0; kk < C::kMmaKV; ++kk) {
      mma::frag_c_to_a<typename C::DTypePV>(pa[mq][kk], s[mq][2 * kk], s[mq][2 * kk + 1]);
    }
  }
}

// S, the variant and the softmax of one tile for this warp -> P as 16-bit A fragments (packed before the V copy is
// issued: half the registers).
template <class C, class P, class VP>
__device__ __forceinline__ void tile_scores(const P& p, const VP& v, const Cta<C>& c, int stage, int wkey0, int kv_end, int wb0,
                                            int wb1, int wb2, u32 (&pa)[C::kMmaQ][C::kMmaKV][4],
                                            float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4], float (&row_max)[C::kMmaQ][2],
                                            float (&row_sum)[C::kMmaQ][2], float x_scale,
                                            const typename C::Variant::RowState (&rows)[C::kMmaQ][2]) {
  using V = typename C::Variant;
  constexpr int MMA_Q = C::kMmaQ, MMA_KV = C::kMmaKV;
  // With a logits transform, P is packed on each softmax path before they join (the float S is not live at the join):
  // fewer registers live there, which kept the soft-capped ragged 128 x 64 tile from spilling (8 bytes). The plain
  // kernels pack after the join (their code unchanged).
  constexpr bool kPackEarly = variant::kTileLogits<V> && V::kSoftmax;
  const bool need_mask = V::kMask || wkey0 + MMA_KV * 16 > wb0 || (V::kLowerBound && wkey0 < wb2);
  // 16-key slices holding a key that some row of this warp may see (wb1 > wkey0 here: >= 1)
  const int live = min(MMA_KV, (wb1 - wkey0 + 15) >> 4);
  float s[MMA_Q][2 * MMA_KV][4];
  bool fast = false;  // max-free (softmax_max_free): every row of the warp has a finite reference max
  // (fp8 K/V: the tiles the CTA converts (kConvert) only, see kMaxFreeTiles)
  if constexpr (kMaxFreeTiles<C>) {
    static_assert(!kStickyExact<C> || !C::kKV8 || C::kWarpInts > kWItem + 1, "a free warp int for the flag");
    fast = !kStickyExact<C> || lds_volatile(c.warp_ints() + kWExactSlot<C>) == 0;
#pragma unroll
    for (int mq = 0; mq < MMA_Q; ++mq) fast = fast && row_max[mq][0] != neg_inf() && row_max[mq][1] != neg_inf();
    fast = __all_sync(0xffffffffu, fast);
  }
  // Leading slopes (kFoldSlope): accumulator units per natural logit unit, for slope_scores. A tile's scores times
  // sm_scale are natural logits when the chain has more logits (logits_and_mask), else its scores times x_scale are
  // base-2 logits; either way after scale_scores' k scale where that applies it after the MMAs.
  float inv_nat = 1.f;
  if constexpr (variant::kFoldSlope<V>) {
    inv_nat = variant::kTileLogits<V> ? fmath::rcp(p.sm_scale) : kLog2e * fmath::rcp(x_scale);
    if constexpr (C::kKV8 && !kFoldKScale<C>) inv_nat *= fmath::rcp(__int_as_float(c.warp_ints()[kWKScale]));
  }
#pragma unroll 1
  while (true) {
    if constexpr (variant::kFoldSlope<V>) {
      slope_scores<C>(p, v, c, s, wkey0, inv_nat, rows);
    } else {
#pragma unroll
      for (int mq = 0; mq < MMA_Q; ++mq) {
#pragma unroll
        for (int j = 0; j < 2 * MMA_KV; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mq][j][e] = 0.f;
        }
      }
    }
    const u32 k_stage = c.k_lane + (C::kConvert ? 0 : stage * C::kKBytes);  // (kConvert: the one 16-bit K tile)
    if constexpr (C::kKV8 && !C::kConvert) {
      if (live < MMA_KV) {
        qk_tile_fp8<C, true>(s, c.q8_lane, k_stage, live);
      } else {
        qk_tile_fp8<C, false>(s, c.q8_lane, k_stage, live);
      }
    } else if (live < MMA_KV) {
      qk_tile<C, true>(s, c.q_lane, k_stage, live);
    } else {
      qk_tile<C, false>(s, c.q_lane, k_stage, live);
    }
    if constexpr (C::kKV8 && !kFoldKScale<C>) scale_scores<C>(s, __int_as_float(c.warp_ints()[kWKScale]));
    // Two copies of the variant's logits: interior tiles (most of them) compute no key bounds at all, and the
    // boundary tiles' copy alone holds the registers of the masks (a 64-key tile with ALiBi spilled 80 bytes with
    // one copy and a runtime need_mask, 16 with two).
    if (need_mask) {
      logits_and_mask<C>(p, v, c, s, wkey0, kv_end, true, rows);
    } else if constexpr (variant::kTileLogits<V>) {
      logits_and_mask<C>(p, v, c, s, wkey0, kv_end, false, rows);
    }
    if constexpr (!V::kSoftmax) {
      weights_sum<C>(s, row_sum);
      break;
    }
    if (kMaxFreeTiles<C> && fast) {
      if (softmax_max_free<C>(s, row_max, row_sum, x_scale)) {
        if constexpr (kPackEarly) pack_p<C>(s, pa);
        break;
      }
      fast = false;  // recompute this tile on the exact path
      if constexpr (kStickyExact<C>) {
        if (c.lane == 0) c.warp_ints()[kWExactSlot<C>] = 1;  // (the failure is warp-uniform: an __any_sync)
      }
      continue;
    }
    softmax_exact<C>(s, o, row_max, row_sum, x_scale);
    if constexpr (kPackEarly) pack_p<C>(s, pa);
    break;
  }
  if constexpr (!kPackEarly) pack_p<C>(s, pa);
}

// The KV tiles of one item in TileOrder, by first key (key0) and buffer (stage, which runs on across items); the tile
// STAGES-1 ahead in that order starts at `ahead`.
template <class C, class P, class VP>
__device__ __forceinline__ void kv_loop(const P& p, const VP& v, const Cta<C>& c, const Loader<C, P>& ld, int kv_start, int kv_end,
                                        int& stage, int (&pages)[C::kKVRowsPerThread],
                                        float (&o)[C::kMmaQ][C::kHeadDimVO / 8][4], float (&row_max)[C::kMmaQ][2],
                                        float (&row_sum)[C::kMmaQ][2], float x_scale,
                                        const typename C::Variant::RowState (&rows)[C::kMmaQ][2]) {
  using V = typename C::Variant;
  constexpr int STAGES = C::kStages, MMA_KV = C::kMmaKV;
  using O = TileOrder<C>;
  const int key_first = O::first(kv_start, kv_end);
  for (int key0 = key_first; O::has(key0, kv_start, kv_end); key0 += O::kStep) {
    const int ahead = O::next(key0, STAGES - 1);
    const int wkey0 = key0 + c.warp_col0;  // first key of this warp's slice
    // This warp's bounds, read before the barrier: the read then overlaps the wait (read after the copies below, it
    // also waited for their address registers, which ptxas reused for it).
    const int* wb = c.warp_ints();
    const int wb0 = wb[kWUpper], wb1 = wb[kWSkip], cp_base = wb[kWKvBase], cp_head = wb[kWKvHead];
    const int wb2 = V::kLowerBound ? wb[kWLower] : 0, wb3 = V::kLowerBound ? wb[kWBelow] : 0;
    cp_async_wait<2 * STAGES - 3>();
    if constexpr (C::kConvert) convert_tile<C, true, kConvUnrollK>(c, stage);  // (its own copies: see convert_tile)
    c.sync();
    if constexpr (C::kTransforms) {
      transform_tile<C>(p, v, c, stage, key0, kv_end, key0 == key_first);
      c.sync();
    }
    if (key0 == key_first) CUINFER_PREFILL_TRACE_STAMP(2);
    const int st = stage == 0 ? STAGES - 1 : stage - 1;  // buffer of the previous tile == of the tile ahead
    if (O::has(ahead, kv_start, kv_end)) ld.load_k(ahead, st, cp_base, cp_head, kv_end, pages);
    cp_async_commit();
    // Fully masked for this warp (all keys past every row's limit, or before every row's lower bound): skip the math.
    const bool skip = wkey0 >= wb1 || (V::kLowerBound && wkey0 + MMA_KV * 16 <= wb3);
    u32 pa[C::kMmaQ][MMA_KV][4];
    if (!skip) tile_scores<C>(p, v, c, stage, wkey0, kv_end, wb0, wb1, wb2, pa, o, row_max, row_sum, x_scale, rows);
    {
      const int* wv = c.warp_ints();  // (read before the barrier, as above)
      const int v_base = wv[kWKvBase], v_head = wv[kWKvHead];
      i64 v_offs[C::kKVRowsPerThread];
      if constexpr (!C::kConvert) ld.own_offsets(v_offs);
      cp_async_wait<2 * STAGES - 3>();
      if constexpr (C::kConvert) {  // (the offsets read after the conversion: fewer registers live across it)
        convert_tile<C, false, kConvUnrollV>(c, stage);
        ld.own_offsets(v_offs);
      }
      c.sync();
      if (O::has(ahead, kv_start, kv_end)) ld.load_v(ahead, st, v_base, v_head, kv_end, v_offs);
      cp_async_commit();
      if constexpr (V::kValueTransform) {
        transform_values<C>(v, c, stage, key0, kv_end);  // (this tile's V landed: the barrier above)
        c.sync();
      }
      if constexpr (C::kPaged) {
        if (O::has(O::next(ahead, 1), kv_start, kv_end)) {
          ld.read_pages(O::next(ahead, 1), v_base, kv_end, pages);
        } else if (C::kCrossItem && O::has(ahead, kv_start, kv_end) && c.info[kINextSlot]) {
          // The first tile past the end (not the last iteration: thread 0 is still in this item): the next item's
          // first tile, copied after the epilogue.
          ld.read_first_pages(c.info[kINextSlot], pages);
        }
      }
    }
    if (!skip) {
      const u32 v_stage = c.v_lane + (C::kConvert ? 0 : stage * C::kVBytes);  // (kConvert: the one 16-bit V tile)
      // (recomputed rather than kept across the barrier; only this warp writes its bounds)
      const int live = min(MMA_KV, (c.warp_ints()[kWSkip] - wkey0 + 15) >> 4);
      if constexpr (C::kKV8 && !C::kConvert) {
        if (live < MMA_KV) {
          pv_tile_fp8<C, true>(o, pa, v_stage, live);
        } else {
          pv_tile_fp8<C, false>(o, pa, v_stage, live);
        }
      } else if (live < MMA_KV) {
        pv_tile<C, true>(o, pa, v_stage, live);
      } else {
        pv_tile<C, false>(o, pa, v_stage, live);
      }
    }
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }
}

// One item: its facts, the prologue, the KV tiles and the epilogue.
template <class C, class P, class VP>
__device__ __forceinline__ void run_item(const P& p, const VP& v, const Cta<C>& c, const Loader<C, P>& ld, int& item,
                                         int& stage) {
  constexpr bool XI = C::kCrossItem;
  constexpr int MMA_Q = C::kMmaQ, DVO = C::kHeadDimVO;
  CUINFER_PREFILL_TRACE_BEGIN(C, c.tid, c.wg);
  // cross-item: the item's table slot (items of a CTA fill the table kTableItems at a time)
  const int slot = XI ? (item - lds_volatile(c.sched())) % C::kTableItems : 0;
  int item_end = 0;  // (cross-item only: the end of the range)
  if constexpr (XI) item_end = lds_volatile(c.sched() + 1);
  const ItemFacts f = resolve_item<C>(p, c, item, slot, item_end);
  // cross-item: the next item is in the table, and this one starts it
  const bool has_next = XI && slot + 1 < C::kTableItems && item + 1 < item_end;
  const int packed_rows = f.qo_len * p.group_size;
  const int valid_rows = min(C::kTileQ, packed_rows - f.row0);
  const int q_shift = f.kv_len - f.qo_len;  // query token i sits at kv position i + q_shift
  if (c.tid == 0) {
    int* info = c.info;
    info[kIKvBase] = f.kv_base, info[kIKvHead] = f.kvh, info[kIQShift] = q_shift, info[kIKvLen] = f.kv_len;
    info[kIRow0] = f.row0, info[kIReq] = f.b;
    // cross-item: the next item's table slot, 0 when this item does not start it (slot 0 starts itself)
    info[kINextSlot] = has_next ? slot + 1 : 0;
  }
  int pages[C::kKVRowsPerThread];
  prologue<C>(ld, f, valid_rows, stage, !XI || slot == 0, pages);
  // kConvert: the item index waits out the KV loop in the warp's ints (made visible by write_warp_bounds' __syncwarp),
  // re-read below: one register fewer across the loop (Traits::kWarpInts)
  if constexpr (C::kConvert) {
    if (c.lane == 0) c.warp_ints()[kWItem] = item;
  }
  if constexpr (kStickyExact<C>) {
    if (c.lane == 0) c.warp_ints()[kWExactSlot<C>] = 0;  // (published by write_warp_bounds' __syncwarp too)
  }
  write_warp_bounds<C>(p, v, c, f, packed_rows, q_shift);
  // kHalfQK: this warp's Q rows to float16 (before the accumulators are live), q_inv joins the logits' scale below
  float q_inv = 1.f;
  if constexpr (C::kHalfQK) {
    if (f.kv_start < f.kv_end) {
      cp_async_wait<2 * C::kStages - 3>();  // (the loop's first wait: the item's Q rows land with its first K tile)
      q_inv = convert_q<C>(c);
    }
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
  // x = q.k (scaled at the exp) in the plain case; with a logits transform x is the final natural logit.
  float x_scale = variant::kTileLogits<typename C::Variant> ? kLog2e : p.sm_scale_log2;
  // (fp8 K/V with plain softmax logits: the item's factor of the k scale array folded in, kFoldKScale; lane 0 of the
  // warp wrote it in write_warp_bounds, before its __syncwarp)
  if constexpr (kFoldKScale<C>) x_scale *= __int_as_float(c.warp_ints()[kWKScale]);
  if constexpr (C::kHalfQK) x_scale *= q_inv;
  if constexpr (C::kPaged) {
    // Pages of tile STAGES-1, which the first iteration copies; past the item's end (cross-item), those of the next
    // item's first tile instead, which the copies after its epilogue (pages[] is not touched in between).
    const int key_ahead = TileOrder<C>::next(TileOrder<C>::first(f.kv_start, f.kv_end), C::kStages - 1);
    if (TileOrder<C>::has(key_ahead, f.kv_start, f.kv_end)) {
      ld.read_pages(key_ahead, f.kv_base, f.kv_end, pages);
    } else if (XI && has_next) {
      ld.read_first_pages(slot + 1, pages);
    }
  }
  CUINFER_PREFILL_TRACE_STAMP(1);
  // The variant's per-row state (an ALiBi slope, ...): once per item, not per KV tile.
  typename C::Variant::RowState rows[MMA_Q][2];
  row_states<C>(p, v, c, f.row0, q_shift, f.kvh, f.b, f.kv_len, rows);
  kv_loop<C>(p, v, c, ld, f.kv_start, f.kv_end, stage, pages, o, row_max, row_sum, x_scale, rows);
  if constexpr (C::kConvert) item = lds_volatile(c.warp_ints() + kWItem);
  if constexpr (C::kKV8) finish_fp8_o<C>(c, o);
  CUINFER_PREFILL_TRACE_STAMP(3);
  if constexpr (XI) {
    const int e_slot = (item - lds_volatile(c.sched())) % C::kTableItems;
    epilogue_cross_item<C>(p, v, c, ld, item, e_slot, stage, pages, o, row_max, row_sum, x_scale);
  } else {
    epilogue_merge_warps<C>(p, v, c, item, o, row_max, row_sum, x_scale);
  }
  CUINFER_PREFILL_TRACE_END(C, c.tid, c.wg, c.cta, item, p);
}

}  // namespace prefill

// p: the plan's arrays, the tensors and the shapes (PrefillParams, cuinfer/prefill/specs.py); v: the variant's
// parameters (VariantParams, rendered with the variant by cuinfer/variants/render.py).
template <class C>
__global__ void __launch_bounds__(C::kBlockThreads) batch_prefill(const __grid_constant__ PrefillParams p,
                                                                  const __grid_constant__ VariantParams v) {
  extern __shared__ __align__(128) unsigned char smem_block[];
  prefill::Cta<C> c;
  c.init(smem_block);
  const prefill::Loader<C, PrefillParams> ld{p, c};
  // Work ranges: this CTA's own list, then items of the plan's shared tail (the pool) taken one at a time until it
  // runs dry, so the CTAs that run fast finish the work of those that run slow (docs/internals.md, "Dynamic tail").
  if constexpr (C::kTransforms) prefill::init_dim_states<C>(v, c);  // (visible after the barrier below)
  int* sched = c.sched();
  if (c.tid == 0) {
    sched[0] = plan::range_begin(p, c.cta), sched[1] = plan::range_end(p, c.cta);
    sched[2] = plan::range_begin(p, c.num_ctas), sched[3] = plan::range_end(p, c.num_ctas);
  }
  c.sync();
  int stage = 0;  // buffer of the next KV tile; runs on across items (the next item's first tile follows the last)
  for (;;) {
    for (int item = lds_volatile(sched); item < lds_volatile(sched + 1); ++item) {
      prefill::run_item<C>(p, v, c, ld, item, stage);
    }
    // Range done: take the next pool item (an empty range once the pool is dry, or when there is none).
    c.sync();  // every thread has read the old range
    if (c.tid == 0) {
      const int lo = sched[2], hi = sched[3];
      const int it = plan::take_pool_item(static_cast<int*>(p.pool_count), lo, hi);
      sched[0] = it, sched[1] = it < hi ? it + 1 : it;
    }
    c.sync();
    if (sched[0] >= sched[1]) break;
  }
  if (c.tid == 0 && sched[2] < sched[3]) plan::leave_pool(static_cast<int*>(p.pool_count), c.num_ctas);
}

}  // namespace cuinfer
