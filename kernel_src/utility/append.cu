// append_paged_kv_cache: row t of append_key / append_value ([nnz, H, D], rows strided, last dim contiguous) is
// copied into request b = batch_indices[t] at position pos = positions[t]: page kv_indices[kv_indptr[b] + pos /
// page_size], slot pos % page_size, of the K / V cache (any layout: the cache is base pointers and element strides of
// a page, a slot and a head). Bit-exact copies into a cache of the rows' dtype; into an fp8 cache float16 / bfloat16
// rows are quantised (CacheStore below).
//
// Memory bound: the work is flat over (token, 16-byte vector of the token's row) and each thread moves kUnroll
// vectors of K and the same kUnroll vectors of V (one slot lookup serves both), all 2 * kUnroll loads issued before
// the first store. Consecutive threads take consecutive vectors of a token, so a warp moves contiguous 512-byte
// pieces of a row. When a row's heads are contiguous in both the source and the cache (NHD, a plain or fused-qkv
// slice) the host passes vecs_per_row = vecs_per_token: the row is one run of vectors and h is always 0. The two
// sides may have different row lengths (a (k_cache, v_cache) pair with different head dims): the work covers the
// longer, and vector r of the shorter side exists only for r < its vecs_per_token.
//
// Rows whose indices fall outside the page table or the cache (batch index < 0 for padding rows, or out of range;
// a position past the request's kv_len; a page-table entry or a page beyond the arrays) are skipped: nothing is
// written for them. The host checks the indices only on request (the check reads them on the host).
//
// The store goes through CacheStore<Tin, Tcache>, the one place that knows the cache's element type: the
// same-dtype specialisation is a copy (the side's scale unused); the fp8 specialisation quantises: a 16-byte input
// vector of 8 half / bfloat16 values is stored as 8 fp8 bytes, each saturate(float(x) / scale) rounded to nearest
// even. The division is IEEE (__fdiv_rn, whatever the compile flags) in float32, and float -> fp8 is one rounding
// (no float16 step that could round twice): on sm_89+ `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` (F2FP), on sm_80 the
// integer path of to_fp8_bits below. Saturation: |x / scale| beyond the format's max finite (e4m3fn 448, e5m2 57344),
// infinities included, stores +-max finite; NaN stays NaN (code 0x7f / 0xff). tests/cpu/test_append_fp8.py emulates
// the integer path bit by bit against ml_dtypes; the NumPy reference (float32 division, clip, ml_dtypes cast) is the
// same function.
// The parameter struct AppendParams (with AppendSide for K and V) comes from the generated preamble.
#include "common/math.cuh"
#include "utility/io.cuh"

