// Shared-memory barriers (mbarrier, sm_90) and the other synchronisation of warp-specialised kernels: a producer
// warpgroup fills pipeline stages, consumer warpgroups wait for them, compute, and hand the stages back.
//
// An mbarrier counts arrivals of its current phase; when the expected count is reached the phase completes and the
// next one starts. A waiter names the parity of the phase it waits for: stage s's n-th fill is phase n, so the
// consumer of fill n waits with parity n & 1, and a producer about to write fill n (n >= 1) waits for the consumers'
// release of fill n - 1 on the stage's "empty" barrier with parity (n - 1) & 1.
//
// cp.async writes reach shared memory through the generic proxy, wgmma reads it through the async proxy: either the
// writing thread fences the proxies (fence_proxy_async) once its copies have landed and before it arrives, or each
// consumer fences after its wait and before its wgmma reads the stage (the first keeps the fence off the consumers'
// path). TMA writes through the async proxy and needs neither.
#pragma once
#include "common/types.cuh"

namespace cuinfer {
namespace sm90 {

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}

// Arrives on `bar` once all of this thread's earlier cp.async copies have completed (the arrival is one of the
// barrier's expected count: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Arrives on `bar` (one of its expected count) and adds `bytes` to the transaction count its phase waits for: the
// bytes that TMA copies signalling `bar` will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// A TMA tensor map (CUtensorMap, encoded on the host by cuTensorMapEncodeTiled) passed by value as a
// __grid_constant__ kernel parameter.
struct alignas(64) TmaDesc {
  u64 opaque[16];
};

// TMA: the box at coordinates (c0, c1, c2) of the 3-d tensor `map` into shared memory at `dst`, completing on `bar`
// (its transaction count). The box lands in the map's swizzle.
__device__ __forceinline__ void tma_load_3d(u32 dst, const TmaDesc* map, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The same with a 4-D map (a paged cache: dim, head, slot, page).
__device__ __forceinline__ void tma_load_4d(u32 dst, const TmaDesc* map, u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}],"
      " [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Blocks until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Register budget of the calling warpgroup (every warp of it calls it): producers give registers back, consumers
// take them (a multiple of 8 in [24, 256]).
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (the other side of a named_barrier_sync).
__device__ __forceinline__ void named_barrier_arrive(u32 id, u32 threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace sm90
}  // namespace cuinfer
