// Compile-time configuration of one FA2-class prefill specialisation (cuinfer/prefill/policy.py picks it) and the
// shared-memory map of one CTA of the plan.
#pragma once
#include "common/fp8.cuh"
#include "common/types.cuh"
#include "kv/paged.cuh"
#include "kv/ragged.cuh"
#include "variants/contract.cuh"

namespace cuinfer {

// Variant_: the attention variant (variants/contract.cuh), rendered by cuinfer/variants/render.py.
// DTypeQ_: q's type, K/V's by default (fp16 or bf16); fp8 K/V (DTypeKV_ = __nv_fp8_e4m3 / e5m2) take a 16-bit q and
// are converted to q's type (common/fp8.cuh): CONVERT_ false, each warp converts the fragments it reads, in registers
// (mainloop.cuh qk_tile_fp8 / pv_tile_fp8); CONVERT_ true, the CTA converts each landed K / V tile once into a 16-bit
// tile (kernel.cuh convert_tile), which the 16-bit math reads: one conversion per element instead of one per warp
// reading it, for the 16-bit tiles' shared memory (each thread converts the chunks it copied, between its own
// cp.async wait and the tile's barrier: no barrier of its own; cuinfer/prefill/policy.py chooses).
template <typename DTypeKV_, typename DTypeO_, int HEAD_DIM_QK_, int HEAD_DIM_VO_, int TILE_Q_, int WARPS_Q_,
          int WARPS_KV_, int MMA_KV_, int STAGES_, bool PAGED_, class Variant_, int GROUPS_, typename DTypeQ_ = DTypeKV_,
          bool CONVERT_ = false>
struct PrefillTraits {
  using DTypeQ = DTypeQ_;  // the mma operand type: q's, and k / v's once converted
  using DTypeKV = DTypeKV_;
  using DTypeO = DTypeO_;
  using Variant = Variant_;
  using KV = typename Select<PAGED_, kv::Paged, kv::Ragged>::type;
  static constexpr int kHeadDimQK = HEAD_DIM_QK_;
  static constexpr int kHeadDimVO = HEAD_DIM_VO_;
  static constexpr int kTileQ = TILE_Q_;
  static constexpr int kWarpsQ = WARPS_Q_;
  static constexpr int kWarpsKV = WARPS_KV_;
  static constexpr int kMmaKV = MMA_KV_;
  static constexpr int kStages = STAGES_;
  static constexpr bool kPaged = PAGED_;

  static constexpr int kThreads = 32 * kWarpsQ * kWarpsKV;
  static constexpr int kMmaQ = kTileQ / (16 * kWarpsQ);
  static constexpr int kTileKV = 16 * kMmaKV * kWarpsKV;
  static constexpr int kQBytesPerElem = sizeof(DTypeQ);
  static constexpr int kKVBytesPerElem = sizeof(DTypeKV);
  static constexpr bool kKV8 = kKVBytesPerElem == 1;  // fp8 K/V
  static constexpr int kChunksQK = kHeadDimQK * kQBytesPerElem / 16;  // 16-byte chunks per row of Q (and 16-bit K)
  static constexpr int kChunksK = kHeadDimQK * kKVBytesPerElem / 16;  // ... of K
  static constexpr int kChunksVO = kHeadDimVO * kKVBytesPerElem / 16;  // ... of V
  static constexpr bool kConvert = kKV8 && CONVERT_;  // fp8 tiles converted to 16-bit tiles by the CTA
  // The operand type of P·V: q's, or float16 with bf16 q when the CTA converts fp8 V (kConvert) and P holds softmax
  // probabilities, where fp8 -> float16 is cheaper than fp8 -> bfloat16: on sm_89+ (cvt.rn.f16x2.{e4m3,e5m2}x2, one
  // conversion per pair instead of a byte permute, three logic ops and an HFMA2) and for e5m2 anywhere (a byte permute
  // alone). Exact for V (every finite fp8 value is a float16); P = 2^(x - m) <= 2^kRescaleSlack (mainloop.cuh) rounds
  // to float16's 11 significant bits instead of bfloat16's 8, and p < 2^-24 (relative to the row's largest, >= 1)
  // flushes to 0 (float16 subnormals below 2^-14 keep an absolute error <= 2^-25): docs/fp8.md.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static constexpr bool kHalfPV = kConvert && is_same<DTypeQ, __nv_bfloat16>::value && Variant::kSoftmax &&
                                  is_same<DTypeKV, __nv_fp8_e5m2>::value;
#else
  static constexpr bool kHalfPV = kConvert && is_same<DTypeQ, __nv_bfloat16>::value && Variant::kSoftmax;
#endif
  using DTypePV = typename Select<kHalfPV, half, DTypeQ>::type;
  // 16-byte chunks per row of the V tile P·V reads: fp8 V (converted by each warp) or 16-bit V
  static constexpr int kChunksVMma = kKV8 && !kConvert ? kChunksVO : kHeadDimVO * kQBytesPerElem / 16;
  static constexpr int kRowsPerPass = kThreads / 8;  // global -> smem copies of Q: 8 threads per row, a 128-byte line
  // K / V copies: 8 threads per row as well, or 4 for 64-byte rows (fp8 head dim 64: two rows per 128-byte line)
  // and 4 for fp8 head dim 128 converted by the CTA (kKVPairRows: each thread copies chunks t and t + 4 of its rows,
  // so a thread has half the rows of 8 threads per row: half the page-table lookups and copy address arithmetic per
  // tile; the warp's 8 rows are ordered so that the lanes of a phase take rows whose swizzles differ in bit 2: cta.cuh)
  static constexpr bool kKVPairRows = kKV8 && CONVERT_ && kChunksK == 8;
  static constexpr int kKVThreadsPerRow = kChunksK < 8 ? kChunksK : (kKVPairRows ? 4 : 8);
  static constexpr int kKVRowsPerPass = kThreads / kKVThreadsPerRow;
  static constexpr int kKVRowsPerThread = kTileKV / kKVRowsPerPass;
  static constexpr int kQRowsPerThread = (kTileQ + kRowsPerPass - 1) / kRowsPerPass;

