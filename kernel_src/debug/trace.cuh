// Trace stamps for lab builds only (bench/lab/tune_sched.py builds the kernels with -DCUINFER_TRACE or
// -DCUINFER_DECODE_TRACE). In every shipped build each macro below expands to nothing.
//
// Prefill (CUINFER_TRACE): thread 0 of each CTA stamps every item's start and end (global ns timer) and the SM clock
// at its phases: 0 start, 1 loop start (table and prologue done), 2 first tile ready (after the first barrier), 3 loop
// end, 4 o stored, 5 end (next item's copies issued); 12 u64 per item where p.lse points (the trace build
// runs without lse).
// Decode (CUINFER_DECODE_TRACE): thread 0 of each CTA stamps its phases in kTraceWords u64 where p.lse points (the
// trace build runs without lse): 0 globaltimer at entry, 1 SM clock at entry, 2 after the prologue's copies are
// issued, 3 first tile landed, 4 last item's epilogue starts, 5 exit, 6 globaltimer at exit, 7 SM id, 8 work range
// loaded, 9 items loaded, 10 first tiles' offsets stored.
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace debug {

constexpr int kDecodeTraceWords = 16;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned sm_id() {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}

// Per-group stamps of the item in flight (shared memory, not registers: the accumulators fill the file).
template <int G> __device__ __forceinline__ unsigned long long* prefill_slots() {
  __shared__ unsigned long long slots[G][8];  // [0] start time, [1..6] clocks of phases 0..5
  return &slots[0][0];
}

}  // namespace debug
}  // namespace cuinfer

#ifdef CUINFER_TRACE
#define CUINFER_PREFILL_TRACE_BEGIN(C, tid, wg)                                         \
  do {                                                                                   \
    if ((tid) == 0) {                                                                    \
      unsigned long long* tr_ = cuinfer::debug::prefill_slots<C::kGroups>() + 8 * (wg); \
      tr_[0] = cuinfer::debug::global_ns(), tr_[1] = clock64(), tr_[3] = 0;             \
    }                                                                                    \
  } while (0)
#define CUINFER_PREFILL_TRACE_STAMP_AT(C, tid, wg, k)                                          \
  do {                                                                                          \
    if ((tid) == 0) cuinfer::debug::prefill_slots<C::kGroups>()[8 * (wg) + 1 + (k)] = clock64(); \
  } while (0)
#define CUINFER_PREFILL_TRACE_END(C, tid, wg, cta, item, p)                                      \
  do {                                                                                            \
    if ((tid) == 0) {                                                                             \
      const unsigned long long* tr_ = cuinfer::debug::prefill_slots<C::kGroups>() + 8 * (wg);    \
      auto* out_ = reinterpret_cast<unsigned long long*>(p.lse) + 12 * (item);                   \
      out_[0] = tr_[0], out_[1] = cuinfer::debug::global_ns(), out_[2] = (cta);                   \
      out_[3] = cuinfer::debug::sm_id();                                                          \
      for (int k_ = 0; k_ < 5; ++k_) out_[4 + k_] = tr_[1 + k_];                                  \
      out_[9] = clock64();                                                                        \
    }                                                                                             \
  } while (0)
#else
#define CUINFER_PREFILL_TRACE_BEGIN(C, tid, wg) ((void)0)
#define CUINFER_PREFILL_TRACE_STAMP_AT(C, tid, wg, k) ((void)0)
#define CUINFER_PREFILL_TRACE_END(C, tid, wg, cta, item, p) ((void)0)
#endif
// The stamp of phase k in code where the CTA is `c` (a prefill::Cta).
#define CUINFER_PREFILL_TRACE_STAMP(k) CUINFER_PREFILL_TRACE_STAMP_AT(C, c.tid, c.wg, k)

#ifdef CUINFER_DECODE_TRACE
#define CUINFER_DECODE_WORD(k, value)                                                                            \
  do {                                                                                                            \
    if (threadIdx.x == 0)                                                                                         \
      reinterpret_cast<unsigned long long*>(p.lse)[blockIdx.x * cuinfer::debug::kDecodeTraceWords + (k)] = (value); \
  } while (0)
#define CUINFER_DECODE_STAMP(k) CUINFER_DECODE_WORD(k, clock64())
#define CUINFER_DECODE_GSTAMP(k) CUINFER_DECODE_WORD(k, cuinfer::debug::global_ns())
#define CUINFER_DECODE_SMID(k) CUINFER_DECODE_WORD(k, cuinfer::debug::sm_id())
#else
#define CUINFER_DECODE_STAMP(k) ((void)0)
#define CUINFER_DECODE_GSTAMP(k) ((void)0)
#define CUINFER_DECODE_SMID(k) ((void)0)
#endif

// SASS marks (tests only: tests/cpu/test_variant_kernels.py builds with -DCUINFER_SASS_MARKS): the tensor-core decode
// kernel's per-tile work (K / V transforms, S, softmax, P·V; not the item's first-tile q load nor its epilogue) lies
// between a read of %globaltimer_lo (begin) and one of %globaltimer_hi (end), so a test can count what one K tile
// costs from the SASS alone. In every shipped build both expand to nothing.
#ifdef CUINFER_SASS_MARKS
#define CUINFER_SASS_MARK_(reg)                                 \
  do {                                                          \
    unsigned mk_;                                               \
    asm volatile("mov.u32 %0, %%" #reg ";" : "=r"(mk_)); \
    if (mk_ == 12345u) __trap();                                \
  } while (0)
#define CUINFER_DECODE_TILE_BEGIN() CUINFER_SASS_MARK_(globaltimer_lo)
#define CUINFER_DECODE_TILE_END() CUINFER_SASS_MARK_(globaltimer_hi)
#else
#define CUINFER_DECODE_TILE_BEGIN() \
  do {                              \
  } while (0)
#define CUINFER_DECODE_TILE_END() \
  do {                            \
  } while (0)
#endif
