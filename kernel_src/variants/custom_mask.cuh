// A custom boolean mask per request: row-major [qo_len, kv_len] bits (True = keep), little-endian within each byte,
// request b's bits starting at byte p.mask_indptr[b] of p.mask (segment_packbits). Applied on every tile.
#pragma once
#include "variants/contract.cuh"

namespace cuinfer {
namespace variant {

struct CustomMask : Identity {
  static constexpr bool kMask = true;
  struct Row {
    i64 bit0;  // bit of (this row, key 0)
  };
  template <class P> __device__ __forceinline__ static Row row(const P& p, const Index& ix) {
    Row r;
    r.bit0 = static_cast<i64>(static_cast<const int*>(p.mask_indptr)[ix.batch]) * 8 +
             static_cast<i64>(ix.qo_idx) * ix.kv_len;
    return r;
  }
  template <class P> __device__ __forceinline__ static bool mask(const P& p, const Row& r, const Index&, int kv) {
    const i64 bit = r.bit0 + kv;
    const unsigned char byte = __ldg(static_cast<const unsigned char*>(p.mask) + (bit >> 3));
    return (byte >> (bit & 7)) & 1;
  }
};

}  // namespace variant
}  // namespace cuinfer
