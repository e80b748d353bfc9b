// packbits / segment_packbits: bool arrays (one byte per element, any nonzero byte = 1) packed eight to a byte, bit
// k of output byte i being element 8i + k ("little", kBig = false) or element 8i + 7 - k ("big"), as numpy.packbits.
//
// packbits: a warp packs 4096 elements at a time: 8 rounds of coalesced 16-byte loads (lane L, round i reads
// elements 16(32i + L) ..), each 16 bytes becoming 2 output bytes staged in shared memory, then one 16-byte store
// per lane. The tail (and an input not 16-byte aligned) takes the per-byte path.
// segment_packbits: segment s (elements indptr[s] .. indptr[s+1]) packs into bytes new_indptr[s] .. new_indptr[s+1],
// the last byte padded with zeros; a warp per 512 output bytes of a segment (below).
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

// segment_packbits: a warp per work item, an item being up to 512 output bytes (4096 elements) of one segment: item
// w of segment s (chunk_ptr[s] <= w < chunk_ptr[s + 1], a binary search per item) packs elements a = indptr[s] +
// 4096 c .. (c = w - chunk_ptr[s]) into bytes new_indptr[s] + 512 c ... The warp reads the aligned 16-byte words that
// cover the item with coalesced loads (9 rounds, lane L of round i reading word 32 i + L), turns each word into a
// 16-bit mask of its nonzero bytes in shared memory, and lane g takes the 128-bit run of mask bits that starts at
// element a + 128 g (a funnel shift by a's offset in its word), zeroes the bits past the segment, and stages its 16
// output bytes; the warp then stores them: 16 bytes a lane when the item is whole (512 bytes) and starts on 16 bytes
// (every item but a segment's last when segments pack to multiples of 16 bytes), else coalesced byte stores through
// shared memory (an item's output offset has no alignment). Words partly outside x are read byte by byte (never a
// read outside x).
constexpr int kSegWords = 9 * 32;  // 16-byte words a warp reads per item: 4096 elements from any offset in a word

__device__ __forceinline__ u32 mask16(uint4 v) {
  return pack8<false>(v.x | static_cast<u64>(v.y) << 32) | pack8<false>(v.z | static_cast<u64>(v.w) << 32) << 8;
}

// The 16-byte word at wp, partly outside x[0 .. n): its bytes inside x as 0 / 1, zero outside (the first or last
// word of an input that does not start or end on 16 bytes).
__device__ __forceinline__ uint4 edge_word(const u8* x, i64 n, const u8* wp) {
  u64 lo = 0, hi = 0;
#pragma unroll 1
  for (int e = 0; e < 16; ++e) {
    const u64 bit = wp + e >= x && wp + e < x + n && __ldg(wp + e) != 0;
    if (e < 8) lo |= bit << (8 * e);
    else hi |= bit << (8 * (e - 8));
  }
  return make_uint4(static_cast<u32>(lo), static_cast<u32>(lo >> 32), static_cast<u32>(hi), static_cast<u32>(hi >> 32));
}

template <bool kBig>
__global__ void __launch_bounds__(kThreads, 4) segment_packbits(const __grid_constant__ PackParams p) {
  __shared__ alignas(16) unsigned short masks[kThreads / 32][kSegWords];
  __shared__ alignas(16) u8 staged[kThreads / 32][512];
  const u8* x = static_cast<const u8*>(p.x);
  u8* out = static_cast<u8*>(p.out);
  const int* indptr = static_cast<const int*>(p.indptr);
  const int* new_indptr = static_cast<const int*>(p.new_indptr);
  const int* chunk_ptr = static_cast<const int*>(p.chunk_ptr);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int items = __ldg(chunk_ptr + p.num_segments);
  for (int w = blockIdx.x * (kThreads / 32) + warp; w < items; w += gridDim.x * (kThreads / 32)) {
    int lo = 0, hi = p.num_segments;  // the last segment s with chunk_ptr[s] <= w (empty segments are passed over)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (__ldg(chunk_ptr + mid) <= w) lo = mid;
      else hi = mid;
    }
    const int c = w - __ldg(chunk_ptr + lo);
    const i64 a = static_cast<i64>(__ldg(indptr + lo)) + 4096ll * c;               // first element of the item
    const int count = static_cast<int>(min(static_cast<i64>(4096), __ldg(indptr + lo + 1) - a));  // elements
    const i64 o = static_cast<i64>(__ldg(new_indptr + lo)) + 512ll * c;           // first output byte
    const unsigned long long first = reinterpret_cast<unsigned long long>(x + a);
    const int sh = static_cast<int>(first & 15);
    const u8* aw = x + a - sh;  // the aligned word holding element a
    const int words = (sh + count + 15) >> 4;
    uint4 v[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) {
      const int k = 32 * i + lane;
      const u8* wp = aw + 16 * k;
      v[i] = make_uint4(0, 0, 0, 0);
      if (k < words) {
        if (wp >= x && wp + 16 <= x + p.n) {
          v[i] = __ldg(reinterpret_cast<const uint4*>(wp));
        } else {
          v[i] = edge_word(x, p.n, wp);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 9; ++i) masks[warp][32 * i + lane] = static_cast<unsigned short>(mask16(v[i]));
    __syncwarp();
    // lane g: mask bits sh + 128 g .. + 127, i.e. u16 masks 8 g .. 8 g + 8
    const uint4 m = reinterpret_cast<const uint4*>(masks[warp])[lane];
    const u32 m4 = masks[warp][8 * lane + 8];  // lane 31: word 256, the 257th of an item that starts mid-word
    const u32 mw[5] = {m.x, m.y, m.z, m.w, m4};
    u32 ob[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      u32 b = __funnelshift_r(mw[i], mw[i + 1], sh);
      const int left = count - 128 * lane - 32 * i;  // elements of the segment from bit 0 of this word on
      b = left >= 32 ? b : left <= 0 ? 0u : b & ((1u << left) - 1);
      ob[i] = kBig ? __byte_perm(__brev(b), 0, 0x0123) : b;  // big: each byte's bits reversed
    }
    const int bytes = (count + 7) >> 3;
    const uint4 packed = make_uint4(ob[0], ob[1], ob[2], ob[3]);
    if (((reinterpret_cast<unsigned long long>(out + o) & 15) == 0) & (bytes == 512)) {  // warp-uniform
      *reinterpret_cast<uint4*>(out + o + 16 * lane) = packed;  // a whole aligned item: 16-byte stores
      __syncwarp();  // every lane has read its masks before the next item overwrites them
      continue;
    }
    reinterpret_cast<uint4*>(staged[warp])[lane] = packed;
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int j = 32 * r + lane;
      if (j < bytes) out[o + j] = staged[warp][j];
    }
    __syncwarp();
  }
}

}  // namespace bits
}  // namespace cuinfer