namespace cuinfer {
namespace append {

constexpr int kThreads = 256;

template <typename Tin, typename Tcache> struct CacheStore;

template <typename T> struct CacheStore<T, T> {
  static constexpr int kVec = kVec16<T>;
  using In = util::Chunk<T, kVec>;
  __device__ __forceinline__ static void store(T* dst, const In& x, float) { x.store(dst); }
};

// The format's constants for the integer path: mantissa bits, exponent bias, largest finite code (magnitude).
template <typename F8> struct Fp8Format;
template <> struct Fp8Format<__nv_fp8_e4m3> {
  static constexpr int kMant = 3, kBias = 7;
  static constexpr u32 kMaxCode = 0x7e;  // 448 (0x7f is the NaN of e4m3fn)
};
template <> struct Fp8Format<__nv_fp8_e5m2> {
  static constexpr int kMant = 2, kBias = 15;
  static constexpr u32 kMaxCode = 0x7b;  // 57344 (0x7c is inf)
};

// float -> fp8 code, round to nearest even, saturating to the largest finite code; NaN -> 0x7f with the sign. The
// integer path of sm_80 (no fp8 cvt there), exact for every float: normal results re-bias the float exponent and
// round the mantissa (a carry into the exponent is the right result), subnormal results shift the full significand.
template <typename F8> __device__ __forceinline__ u32 to_fp8_bits(float f) {
  using F = Fp8Format<F8>;
  const u32 bits = __float_as_uint(f);
  const u32 sign = (bits >> 24) & 0x80u;
  const u32 mag = bits & 0x7fffffffu;
  const int e = static_cast<int>(mag >> 23);
  u32 code;
  if (mag > 0x7f800000u) {
    code = 0x7fu;  // NaN
  } else if (e >= 128 - F::kBias) {  // a normal fp8 value (or beyond: saturated below)
    constexpr int kShift = 23 - F::kMant;
    const u32 r = mag - (static_cast<u32>(127 - F::kBias) << 23);
    code = min((r + ((1u << (kShift - 1)) - 1u) + ((r >> kShift) & 1u)) >> kShift, F::kMaxCode);
  } else {  // fp8 subnormal or zero: the significand times 2^(e - 150) in units of 2^(1 - bias - mant)
    const u32 m = e ? ((mag & 0x7fffffu) | 0x800000u) : 0u;  // float subnormals round to 0 anyway
    const int s = min(151 - F::kBias - F::kMant - e, 31);    // >= 24 - kMant here
    code = (m + ((1u << (s - 1)) - 1u) + ((m >> s) & 1u)) >> s;
  }
  return sign | code;
}

// Two floats -> two fp8 codes in 16 bits (a in the low byte).
template <typename F8> __device__ __forceinline__ u32 to_fp8x2(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  // cvt puts its first source in the upper byte
  if constexpr (Fp8Format<F8>::kMant == 3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  }
  return r;
#else
  return to_fp8_bits<F8>(a) | (to_fp8_bits<F8>(b) << 8);
#endif
}

template <typename Tin, typename F8> struct CacheStoreFp8 {
  static constexpr int kVec = kVec16<Tin>;  // 8 inputs of 16 bits -> 8 bytes
  using In = util::Chunk<Tin, kVec>;
  __device__ __forceinline__ static void store(F8* dst, const In& x, float scale) {
    u32 w[kVec / 2];
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      const float a = __fdiv_rn(static_cast<float>(x[2 * i]), scale);
      const float b = __fdiv_rn(static_cast<float>(x[2 * i + 1]), scale);
      w[i] = to_fp8x2<F8>(a, b);
    }
    uint2 out;
    out.x = w[0] | (w[1] << 16);
    out.y = w[2] | (w[3] << 16);
    *reinterpret_cast<uint2*>(dst) = out;
  }
};
template <> struct CacheStore<half, __nv_fp8_e4m3> : CacheStoreFp8<half, __nv_fp8_e4m3> {};
template <> struct CacheStore<half, __nv_fp8_e5m2> : CacheStoreFp8<half, __nv_fp8_e5m2> {};
template <> struct CacheStore<__nv_bfloat16, __nv_fp8_e4m3> : CacheStoreFp8<__nv_bfloat16, __nv_fp8_e4m3> {};
template <> struct CacheStore<__nv_bfloat16, __nv_fp8_e5m2> : CacheStoreFp8<__nv_bfloat16, __nv_fp8_e5m2> {};

// Where a thread's rows go. The lookups of its kUnroll rows run phase by phase without branches (indices clamped
// into their arrays, validity kept aside), so the dependent loads of all rows are in flight together.
template <int kUnroll> struct Slots {
  int t[kUnroll], b[kUnroll], pos[kUnroll], page[kUnroll], slot[kUnroll];
  bool ok[kUnroll];

  // t[u] set for the rows with ok[u]; afterwards ok[u] says whether row u has a slot (page[u], slot[u]).
  __device__ __forceinline__ void find(const AppendParams& p) {
    const int* indptr = static_cast<const int*>(p.kv_indptr);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t_safe = ok[u] ? t[u] : 0;
      b[u] = __ldg(static_cast<const int*>(p.batch_indices) + t_safe);
      pos[u] = __ldg(static_cast<const int*>(p.positions) + t_safe);
    }
    int first[kUnroll], pages[kUnroll], last_len[kUnroll], entry[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      ok[u] = ok[u] & (b[u] >= 0) & (b[u] < p.batch_size) & (pos[u] >= 0);  // & not &&: no branches
      const int bb = ok[u] ? b[u] : 0;
      first[u] = __ldg(indptr + bb);
      pages[u] = __ldg(indptr + bb + 1) - first[u];
      last_len[u] = __ldg(static_cast<const int*>(p.kv_last_page_len) + bb);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int pi = static_cast<int>(fast_div(static_cast<u32>(ok[u] ? pos[u] : 0), p.page_mul, p.page_shift));
      slot[u] = pos[u] - pi * p.page_size;
      entry[u] = first[u] + pi;
      // pos < kv_len = (pages - 1) * page_size + last_len, and the page-table entry inside kv_indices
      ok[u] = ok[u] & (pi < pages[u]) & ((pi < pages[u] - 1) | (slot[u] < last_len[u])) & (first[u] >= 0) &
              (entry[u] < p.num_indices);
      page[u] = __ldg(static_cast<const int*>(p.kv_indices) + (ok[u] ? entry[u] : 0));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) ok[u] = ok[u] & (page[u] >= 0) & (page[u] < p.num_pages);
  }
};

