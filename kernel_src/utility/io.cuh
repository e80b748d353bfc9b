// Global loads and stores of N elements (2, 4, 8 or 16 bytes) for the memory-bound utility kernels: the data is read
// once, so 16-byte loads skip L1 allocation (ld.global.nc.L1::no_allocate) and 16- / 8-byte stores go through
// st.global so the SASS shows STG.E.128 / STG.E.64 (vec.cuh). Narrower widths exist for rows whose alignment or
// rotary split allows no more (the host picks the widest that fits).
#pragma once
#include "common/vec.cuh"

namespace cuinfer {
namespace util {

// N elements of T, N * sizeof(T) in {2, 4, 8, 16}.
template <typename T, int N> struct Chunk {
  static constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16, "a chunk is 2, 4, 8 or 16 bytes");
  alignas(kBytes) T v[N];

  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }

  // Read-only load of data used once.
  __device__ __forceinline__ void load(const T* p) {
    if constexpr (kBytes == 16) {
      reinterpret_cast<Vec<T, N>*>(v)->load_stream(p);
    } else if constexpr (kBytes == 8) {
      *reinterpret_cast<uint2*>(v) = __ldg(reinterpret_cast<const uint2*>(p));
    } else if constexpr (kBytes == 4) {
      *reinterpret_cast<unsigned*>(v) = __ldg(reinterpret_cast<const unsigned*>(p));
    } else {
      *reinterpret_cast<unsigned short*>(v) = __ldg(reinterpret_cast<const unsigned short*>(p));
    }
  }

  // Store to global memory.
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (kBytes >= 8) {
      reinterpret_cast<const Vec<T, N>*>(v)->store_global(p);
    } else if constexpr (kBytes == 4) {
      *reinterpret_cast<unsigned*>(p) = *reinterpret_cast<const unsigned*>(v);
    } else {
      *reinterpret_cast<unsigned short*>(p) = *reinterpret_cast<const unsigned short*>(v);
    }
  }
};

}  // namespace util
}  // namespace cuinfer