  static constexpr int kQBytes = kTileQ * kHeadDimQK * kQBytesPerElem;
  static constexpr int kKBytes = kTileKV * kHeadDimQK * kKVBytesPerElem;
  static constexpr int kVBytes = kTileKV * kHeadDimVO * kKVBytesPerElem;
  static constexpr int kKOff = kQBytes;
  static constexpr int kVOff = kKOff + kStages * kKBytes;
  // kConvert: the 16-bit K and V tiles (one each: converted after a tile lands, read before the next one lands)
  static constexpr int kK16Off = kVOff + kStages * kVBytes;
  static constexpr int kK16Bytes = kConvert ? kTileKV * kHeadDimQK * kQBytesPerElem : 0;
  static constexpr int kV16Off = kK16Off + kK16Bytes;
  static constexpr int kV16Bytes = kConvert ? kTileKV * kHeadDimVO * kQBytesPerElem : 0;
  static constexpr int kPageOff = kV16Off + kV16Bytes;
  static constexpr int kPageBytes = kPaged ? kThreads * kKVRowsPerThread * 8 : 0;
  static constexpr int kMainBytes = kPageOff + kPageBytes;
  // Cross-item pipeline (kernel.cuh): one warp per row block, so the epilogue needs no cross-warp merge.
  static constexpr bool kCrossItem = kWarpsKV == 1;
  // Epilogue staging (WARPS_KV > 1 only; overlays everything): fp32 o rows padded by 8 floats (conflict-free float2
  // stores), then (m, d).
  static constexpr int kEpiPitch = kHeadDimVO + 8;
  static constexpr int kEpiOBytes = kCrossItem ? 0 : kWarpsKV * kTileQ * kEpiPitch * 4;
  static constexpr int kEpiBytes = kCrossItem ? 0 : kEpiOBytes + kWarpsKV * kTileQ * 2 * 4;
  // Item facts used only occasionally inside the KV loop (copy addresses, boundary masks) live in smem, not in
  // registers, which the accumulators fill: kInfoInts per item + kWarpInts per warp, after everything else.
  static constexpr int kInfoInts = 12;  // [0..6] the item's facts (ItemInfo), [8..11] the work ranges (sched)
  // a warp's bounds and its own copy of the copy facts (WarpField); kConvert: 12, for kWItem (16-byte aligned rows)
  static constexpr int kWarpInts = kConvert ? 12 : 8;
  static constexpr int kInfoOff = kMainBytes > kEpiBytes ? kMainBytes : kEpiBytes;
  // Cross-item: the resolved facts of up to kTableItems consecutive items of this CTA, kTableFields ints each
  // (16: d256 paged 64-row tiles still fit a 100 KB-smem GPU).
  static constexpr int kTableItems = 16;
  // Staged epilogue (cross-item, sm_90+): each warp writes its normalised o rows into its own rows of the Q buffer
  // with stmatrix and reads them back as 16-byte row pieces for the stores (in place of an in-register quad
  // transpose: ~250 fewer instructions per thread and item). Each warp then also copies only its own Q rows, so no
  // warp's next-item Q copy lands in rows another warp is still staging in.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr bool kStagedEpi = false;
#else
  static constexpr bool kStagedEpi = kCrossItem && kHeadDimVO <= kHeadDimQK;
#endif
  // fp8 K/V converted by the CTA with bf16 q and plain softmax logits (the k scale folded into x_scale, kernel.cuh
  // kFoldKScale), sm_90+ staged-epilogue tiles (each warp copies its own Q rows): Q·K^T runs in float16 too. Each warp
  // converts its Q rows once per item to float16 times the power of two that puts their largest |q| in [2^14, 2^15)
  // (kernel.cuh convert_q; its inverse joins the logits' scale x_scale) and K is converted to float16 (one
  // cvt.rn.f16x2.e4m3x2 per pair, where bfloat16 takes a byte permute, three logic ops and an HFMA2.BF16). Exact for
  // K; q is exact within 2^28 of the warp's largest |q| (bfloat16's 8 significant bits), smaller ones keep an absolute
  // error <= 2^-25 of the scaled value (2^-39 of that largest |q|): docs/fp8.md.
  static constexpr bool kHalfQK = kStagedEpi && kConvert && is_same<DTypeQ, __nv_bfloat16>::value &&
                                  Variant::kSoftmax && !variant::kTileLogits<Variant>;
  using DTypeQK = typename Select<kHalfQK, half, DTypeQ>::type;  // the operand type of Q·K^T
  static constexpr int kTableFields = 10;
  // The order of an item's KV tiles (loader.cuh TileOrder): descending keys for a softmax whose logits climb along the
  // keys (Variant.rising_logits: ALiBi, toward the diagonal), so that a warp's first tile holds its largest logits and
  // the reference max of the max-free softmax (mainloop.cuh) holds on the tiles after it; ascending for every other
  // variant. The result does not depend on the order (the online softmax is exact either way).
  static constexpr bool kBackwardTiles = Variant::kRisingLogits && Variant::kSoftmax;
  static constexpr int kTableOff = kInfoOff + (kInfoInts + kWarpInts * kWarpsQ * kWarpsKV) * 4;
  // q / k transforms (RoPE, transform.cuh): each thread's DimStates of its 8 dimension pairs, computed once, kept in
  // smem (the registers are taken by the accumulators), kDimStateBytes each.
  static constexpr bool kTransforms = Variant::kQueryTransform || Variant::kKeyTransform;
  static constexpr int kDimStateBytes = 8;
  static constexpr int kStatesOff = kTableOff + (kCrossItem ? kTableItems * kTableFields * 4 : 0);
  // The variant's row states (row_state, e.g. ALiBi's slope): computed once per item into shared memory and read back
  // on every KV tile (mainloop.cuh row_states / logits_and_mask) instead of held in registers across the KV loop,
  // where ALiBi's four slopes a thread spilled the paged 128 x 64 tile. kRowStateBytes per row, (mq, h) of thread t
  // at slot (2 mq + h) * kThreads + t; larger states stay in registers (the space is reserved either way).
  static constexpr int kRowStateBytes = 16;
  static constexpr bool kRowStateSmem =
      Variant::kRowState && sizeof(typename Variant::RowState) <= kRowStateBytes;
  static constexpr int kRowsOff = kStatesOff + (kTransforms ? kThreads * 8 * kDimStateBytes : 0);
  static constexpr int kSmemBytes = kRowsOff + (Variant::kRowState ? kThreads * kMmaQ * 2 * kRowStateBytes : 0);
  // Paired blocks (GROUPS = 2, cross-item tiles only): two groups of kThreads per block, each one CTA of the plan
  // with kSmemBytes of its own at a 128-byte aligned offset (see Cta in cta.cuh).
  static constexpr int kGroups = GROUPS_;
  static constexpr int kBlockThreads = kGroups * kThreads;
  static constexpr int kGroupBytes = (kSmemBytes + 127) / 128 * 128;

