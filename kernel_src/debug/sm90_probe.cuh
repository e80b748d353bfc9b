// Cycle probe of the Hopper prefill kernel, for lab builds only (bench/lab/sm90_probe.py builds the kernel with
// -DCUINFER_SM90_PROBE); in every shipped build the macros below expand to nothing. Thread 0 of each warpgroup adds
// the SM clock cycles of its phases into 8 slots (shared memory), and writes them at its exit to the module's global
// cuinfer_sm90_probe[cta][warpgroup][8]. Producer slots: 0 total, 1 K stage (its empty wait and copies or
// conversion), 2 V stage, 3 cp.async waits (fp8), 4 fp8 K staging copies, 5 q_empty wait, 6 fp8 V staging copies,
// 7 fp8 TMA staging: the float16 stages' empty waits (then slots 1-3 and 7 are thread 32's, a converter: 3 the staging
// slots' full waits; 4 / 6 thread 0's K / V box issue with its slot's empty wait).
// Consumer slots: 0 total, 1 k_full wait, 2 v_full wait, 3 turn waits, 4 q_full wait, 5 softmax, 6 Q·K^T retire
// wait, 7 P·V retire wait.
//
// Bound probes (lab builds whose results are wrong by design, for timing only): -DCUINFER_SM90_PROBE_NO_CONVERT skips
// the producer's fp8 conversions (the stages keep what they held), -DCUINFER_SM90_PROBE_NO_STAGE its fp8 staging
// copies (the conversions read what the staging ring held): what the kernel would take without either.
#pragma once

#ifdef CUINFER_SM90_PROBE_NO_CONVERT
#define SM90_PROBE_CONVERT 0
#else
#define SM90_PROBE_CONVERT 1
#endif
#ifdef CUINFER_SM90_PROBE_NO_STAGE
#define SM90_PROBE_STAGE 0
#else
#define SM90_PROBE_STAGE 1
#endif

#ifdef CUINFER_SM90_PROBE
__device__ unsigned long long cuinfer_sm90_probe[4096 * 24];
namespace cuinfer {
namespace debug {
__device__ __forceinline__ unsigned long long* sm90_probe_slots() {
  __shared__ unsigned long long s[24];
  return s;
}
}  // namespace debug
}  // namespace cuinfer
#define SM90_PROBE_INIT()                                                    \
  do {                                                                       \
    if (threadIdx.x < 24) cuinfer::debug::sm90_probe_slots()[threadIdx.x] = 0; \
  } while (0)
#define SM90_PROBE_START(name) const long long name = clock64()
// Adds the cycles since SM90_PROBE_START(name) to slot k of thread t's warpgroup; SM90_PROBE_STOP records thread 0's
// (SM90_PROBE_STOP_BY: the fp8 TMA staging's converters, whose warpgroup's thread 0 only issues)
#define SM90_PROBE_STOP_BY(name, k, t)                                                           \
  do {                                                                                           \
    if (threadIdx.x % 128 == (t))                                                                \
      cuinfer::debug::sm90_probe_slots()[8 * (threadIdx.x / 128) + (k)] += clock64() - (name);    \
  } while (0)
#define SM90_PROBE_FLUSH()                                                                          \
  do {                                                                                              \
    if (threadIdx.x % 128 == 0) {                                                                   \
      for (int k_ = 0; k_ < 8; ++k_)                                                                \
        cuinfer_sm90_probe[(blockIdx.x * 3 + threadIdx.x / 128) * 8 + k_] =                        \
            cuinfer::debug::sm90_probe_slots()[8 * (threadIdx.x / 128) + k_];                       \
    }                                                                                               \
  } while (0)
#else
#define SM90_PROBE_INIT() \
  do {                    \
  } while (0)
#define SM90_PROBE_START(name) \
  do {                         \
  } while (0)
#define SM90_PROBE_STOP_BY(name, k, t) \
  do {                                 \
  } while (0)
#define SM90_PROBE_FLUSH() \
  do {                     \
  } while (0)
#endif
#define SM90_PROBE_STOP(name, k) SM90_PROBE_STOP_BY(name, k, 0)
