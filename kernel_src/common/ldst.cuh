// Loads with a say over what the compiler may do with them: kernels whose registers are all taken by accumulators
// re-read rarely used values instead of keeping them live across a loop.
#pragma once
#include "common/types.cuh"

namespace cuinfer {

__device__ __forceinline__ int ldg_i32(const int* p) { return __ldg(p); }

// A shared-memory int read where it is used (not kept in a register across the loop around it).
__device__ __forceinline__ int lds_volatile(const int* p) { return *static_cast<const volatile int*>(p); }

// A global load the compiler may not merge with an earlier one (re-read after a loop instead of kept live across it).
__device__ __forceinline__ int reload_i32(const void* p, int i) {
  int v;
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(static_cast<const int*>(p) + i));
  return v;
}

}  // namespace cuinfer