  static_assert(is_same<DTypeQ, half>::value || is_same<DTypeQ, __nv_bfloat16>::value, "q is fp16 or bf16");
  static_assert(is_same<DTypeKV, DTypeQ>::value || fp8::IsFp8<DTypeKV>::value, "k/v are q's type or fp8");
  static_assert(!kKV8 || (kHeadDimQK == kHeadDimVO && kChunksVO == kKVThreadsPerRow * (kChunksVO / kKVThreadsPerRow)),
                "fp8 K/V: one head dim for K and V (64, 128 or 256)");
  static_assert(!(kKV8 && (Variant::kKeyTransform || Variant::kValueTransform)),
                "key / value transforms of fp8 K / V tiles (in shared memory) are not supported");
  static_assert(sizeof(DTypeO) == 2, "o is fp16 or bf16 (16-bit output stores)");
  static_assert(kTileQ % (16 * kWarpsQ) == 0 && kMmaQ >= 1, "TILE_Q must be a multiple of 16 * WARPS_Q");
  static_assert(kHeadDimQK % 64 == 0 && kHeadDimVO % 64 == 0, "head dims are multiples of 64 (swizzle)");
  static_assert(kTileKV % kKVRowsPerPass == 0, "TILE_KV must be a multiple of the K/V rows copied per pass");
  static_assert(kStages >= 2, "the pipeline refills the buffer of the previous tile: at least 2 stages");
  static_assert(kHeadDimVO % 8 == 0, "epilogue writes 8 elements per thread");
  static_assert(kTableItems <= kThreads, "the item table is filled one item per thread");
  static_assert(kGroups == 1 || (kGroups == 2 && kCrossItem), "paired blocks run cross-item tiles (WARPS_KV == 1)");
  static_assert(sizeof(typename Variant::DimState) <= kDimStateBytes, "a variant's DimState holds at most 8 bytes");
};

}  // namespace cuinfer
