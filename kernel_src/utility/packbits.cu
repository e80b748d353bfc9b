// packbits / segment_packbits: bool arrays (one byte per element, any nonzero byte = 1) packed eight to a byte, bit
// k of output byte i being element 8i + k ("little", kBig = false) or element 8i + 7 - k ("big"), as numpy.packbits.
//
// packbits: a warp packs 4096 elements at a time: 8 rounds of coalesced 16-byte loads (lane L, round i reads
// elements 16(32i + L) ..), each 16 bytes becoming 2 output bytes staged in shared memory, then one 16-byte store
// per lane. The tail (and an input not 16-byte aligned) takes the per-byte path.
// segment_packbits: segment s (elements indptr[s] .. indptr[s+1]) packs into bytes new_indptr[s] .. new_indptr[s+1],
// the last byte padded with zeros; a thread per output byte finds its segment by binary search.
// The parameter struct PackParams comes from the generated preamble.
#include "common/types.cuh"

namespace cuinfer {
namespace bits {

constexpr int kThreads = 256;
constexpr int kWarpElems = 32 * 8 * 16;  // 4096 elements, 512 output bytes per warp round

// Eight bool bytes (element k in byte k of v) -> one packed byte.
template <bool kBig> __device__ __forceinline__ u32 pack8(u64 v) {
  v |= v >> 4;  // any nonzero bit of a byte reaches its bit 0 (bits shifted in from the next byte land above it)
  v |= v >> 2;
  v |= v >> 1;
  v &= 0x0101010101010101ull;
  // each byte's bit 0 multiplied onto its own bit of the top byte (no two products overlap, so no carries)
  return static_cast<u32>((v * (kBig ? 0x8040201008040201ull : 0x0102040810204080ull)) >> 56);
}

// Elements a .. a + count - 1 (count in 1..8) of x[0 .. n) as the bytes of a u64, zero above count. Aligned 8-byte
// words when they lie inside x, bytes otherwise (never a read outside x).
__device__ __forceinline__ u64 gather8(const u8* x, i64 n, i64 a, int count) {
  const int sh = static_cast<int>(reinterpret_cast<unsigned long long>(x + a) & 7);
  const u8* lo = x + a - sh;
  u64 v = 0;
  if (lo >= x && lo + (sh ? 16 : 8) <= x + n) {
    const u64 w0 = __ldg(reinterpret_cast<const unsigned long long*>(lo));
    v = w0;
    if (sh) v = (w0 >> (8 * sh)) | (__ldg(reinterpret_cast<const unsigned long long*>(lo + 8)) << (64 - 8 * sh));
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < count) v |= static_cast<u64>(__ldg(x + a + k)) << (8 * k);
  }
  return count < 8 ? v & ((1ull << (8 * count)) - 1) : v;
}

template <bool kBig>
__global__ void __launch_bounds__(kThreads) packbits(const __grid_constant__ PackParams p) {
  __shared__ alignas(16) unsigned short stage[kThreads / 32][256];
  const u8* x = static_cast<const u8*>(p.x);
  u8* out = static_cast<u8*>(p.out);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const i64 warps = static_cast<i64>(gridDim.x) * (kThreads / 32);
  const i64 first = static_cast<i64>(blockIdx.x) * (kThreads / 32) + warp;
  const bool aligned = ((reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(out)) & 15) == 0;
  const i64 full = aligned ? p.n / kWarpElems : 0;
  for (i64 c = first; c < full; c += warps) {
    uint4 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[i] = __ldg(reinterpret_cast<const uint4*>(x + c * kWarpElems) + 32 * i + lane);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const u32 b0 = pack8<kBig>(v[i].x | static_cast<u64>(v[i].y) << 32);
      const u32 b1 = pack8<kBig>(v[i].z | static_cast<u64>(v[i].w) << 32);
      stage[warp][32 * i + lane] = static_cast<unsigned short>(b0 | b1 << 8);
    }
    __syncwarp();
    const uint4 o = reinterpret_cast<const uint4*>(stage[warp])[lane];
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(out + c * (kWarpElems / 8) + 16 * lane), "r"(o.x),
                 "r"(o.y), "r"(o.z), "r"(o.w)
                 : "memory");
    __syncwarp();
  }
  // the rest, one output byte per thread
  const i64 out_bytes = (p.n + 7) / 8;
  for (i64 j = full * (kWarpElems / 8) + static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x; j < out_bytes;
       j += static_cast<i64>(gridDim.x) * kThreads) {
    const i64 a = 8 * j;
    out[j] = static_cast<u8>(pack8<kBig>(gather8(x, p.n, a, static_cast<int>(p.n - a < 8 ? p.n - a : 8))));
  }
}

template <bool kBig>
__global__ void __launch_bounds__(kThreads) segment_packbits(const __grid_constant__ PackParams p) {
  const u8* x = static_cast<const u8*>(p.x);
  u8* out = static_cast<u8*>(p.out);
  const int* indptr = static_cast<const int*>(p.indptr);
  const int* new_indptr = static_cast<const int*>(p.new_indptr);
  const int segments = p.num_segments;
  const i64 out_bytes = segments > 0 ? __ldg(new_indptr + segments) : 0;
  for (i64 j = static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x; j < out_bytes;
       j += static_cast<i64>(gridDim.x) * kThreads) {
    int lo = 0, hi = segments;  // the last segment s with new_indptr[s] <= j (empty segments are passed over)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (__ldg(new_indptr + mid) <= j) lo = mid;
      else hi = mid;
    }
    const i64 a = __ldg(indptr + lo) + 8 * (j - __ldg(new_indptr + lo));
    const i64 left = __ldg(indptr + lo + 1) - a;
    out[j] = static_cast<u8>(pack8<kBig>(gather8(x, p.n, a, static_cast<int>(left < 8 ? left : 8))));
  }
}

}  // namespace bits
}  // namespace cuinfer
