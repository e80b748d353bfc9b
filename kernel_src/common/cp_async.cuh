// Asynchronous global -> shared copies (cp.async, sm_80+): the memory pipeline of every streaming kernel.
//
// A thread issues 16-byte copies, closes them into a group with cp_async_commit(), and later waits until at most N of
// its groups are still in flight with cp_async_wait<N>(). Groups complete in order, so a kernel that commits exactly
// one group per pipeline stage (an empty group when it has nothing to copy) knows which stage has landed from the
// count alone. The wait only covers the calling thread's own copies: a __syncthreads() after it makes every thread's
// copies visible to the whole block.
#pragma once
#include "common/types.cuh"

namespace cuinfer {

__device__ __forceinline__ u32 cp_async_smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16 bytes from global `src` to shared `dst`, bypassing L1 (.cg: streamed data is read once). When `valid` is false
// no byte is read and the 16 destination bytes are zero-filled (src-size 0), so a tile past the end of a range holds
// zeros, never stale data that could turn into NaN; `src` must still be a mapped address (pass the tensor's base).
// L2::128B asks the L2 to fetch the whole 128-byte line, which the neighbouring lanes read next.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const u32 n = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(cp_async_smem_addr(dst)), "l"(src),
               "r"(n)
               : "memory");
}

// L2 access policies (createpolicy, sm_80+) for cp_async_16 below. Evict-first marks every line it brings in as first
// to be evicted: data streamed once (a decode kernel's K/V) then replaces its own earlier lines rather than what else
// the L2 holds, lines other kernels read again or dirty lines, whose write-back would otherwise compete with the
// stream for DRAM bandwidth inside this kernel. Evict-normal is the L2's default, as an explicit policy.
__device__ __forceinline__ u64 l2_evict_first_policy() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ u64 l2_evict_normal_policy() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// cp_async_16 with an L2 cache policy (l2_evict_first_policy(), l2_evict_normal_policy()).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid, u64 policy) {
  const u32 n = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(
                   cp_async_smem_addr(dst)),
               "l"(src), "r"(n), "l"(policy)
               : "memory");
}

// The same copy to a 32-bit shared-window address (what ldmatrix takes; the prefill kernel keeps its tile addresses
// in this form).
__device__ __forceinline__ void cp_async_16(u32 smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}

// Ask the L2 to fetch the 128-byte line holding `addr` (no register result, nothing to wait for).
__device__ __forceinline__ void prefetch_l2(const void* addr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(addr));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Commits this thread's uncommitted copies as a group, then waits for all of its groups.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace cuinfer
