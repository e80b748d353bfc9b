// Hopper (sm_90a) batch prefill on ragged K / V or a paged cache: wgmma tensor cores, TMA copies and warp specialisation, assembled
// from its pieces: the work unit and shared-memory layout (unit.cuh), the producer warpgroup (producer.cuh) and the
// two consumer warpgroups (consumer.cuh), through the attention-variant contract (variants/contract.cuh; softmax
// variants of logits, key ranges and masks) and the plan format (plan/work.cuh).
//
// Persistent CTAs of 384 threads, one per SM: the producer (56 registers after setmaxnreg; 88 with fp8 K / V, which it
// converts) and two consumers (224; 208), which together fill the block's 384 x 168 (unit.cuh).
// The producer runs ahead across items: it loads the next item's Q once the consumers release Q (q_empty, after
// their last Q·K^T of the item) and keeps the K / V ring's stage count running across items.
#pragma once
#include "attention/prefill_sm90/consumer.cuh"
#include "attention/prefill_sm90/producer.cuh"
#include "attention/prefill_sm90/unit.cuh"
#include "debug/sm90_probe.cuh"

namespace cuinfer {

// p: the plan's arrays, the tensors and the shapes (PrefillParams, cuinfer/prefill/specs.py); v: the variant's
// parameters; tm_q, tm_k, tm_v: TMA maps of q, k and v as [tokens, heads, 128] with 64 x 1 x 128 boxes and the
// 128-byte swizzle (cuinfer/prefill/sm90.py; PAGED: k and v are a paged cache, read by page table, their maps unused;
// fp8 K / V: byte maps of K / V with STAGE_TMA, unused without).
// KVT: K / V's element type, T or fp8 (__nv_fp8_e4m3, __nv_fp8_e5m2: staged and converted to float16 by the
// producer; the MMAs then run in float16, bfloat16 q converted per row by the consumers: consumer.cuh).
// STAGE_TMA (fp8 only; every ragged fp8 kernel, and a paged cache whose page size is a multiple of 16): the staging
// copies are TMA boxes issued by the producer's warp 0 and converted by its warps 1-3 (producer.cuh
// produce_fp8_unit_tma), the staging slots' barriers after the item broadcast.
// MAX_FREE: the consumers' max-free softmax of scaled logits (consumer.cuh softmax_tile; the host picks it for a
// chain whose only logits piece has logits_scale c with c log2(e) <= 79, bfloat16 q and K / V).
template <class T, int HEAD_DIM, bool PAGED, class KVT, bool STAGE_TMA = false, bool MAX_FREE = false>
__global__ void __launch_bounds__(prefill_sm90::kThreads, 1)
    batch_prefill_sm90(const __grid_constant__ PrefillParams p, const __grid_constant__ VariantParams v,
                       const __grid_constant__ sm90::TmaDesc tm_q, const __grid_constant__ sm90::TmaDesc tm_k,
                       const __grid_constant__ sm90::TmaDesc tm_v) {
  using namespace prefill_sm90;
  using V = Variant;
  using KV = typename Select<PAGED, kv::Paged, kv::Ragged>::type;
  static_assert(V::kSoftmax && !V::kQueryTransform && !V::kKeyTransform && !V::kValueTransform && !V::kSink &&
                    !V::kOutputTransform,
                "the sm90 prefill kernel runs softmax variants of logits, key ranges and masks");
  using S = Shape<HEAD_DIM>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 raw = mma::smem_addr(smem_raw);
  const u32 sq = (raw + 1023u) & ~1023u;
  const u32 sk = sq + S::kQBytes;                  // stage s: sk + s * kTileBytes
  const u32 sv = sk + kStages * S::kTileBytes;     // stage s: sv + s * kTileBytes
  constexpr bool kFp8 = fp8::IsFp8<KVT>::value;
  using TM = typename Select<kFp8, half, T>::type;  // the MMAs' operand type
  static_assert(!STAGE_TMA || kFp8, "TMA staging is the fp8 kernels'");
  static_assert(!kFp8 || PAGED || STAGE_TMA, "ragged fp8 K / V is staged by TMA");
  const u32 s8 = sv + kStages * S::kTileBytes;     // fp8: the staging ring (K stages, then V stages)
  const Bars bars{s8 + (kFp8 ? 2 * kStages * kFp8TileBytes : 0)};
  Unit* slot = reinterpret_cast<Unit*>(smem_raw + (bars.end() - raw));
  int* bcast = reinterpret_cast<int*>(smem_raw + (bars.end() + 64 - raw));
  const u32 staged = bars.end() + 80;  // (STAGE_TMA: the staging slots' barriers, StagedBars)
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    sm90::mbar_init(bars.q_full(), 1);
    sm90::mbar_init(bars.q_empty(), 256);
    for (int s = 0; s < kStages; ++s) {
      // (paged or fp8: every producer thread arrives, on its cp.async copies or after its conversion)
      // (fp8 staged by TMA: the 96 converters, producer.cuh)
      sm90::mbar_init(bars.k_full(s), STAGE_TMA ? kConverters : PAGED || kFp8 ? 128 : 1);
      sm90::mbar_init(bars.v_full(s), STAGE_TMA ? kConverters : PAGED || kFp8 ? 128 : 1);
      sm90::mbar_init(bars.k_empty(s), 256);
      sm90::mbar_init(bars.v_empty(s), 256);
      if constexpr (STAGE_TMA) {
        const StagedBars st{staged};
        sm90::mbar_init(st.k_full(s), 1);
        sm90::mbar_init(st.v_full(s), 1);
        sm90::mbar_init(st.k_empty(s), kConverters);
        sm90::mbar_init(st.v_empty(s), kConverters);
      }
    }
  }
  SM90_PROBE_INIT();
  __syncthreads();
  SM90_PROBE_START(probe_t0);
  if (wg == 0) {
    sm90::setmaxnreg_dec<kFp8 ? kProducerRegsFp8 : kProducerRegs>();
    produce<T, TM, KVT, STAGE_TMA, V, KV>(p, v, bars, sq, sk, sv, s8, staged, slot, bcast, &tm_q, &tm_k, &tm_v, tid);
    SM90_PROBE_STOP(probe_t0, 0);
    SM90_PROBE_FLUSH();
    return;
  }
  sm90::setmaxnreg_inc<kFp8 ? kConsumerRegsFp8 : kConsumerRegs>();
  consume<T, TM, KVT, V, PAGED || kFp8, MAX_FREE>(p, v, bars, sq, sk, sv, slot, wg - 1, tid);
  SM90_PROBE_STOP(probe_t0, 0);
  SM90_PROBE_FLUSH();
}

}  // namespace cuinfer
