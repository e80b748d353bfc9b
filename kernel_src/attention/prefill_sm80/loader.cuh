// The copies of the prefill kernel: Q tiles, K and V tiles (through the KV format: ragged rows or a paged gather)
// into swizzled shared memory with cp.async. Addresses are rebuilt from a few ints at every copy instead of keeping
// 64-bit pointers live across the KV loop.
//
// Table entries (cross-item path): the resolved facts of an item, kTableFields ints (kernel.cuh fills them).
#pragma once
#include "attention/prefill_sm80/cta.cuh"
#include "common/cp_async.cuh"
#include "common/math.cuh"
#include "kv/paged.cuh"
#include "kv/ragged.cuh"

namespace cuinfer {
namespace prefill {

enum TableField : int { kFReq, kFRow0, kFKvHead, kFKvStart, kFKvEnd, kFPartial, kFQoBase, kFQoLen, kFKvBase, kFKvLen };

// The KV tiles of an item [kv_start, kv_end) start at kv_start + i * TILE_KV (the last one clipped at kv_end); the
// kernel runs them in the order of Traits::kBackwardTiles: tile `first` first, then next(key0, 1), ... while has().
// next(key0, n) is the tile n places later in that order (the copies run STAGES - 1 tiles ahead).
template <class C> struct TileOrder {
  static constexpr int kTile = C::kTileKV, kStep = C::kBackwardTiles ? -kTile : kTile;
  static __device__ __forceinline__ int first(int kv_start, int kv_end) {
    if constexpr (C::kBackwardTiles) return kv_start + (kv_end - kv_start - 1) / kTile * kTile;
    return kv_start;
  }
  static __device__ __forceinline__ int next(int key0, int n) { return key0 + n * kStep; }
  // (backward: an empty range's first() is kv_start itself, which key0 < kv_end rejects)
  static __device__ __forceinline__ bool has(int key0, int kv_start, int kv_end) {
    return key0 < kv_end && (!C::kBackwardTiles || key0 >= kv_start);
  }
};

template <class C, class P> struct Loader {
  using T = typename C::DTypeKV;
  using TQ = typename C::DTypeQ;
  using KV = typename C::KV;
  static constexpr int NT = C::kThreads, KR = C::kKVRowsPerThread, NF = C::kTableFields;
  static constexpr u32 kPassQK = C::kRowsPerPass * C::kChunksQK * 16;
  // K / V: bytes between a thread's rows, chunks a thread copies per row (kKVChunkStep elements apart), elements per
  // 16-byte chunk
  static constexpr u32 kPassK = C::kKVRowsPerPass * C::kChunksK * 16, kPassVO = C::kKVRowsPerPass * C::kChunksVO * 16;
  static constexpr int kEl = 16 / sizeof(T), kKVChunkStep = 8 * kEl;

  // The K / V copy mapping: fp8's own, or (16-bit K / V) Q's, which it equals there.
  __device__ __forceinline__ int kv_row() const {
    if constexpr (C::kKV8) return c.kv_row;
    return c.cp_row;
  }
  __device__ __forceinline__ int kv_chunk() const {
    if constexpr (C::kKV8) return c.kv_chunk;
    return c.cp_chunk;
  }
  __device__ __forceinline__ u32 k_dst() const {
    if constexpr (C::kKV8) return c.cp_k_dst;
    return c.cp_qk_dst;
  }
  __device__ __forceinline__ u32 v_dst() const {
    if constexpr (C::kKV8) return c.cp_v_dst;
    return c.cp_vo_dst;
  }
  const P& p;
  const Cta<C>& c;

  // Q rows [row0, row0 + valid_rows) of the tile (packed rows of request rows from qo_base, KV head kvh: packed row
  // = token * g + head in group).
  __device__ __forceinline__ void load_q(int row0, int valid_rows, int qo_base, int kvh) const {
    const int g = p.group_size;
    const TQ* q_ptr = static_cast<const TQ*>(p.q);
    if constexpr (C::kStagedEpi) {
      // Warp w copies its own rows warp_row0 .. + 16 MMA_Q: lane -> rows lane / 8 + 4i, chunks lane % 8 + 8c.
      const int qr = c.lane / 8, qc = c.lane % 8;
#pragma unroll
      for (int i = 0; i < C::kMmaQ * 4; ++i) {
        const int r = c.warp_row0 + qr + 4 * i;
        const int pr = row0 + r;
        const bool valid = r < valid_rows;
        const int token = static_cast<int>(fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
        const int head = kvh * g + (pr - token * g);
        const TQ* src = valid ? q_ptr + static_cast<i64>(qo_base + token) * p.q_stride_n + head * p.q_stride_h : q_ptr;
        const u32 dst = c.q_smem + r * (C::kChunksQK * 16) + ((qc ^ (r % 8)) * 16);
#pragma unroll
        for (int k = 0; k < C::kChunksQK / 8; ++k) cp_async_16(dst + k * 128, src + (k * 8 + qc) * 8, valid);
      }
    } else {
#pragma unroll
      for (int i = 0; i < C::kQRowsPerThread; ++i) {
        const int r = c.cp_row + i * C::kRowsPerPass;
        if (C::kTileQ % C::kRowsPerPass == 0 || r < C::kTileQ) {
          const int pr = row0 + r;
          const bool valid = r < valid_rows;
          const int token = static_cast<int>(fast_div(static_cast<u32>(pr), p.group_mul, p.group_shift));
          const int head = kvh * g + (pr - token * g);
          const TQ* src =
              valid ? q_ptr + static_cast<i64>(qo_base + token) * p.q_stride_n + head * p.q_stride_h : q_ptr;
#pragma unroll
          for (int k = 0; k < C::kChunksQK / 8; ++k) {
            cp_async_16(c.q_smem + c.cp_qk_dst + i * kPassQK + k * 128, src + (k * 8 + c.cp_chunk) * 8, valid);
          }
        }
      }
    }
  }

  // Paged: the page-table entries of a thread's rows of the tile at `key0` (one read each; 0 past kv_end). The loop
  // reads them one tile early, during P.V, so that the K copy at the top of the next iteration does not wait on them.
  __device__ __forceinline__ void read_pages(int key0, int kv_base, int kv_end, int (&pages)[KR]) const {
    const int rem = kv_end - key0 - kv_row();
#pragma unroll
    for (int i = 0; i < KR; ++i) {
      pages[i] = KV::page(p, kv_base, key0 + kv_row() + i * C::kKVRowsPerPass, i * C::kKVRowsPerPass < rem);
    }
  }

  // K rows of the tile at `key0` into buffer `stage`; paged: remember each row's offset for the matching V copy.
  // Rows past kv_end are copied with src-size 0 (zeros, no byte read), so their address need not be valid.
  __device__ __forceinline__ void load_k(int key0, int stage, int kv_base, int kvh, int kv_end,
                                         const int (&pages)[KR]) const {
    const T* k_ptr = static_cast<const T*>(p.k);
    const int rem = kv_end - key0 - kv_row();  // row i of this thread is valid iff i * kKVRowsPerPass < rem
    // Ragged: one 64-bit address per tile, rows kKVRowsPerPass apart are a constant stride further.
    const T* row0 = k_ptr + (kv::Ragged::k_offset(p, kv_base + key0 + kv_row(), kvh) + kv_chunk() * kEl);
#pragma unroll
    for (int i = 0; i < KR; ++i) {
      const bool valid = i * C::kKVRowsPerPass < rem;
      const T* src;
      if constexpr (C::kPaged) {
        const i64 off = KV::offset(p, pages[i], key0 + kv_row() + i * C::kKVRowsPerPass, kvh);
        c.page_off[i * NT + c.tid] = off;
        src = k_ptr + off + kv_chunk() * kEl;
      } else {
        src = row0 + static_cast<i64>(i * C::kKVRowsPerPass) * p.k_stride_n;
      }
      const u32 dst = c.k_smem + stage * C::kKBytes + k_dst() + i * kPassK;
      if constexpr (C::kKVPairRows) {  // chunks kv_chunk, kv_chunk + 4: slot ^ 4, i.e. offset ^ 64 (bit 6 of k_dst)
        cp_async_16(dst, src, valid);
        cp_async_16(c.k_smem + stage * C::kKBytes + (k_dst() ^ 64u) + i * kPassK, src + 4 * kEl, valid);
      } else {
#pragma unroll
        for (int k = 0; k < C::kChunksK / C::kKVThreadsPerRow; ++k) {
          cp_async_16(dst + k * 128, src + k * kKVChunkStep, valid);
        }
      }
    }
  }

  // Paged: this thread's row offsets of the last K copy (its own smem slots, so no barrier is needed to read them).
  __device__ __forceinline__ void own_offsets(i64 (&offs)[KR]) const {
#pragma unroll
    for (int i = 0; i < KR; ++i) offs[i] = C::kPaged ? c.page_off[i * NT + c.tid] : 0;
  }

  // V rows of the tile at `key0` into buffer `stage`; paged: at the offsets `offs` of the K copy (own_offsets; K and V
  // share strides).
  __device__ __forceinline__ void load_v(int key0, int stage, int kv_base, int kvh, int kv_end,
                                         const i64 (&offs)[KR]) const {
    const T* v_ptr = static_cast<const T*>(p.v);
    const int rem = kv_end - key0 - kv_row();
    const T* row0 = v_ptr + (kv::Ragged::v_offset(p, kv_base + key0 + kv_row(), kvh) + kv_chunk() * kEl);
#pragma unroll
    for (int i = 0; i < KR; ++i) {
      const bool valid = i * C::kKVRowsPerPass < rem;
      const T* src;
      if constexpr (C::kPaged) {
        src = v_ptr + offs[i] + kv_chunk() * kEl;
      } else {
        src = row0 + static_cast<i64>(i * C::kKVRowsPerPass) * p.v_stride_n;
      }
      const u32 dst = c.v_smem + stage * C::kVBytes + v_dst() + i * kPassVO;
      if constexpr (C::kKVPairRows) {  // (as load_k)
        cp_async_16(dst, src, valid);
        cp_async_16(c.v_smem + stage * C::kVBytes + (v_dst() ^ 64u) + i * kPassVO, src + 4 * kEl, valid);
      } else {
#pragma unroll
        for (int k = 0; k < C::kChunksVO / C::kKVThreadsPerRow; ++k) {
          cp_async_16(dst + k * 128, src + k * kKVChunkStep, valid);
        }
      }
    }
  }

  // Q, then the K and V rows of the first tile of an item (TileOrder) into buffer `st`: commits the group Q + K and
  // leaves V in the caller's next group (the order the main loop waits in). `pages`: that tile's page numbers (paged).
  __device__ __forceinline__ void issue_q_and_tile(int row0, int valid_rows, int qo_base, int kvh, int kv_base,
                                                   int kv_start, int kv_end, int st, const int (&pages)[KR]) const {
    load_q(row0, valid_rows, qo_base, kvh);
    const int key0 = TileOrder<C>::first(kv_start, kv_end);
    const bool any = TileOrder<C>::has(key0, kv_start, kv_end);
    if (any) load_k(key0, st, kv_base, kvh, kv_end, pages);
    cp_async_commit();
    if (any) {
      i64 offs[KR];
      own_offsets(offs);
      load_v(key0, st, kv_base, kvh, kv_end, offs);
    }
  }

  // Cross-item: Q and the first K/V tile of the item in table slot `ns` into buffer `st` (as issue_q_and_tile).
  __device__ __forceinline__ void issue_first(int ns, int st, const int (&pages)[KR]) const {
    const int* e = c.table + ns * NF;
    const int row0 = e[kFRow0], kvh = e[kFKvHead];
    const int kv_start = e[kFKvStart], kv_end = e[kFKvEnd], kv_base = e[kFKvBase];
    issue_q_and_tile(row0, min(C::kTileQ, e[kFQoLen] * p.group_size - row0), e[kFQoBase], kvh, kv_base, kv_start,
                     kv_end, st, pages);
  }

  // Paged, cross-item: the page numbers of the first tile of the item in table slot `ns`.
  __device__ __forceinline__ void read_first_pages(int ns, int (&pages)[KR]) const {
    const int* e = c.table + ns * NF;
    read_pages(TileOrder<C>::first(e[kFKvStart], e[kFKvEnd]), e[kFKvBase], e[kFKvEnd], pages);
  }
};

}  // namespace prefill
}  // namespace cuinfer
