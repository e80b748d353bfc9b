// 16-byte vector access: every global load/store of attention data goes through these so SASS shows LDG.E.128/STG.E.128.
#pragma once
#include "common/types.cuh"

namespace cuinfer {

// N elements of T packed in registers; sizeof(T) * N is 4, 8 or 16 bytes.
template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (sizeof(T) * N == 16) {
      *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(p);
    } else if constexpr (sizeof(T) * N == 8) {
      *reinterpret_cast<uint2*>(v) = *reinterpret_cast<const uint2*>(p);
    } else {
      static_assert(sizeof(T) * N == 4, "Vec is 4, 8 or 16 bytes");
      *reinterpret_cast<unsigned*>(v) = *reinterpret_cast<const unsigned*>(p);
    }
  }
  // Generic store: any address space (shared memory included).
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (sizeof(T) * N == 16) {
      *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(v);
    } else if constexpr (sizeof(T) * N == 8) {
      *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(v);
    } else {
      *reinterpret_cast<unsigned*>(p) = *reinterpret_cast<const unsigned*>(v);
    }
  }
  // Store to GLOBAL memory only (st.global: a shared-memory address faults with cudaErrorInvalidAddressSpace).
  // Storing a register array through a reinterpreted pointer was split into 32-bit STG.E by NVVM (seen in the merge
  // kernels' SASS); the PTX forms below always give STG.E.128 / STG.E.64.
  __device__ __forceinline__ void store_global(T* p) const {
    if constexpr (sizeof(T) * N == 16) {
      const uint4 r = *reinterpret_cast<const uint4*>(v);
      asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w) : "memory");
    } else if constexpr (sizeof(T) * N == 8) {
      const uint2 r = *reinterpret_cast<const uint2*>(v);
      asm volatile("st.global.v2.u32 [%0], {%1,%2};" ::"l"(p), "r"(r.x), "r"(r.y) : "memory");
    } else {
      *reinterpret_cast<unsigned*>(p) = *reinterpret_cast<const unsigned*>(v);
    }
  }
  // Read-only GLOBAL loads that skip L1 allocation for streamed data (ld.global.nc.L1::no_allocate).
  __device__ __forceinline__ void load_stream(const T* p) {
    static_assert(sizeof(T) * N == 16, "streamed loads are 16 bytes");
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    *reinterpret_cast<uint4*>(v) = r;
  }
};

// Number of T in one 16-byte vector.
template <typename T> constexpr int kVec16 = 16 / sizeof(T);

}  // namespace cuinfer