// Element offsets of vector r of a token row of side s: in the source row and in the cache slot.
struct SideOffsets {
  i64 src, dst;
};
__device__ __forceinline__ SideOffsets side_offsets(const AppendSide& s, u32 r, int kvec) {
  const u32 h = fast_div(r, s.row_mul, s.row_shift);  // 0 for a contiguous row (vecs_per_row = vecs_per_token)
  const i64 c = static_cast<i64>(r - h * static_cast<u32>(s.vecs_per_row)) * kvec;
  return {h * s.src_s1 + c, h * s.dst_head + c};
}

// The host launches only when batch_size >= 1 and kv_indices is not empty (otherwise every row is skipped), so the
// clamped lookups above always read inside the arrays.
template <typename Tin, typename Tcache, int kUnroll>
__global__ void __launch_bounds__(kThreads, 4) append_paged_kv_cache(const __grid_constant__ AppendParams p) {
  using Store = CacheStore<Tin, Tcache>;
  constexpr int kVec = Store::kVec;
  const Tin* ksrc = static_cast<const Tin*>(p.k.src);
  const Tin* vsrc = static_cast<const Tin*>(p.v.src);
  Tcache* kdst = static_cast<Tcache*>(p.k.dst);
  Tcache* vdst = static_cast<Tcache*>(p.v.dst);
  const u32 total = static_cast<u32>(p.nnz) * static_cast<u32>(p.vecs_per_token);  // < 2^31 (host)
  const u32 step = gridDim.x * kThreads * kUnroll;
  for (u32 base = blockIdx.x * kThreads * kUnroll + threadIdx.x; base < total; base += step) {
    Slots<kUnroll> sl;
    u32 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const u32 w = base + u * kThreads;
      const u32 tl = fast_div(w, p.tok_mul, p.tok_shift);  // token within this launch
      r[u] = w - tl * static_cast<u32>(p.vecs_per_token);
      sl.t[u] = p.token_begin + static_cast<int>(tl);
      sl.ok[u] = w < total;
    }
    sl.find(p);
    typename Store::In xk[kUnroll], xv[kUnroll];
    i64 dk[kUnroll], dv[kUnroll];
    bool okk[kUnroll], okv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      okk[u] = sl.ok[u] & (r[u] < static_cast<u32>(p.k.vecs_per_token));
      okv[u] = sl.ok[u] & (r[u] < static_cast<u32>(p.v.vecs_per_token));
      const SideOffsets ok_ = side_offsets(p.k, r[u], kVec), ov = side_offsets(p.v, r[u], kVec);
      const i64 t = sl.t[u];
      if (okk[u]) xk[u].load(ksrc + t * p.k.src_s0 + ok_.src);
      if (okv[u]) xv[u].load(vsrc + t * p.v.src_s0 + ov.src);
      dk[u] = sl.page[u] * p.k.dst_page + sl.slot[u] * p.k.dst_slot + ok_.dst;
      dv[u] = sl.page[u] * p.v.dst_page + sl.slot[u] * p.v.dst_slot + ov.dst;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (okk[u]) Store::store(kdst + dk[u], xk[u], p.k.scale);
      if (okv[u]) Store::store(vdst + dv[u], xv[u], p.v.scale);
    }
  }
}

}  // namespace append
}  // namespace cuinfer
