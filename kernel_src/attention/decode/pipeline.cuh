// The memory pipeline of the batch-decode kernels (attention/decode/kernels.cuh): a persistent CTA walks its work
// items of the plan (read through plan/work.cuh) as one stream of KV tiles, resolving each token's page through the
// page table S tiles ahead and copying K and V rows into S shared-memory stages with cp.async. See kernels.cuh for
// the iteration order and the ring. DecodeParams comes from the generated preamble (cuinfer/decode/specs.py).
#pragma once
#include "common/cp_async.cuh"
#include "common/swizzle.cuh"
#include "common/types.cuh"
#include "debug/trace.cuh"
#include "plan/work.cuh"
#include "variants/contract.cuh"

namespace cuinfer {
namespace decode {

enum TileFlags : int { kFirst = 1, kLast = 2, kNull = 4 };

// Items of the CTA held in shared memory at a time (reloaded when the producer runs past them; the host's
// shared-memory sizes mirror it: cuinfer/decode/policy.py ITEM_CHUNK).
constexpr int kItemChunk = 64;

// One work item as the producer needs it, read once from the plan and the page table.
struct ItemInfo {
  int req, kv_head, start, end, partial, qo_tile, page_begin, kv_len;
  int merge, pieces;  // split items: the unit's first partial row and its piece count (merge_split); else -1, 0
};

// One tile of the CTA's tile stream: where its tokens' K and V rows are (page, slot and head resolved), and the item
// facts the math needs at the tile. Without kPairs: the element offsets in the K and V caches, K's in off[r] and V's
// in off[T + r]. With kPairs (Pipeline's choice): the global addresses of row r's K and V side by side, off[2r] and
// off[2r + 1], so that Pipeline::issue reads both with one 16-byte load (the slot 16-byte aligned: 8 bytes more; the
// host's shared-memory size takes the larger, cuinfer/decode/policy.py).
template <int T, bool kPairs = false> struct alignas(kPairs ? 16 : 8) TileSlot {
  i64 off[2 * T];
  int req, kv_head, start, n_valid, partial, qo_tile, kv_len, flags;
  int merge, pieces;
};

__device__ __forceinline__ i64 round_up_128(i64 x) { return (x + 127) / 128 * 128; }

// ---- the producer: walks the CTA's items tile by tile, S tiles ahead of the math ----------------------------------

template <int kThreads, class V, class VP>
__device__ __forceinline__ void load_items(const DecodeParams& p, const VP& v, ItemInfo* items, int base, int end) {
  const int* page_indptr = reinterpret_cast<const int*>(p.page_indptr);
  const int* kv_lens = reinterpret_cast<const int*>(p.kv_lens);
  for (int i = threadIdx.x; i < kItemChunk; i += kThreads) {
    const int it = base + i;
    if (it < end) {
      ItemInfo x;
      x.req = plan::req(p, it);
      x.kv_head = plan::kv_head(p, it);
      x.start = plan::kv_start(p, it);
      x.end = plan::kv_end(p, it);
      x.partial = plan::partial(p, it);
      x.qo_tile = plan::qo_tile(p, it);
      x.merge = plan::merge_unit(p, it);
      x.pieces = plan::pieces(p, it);
      x.page_begin = page_indptr[x.req];
      x.kv_len = kv_lens[x.req];
      if constexpr (V::kUpperBound || V::kLowerBound) {
        // The variant's key range of the decode query (at kv_len - 1) clips the item (the planner clips too; this is
        // exact). A range may not depend on the query head.
        const variant::Index ix{x.req, 0, x.kv_len - 1, -1, x.kv_head, 1, x.kv_len, 0};
        int lo = variant::kNoLowerBound, hi = x.kv_len;
        V::key_range(v, ix, lo, hi);
        if constexpr (V::kLowerBound) x.start = max(x.start, lo);
        if constexpr (V::kUpperBound) x.end = min(x.end, hi);
        x.end = max(x.end, x.start);
      }
      items[i] = x;
    }
  }
}

// The token one thread resolves for a tile being produced: its page index is loaded by produce() and its offsets are
// stored by finish(), later, so the load's latency overlaps other work.
struct PendingToken {
  int page, slot_in_page, head;
  bool valid;
};

// kG: the GQA group (query heads per KV head); kRows: the query rows of one work item (the tensor-core kernel's 16-row
// tile, the CUDA-core kernel's whole group); kQRowBytes: a query row's bytes (16-bit q); kElemBytes: a K / V
// element's. kPairs (the trimmed tiles, TileSlot's address pairs): a page size that is a power of two splits a token
// into page and slot by a shift and a mask found once per CTA (page_shift, page_mask) instead of an integer division
// (~20 instructions per tile and thread); the addresses are formed from the non-negative page, slot and head as
// unsigned 32-bit factors (the same 64 bits as the signed products, without their sign extensions); and finish()
// writes the caches' bases to the rows past n_valid (Pipeline::issue reads every row).
template <int T, int kThreads, class V, int kG, int kRows, int kQRowBytes, int kElemBytes, bool kPairs>
struct TileProducer {
  int item, item_end, chunk_base, pos;
  int page_shift, page_mask;  // (kPairs) a power-of-two page size's log2 and size - 1; else -1, 0
  bool fresh;

  __device__ __forceinline__ void init(const DecodeParams& p, int begin, int end) {
    item = begin;
    item_end = end;
    chunk_base = begin;
    pos = 0;
    fresh = true;
    if constexpr (kPairs) {
      const int ps = p.page_size;
      page_shift = (ps & (ps - 1)) == 0 ? __ffs(ps) - 1 : -1;
      page_mask = page_shift >= 0 ? ps - 1 : 0;
    }
  }

  // Describe the next tile of the stream in `slot`. All threads call it with identical state (block-uniform).
  template <class VP>
  __device__ __forceinline__ PendingToken produce(const DecodeParams& p, const VP& v, ItemInfo* items,
                                                  TileSlot<T, kPairs>* slot) {
    PendingToken tok_out;
    tok_out.valid = false;
    if (item >= item_end) {
      if (threadIdx.x == 0) slot->flags = kNull;
      return tok_out;
    }
    if (item - chunk_base >= kItemChunk) {
      __syncthreads();  // every thread is done reading the old chunk
      chunk_base = item;
      load_items<kThreads, V>(p, v, items, chunk_base, item_end);
      __syncthreads();
    }
    const ItemInfo& x = items[item - chunk_base];
    if (fresh) {
      pos = x.start;
      // The item's query rows are read when its first tile reaches the math, kStages tiles from now: fetch them into
      // L2 meanwhile, so that read does not wait on DRAM (a CTA of D7 starts 8 items).
      constexpr int kLines = (kQRowBytes + 127) / 128;
      const int row0 = x.qo_tile * kRows;
      if (static_cast<int>(threadIdx.x) < min(kRows, kG - row0) * kLines) {
        const int r = threadIdx.x / kLines, line = threadIdx.x % kLines;
        const unsigned char* q = reinterpret_cast<const unsigned char*>(p.q) +
                                 (i64(x.req) * p.q_stride_b + i64(x.kv_head * kG + row0 + r) * p.q_stride_h) * 2;
        prefetch_l2(q + line * 128);
      }
    }
    const int n_valid = max(0, min(T, x.end - pos));
    const bool last = pos + T >= x.end;
    if (threadIdx.x == 0) {
      slot->req = x.req;
      slot->kv_head = x.kv_head;
      slot->start = pos;
      slot->n_valid = n_valid;
      slot->partial = x.partial;
      slot->qo_tile = x.qo_tile;
      slot->kv_len = x.kv_len;
      slot->merge = x.merge;
      slot->pieces = x.pieces;
      slot->flags = (fresh ? kFirst : 0) | (last ? kLast : 0);
    }
    if constexpr (kPairs) {
      // Every thread splits its token (past n_valid too: tok >= 0, nothing is read), so that only the page index
      // load depends on the thread and takes a predicate rather than a branch.
      const int tok = pos + threadIdx.x;
      int pi;
      if (page_shift >= 0) {
        pi = tok >> page_shift;
        tok_out.slot_in_page = tok & page_mask;
      } else {
        pi = tok / p.page_size;
        tok_out.slot_in_page = tok - pi * p.page_size;
      }
      tok_out.head = x.kv_head;
      tok_out.valid = static_cast<int>(threadIdx.x) < n_valid;
      if (tok_out.valid) tok_out.page = reinterpret_cast<const int*>(p.page_indices)[x.page_begin + pi];
    } else if (static_cast<int>(threadIdx.x) < n_valid) {
      const int tok = pos + threadIdx.x;
      const int pi = tok / p.page_size;
      tok_out.slot_in_page = tok - pi * p.page_size;
      tok_out.page = reinterpret_cast<const int*>(p.page_indices)[x.page_begin + pi];
      tok_out.head = x.kv_head;
      tok_out.valid = true;
    }
    if (last) {
      ++item;
      fresh = true;
    } else {
      pos += T;
      fresh = false;
    }
    return tok_out;
  }

  // Store the offsets of a token resolved by produce(). Trimmed tiles (kPairs) store the row's K and V addresses
  // as one 16-byte pair, and the caches' base addresses for every other row of the tile, so that every row of a slot
  // holds addresses the copies may use (Pipeline::issue).
  static __device__ __forceinline__ void finish(const DecodeParams& p, TileSlot<T, kPairs>* slot,
                                                const PendingToken& t) {
    if constexpr (kPairs) {
      // (page, slot and head are >= 0: the validated page indices, tok % page_size and a KV head, so their unsigned
      // products with the strides are the signed ones' 64 bits, whatever the strides' signs; the element offsets
      // times kElemBytes are byte offsets)
      ulonglong2* pair = reinterpret_cast<ulonglong2*>(&slot->off[2 * threadIdx.x]);
      if (t.valid) {
        const u64 page = static_cast<u32>(t.page), sl = static_cast<u32>(t.slot_in_page), h = static_cast<u32>(t.head);
        const u64 ko = page * static_cast<u64>(p.k_stride_page) + sl * static_cast<u64>(p.k_stride_slot) +
                       h * static_cast<u64>(p.k_stride_head);
        const u64 vo = page * static_cast<u64>(p.v_stride_page) + sl * static_cast<u64>(p.v_stride_slot) +
                       h * static_cast<u64>(p.v_stride_head);
        *pair = make_ulonglong2(reinterpret_cast<u64>(p.k) + ko * kElemBytes,
                                reinterpret_cast<u64>(p.v) + vo * kElemBytes);
      } else if (static_cast<int>(threadIdx.x) < T) {
        *pair = make_ulonglong2(reinterpret_cast<u64>(p.k), reinterpret_cast<u64>(p.v));
      }
    } else if (t.valid) {
      slot->off[threadIdx.x] = i64(t.page) * p.k_stride_page + i64(t.slot_in_page) * p.k_stride_slot +
                               i64(t.head) * p.k_stride_head;
      slot->off[T + threadIdx.x] = i64(t.page) * p.v_stride_page + i64(t.slot_in_page) * p.v_stride_slot +
                                   i64(t.head) * p.v_stride_head;
    }
  }
};

// ---- the pipeline: KV stages, tile ring and item chunk in dynamic shared memory -----------------------------------

// kPairs: the trimmed tiles (TileSlot's address pairs, TileProducer's kPairs): fp8 K / V, and the kernels whose
// per-tile work is short of issue slots (kernels.cuh chooses); the other 16-bit tiles keep the offsets' code, which
// measured faster on the memory-bound D6 (docs/performance.md).
template <typename KV, int D, int T, int kStages, int kThreads, class V, int kG, int kRows, bool kPairs>
struct Pipeline {
  static_assert(kStages >= 2, "the pipeline needs at least two stages");
  static_assert(T <= kThreads, "one thread resolves each token of a tile");
  static constexpr int kVec = 16 / sizeof(KV);
  static constexpr int kChunks = D / kVec;  // 16-byte chunks per row
  static constexpr int kRing = kStages + 1;
  static constexpr i64 kStageBytes = 2LL * T * D * sizeof(KV);
  static constexpr i64 kRingOffset = kStages * kStageBytes;
  static_assert(kPairs || sizeof(KV) == 2, "fp8 tiles take the trimmed producer (kPairs)");
  using Slot = TileSlot<T, kPairs>;
  static_assert(sizeof(Slot) == 16 * T + (kPairs ? 48 : 40), "cuinfer/decode/policy.py smem_bytes mirrors it");
  static constexpr i64 kItemsOffset = kRingOffset + kRing * sizeof(Slot);
  // The kernel's own area (query tile, merge scratch) starts here.
  static constexpr i64 kBytes = (kItemsOffset + kItemChunk * sizeof(ItemInfo) + 127) / 128 * 128;
  static_assert(kThreads % kChunks == 0, "the block copies whole rows per pass");
  static constexpr int kRowsPerPass = kThreads / kChunks;

  unsigned char* smem;
  u64 l2_policy;  // of the K/V copies: evict-first or normal, as the host chose (cuinfer/decode/policy.py kv_evict_first)
  TileProducer<T, kThreads, V, kG, kRows, D * 2, sizeof(KV), kPairs> prod;
  PendingToken pending;  // the token of tile n+S resolved by advance(n), stored by finish(n)
  // (trimmed tiles) Every K and V row starts on a multiple of kRowAlign bytes (a power of two at least a row's bytes)
  // when the caches' bases and byte strides are, so chunk c of a row is at its address | 16c: one logic op per copy
  // where the 64-bit add takes two (Pipeline::issue).
  static constexpr int kRowAlign =
      kChunks * 16 <= 64 ? 64 : kChunks * 16 <= 128 ? 128 : kChunks * 16 <= 256 ? 256 : 512;
  bool rows_aligned;

  __device__ __forceinline__ KV* k_stage(int n) const {
    return reinterpret_cast<KV*>(smem + (n % kStages) * kStageBytes);
  }
  __device__ __forceinline__ KV* v_stage(int n) const { return k_stage(n) + T * D; }
  __device__ __forceinline__ Slot* slot(int n) const {
    return reinterpret_cast<Slot*>(smem + kRingOffset) + (n % kRing);
  }
  __device__ __forceinline__ ItemInfo* items() const { return reinterpret_cast<ItemInfo*>(smem + kItemsOffset); }

  // cp.async the K and V rows of tile n into its stage (swizzled 16-byte chunks); nothing for a null tile. (NVRTC 13's
  // ptxas has emitted LDGSTS [R+UR0], desc[UR1] with UR0 / UR1 never written, an illegal instruction on the H200, for
  // some forms of the prologue's copies, whose stages are constants: CHANGELOG 2026-12-02. tests/compile checks every
  // kernel for such reads.)
  __device__ __forceinline__ void issue(const DecodeParams& p, int n) const {
    const Slot* s = slot(n);
    if (s->flags & kNull) return;
    const int n_valid = s->n_valid;
    const int c = threadIdx.x % kChunks;
    KV* ks = k_stage(n);
    KV* vs = v_stage(n);
    if constexpr (kPairs) {
      // every row of the slot holds a K and a V address (TileProducer::finish: the caches' bases past n_valid, where
      // the copy reads nothing and zero-fills)
      const u64 cb = c * 16;
      if constexpr (T % kRowsPerPass == 0 && kRowsPerPass % 8 == 0) {
        // All of the thread's address pairs are read first (one 16-byte load per row), unconditionally, and then all
        // of its copies issued: an LDGSTS right after an LDS takes ptxas's 3 dummy LDS (a hazard guard) per pass,
        // this order once per tile. The thread's rows are kRowsPerPass apart, a multiple of 8, so they share the
        // swizzle: the thread's first slot plus an immediate per pass.
        constexpr int kPasses = T / kRowsPerPass;
        const int r0 = threadIdx.x / kChunks;
        ulonglong2 a[kPasses];
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
          a[i] = *reinterpret_cast<const ulonglong2*>(&s->off[2 * (r0 + i * kRowsPerPass)]);
        }
        const int dst = Swizzle<kChunks>::slot(r0, c) * kVec;
        const int left = n_valid - r0;  // (each pass compares it with an immediate)
        auto copies = [&](bool aligned) {  // (inlined: one loop per value)
#pragma unroll
          for (int i = 0; i < kPasses; ++i) {
            const bool ok = i * kRowsPerPass < left;
            const u64 ka = aligned ? a[i].x | cb : a[i].x + cb, va = aligned ? a[i].y | cb : a[i].y + cb;
            cp_async_16(ks + dst + i * kRowsPerPass * D, reinterpret_cast<const KV*>(ka), ok, l2_policy);
            cp_async_16(vs + dst + i * kRowsPerPass * D, reinterpret_cast<const KV*>(va), ok, l2_policy);
          }
        };
        if (rows_aligned) {
          copies(true);
        } else {
          copies(false);
        }
      } else {
#pragma unroll
        for (int r0 = 0; r0 < T; r0 += kRowsPerPass) {
          const int r = r0 + threadIdx.x / kChunks;
          if (T % kRowsPerPass == 0 || r < T) {  // a block whose rows per pass do not divide T guards the last pass
            const ulonglong2 a = *reinterpret_cast<const ulonglong2*>(&s->off[2 * r]);
            const int dst = Swizzle<kChunks>::slot(r, c) * kVec;
            cp_async_16(ks + dst, reinterpret_cast<const KV*>(a.x + cb), r < n_valid, l2_policy);
            cp_async_16(vs + dst, reinterpret_cast<const KV*>(a.y + cb), r < n_valid, l2_policy);
          }
        }
      }
      return;
    }
    const KV* kb = reinterpret_cast<const KV*>(p.k);
    const KV* vb = reinterpret_cast<const KV*>(p.v);
#pragma unroll
    for (int r0 = 0; r0 < T; r0 += kRowsPerPass) {
      const int r = r0 + threadIdx.x / kChunks;
      if (T % kRowsPerPass == 0 || r < T) {  // a block whose rows per pass do not divide T guards the last pass
        const bool ok = r < n_valid;
        const i64 ko = ok ? s->off[r] : 0;
        const i64 vo = ok ? s->off[T + r] : 0;
        const int dst = Swizzle<kChunks>::slot(r, c) * kVec;
        cp_async_16(ks + dst, kb + ko + c * kVec, ok, l2_policy);
        cp_async_16(vs + dst, vb + vo + c * kVec, ok, l2_policy);
      }
    }
  }

  // Prologue: load the first item chunk, resolve tiles 0..S-1, start the copies of tiles 0..S-2.
  template <class VP>
  __device__ __forceinline__ void start(const DecodeParams& p, const VP& v, unsigned char* smem_base) {
    smem = smem_base;
    // The CTAs together pull the plan and page table into L2 (one line per thread at most) while their first loads
    // of it are in flight, so the loads that depend on the work range (items, request facts, page indices) find
    // their lines in L2 or on the way. Measured (dtrace, H200): the item loads 0.83 -> 0.60 us; D1-D4 0.1-0.5 us.
    const int lines = (p.plan_bytes + 127) / 128;
    for (int l = blockIdx.x + threadIdx.x * gridDim.x; l < lines; l += kThreads * gridDim.x)
      prefetch_l2(reinterpret_cast<const unsigned char*>(p.plan_words) + i64(l) * 128);
    l2_policy = p.kv_evict_first ? l2_evict_first_policy() : l2_evict_normal_policy();
    if constexpr (kPairs) {
      // (the strides in bytes: element strides times sizeof(KV))
      const u64 strides = static_cast<u64>(p.k_stride_page) | static_cast<u64>(p.k_stride_slot) |
                          static_cast<u64>(p.k_stride_head) | static_cast<u64>(p.v_stride_page) |
                          static_cast<u64>(p.v_stride_slot) | static_cast<u64>(p.v_stride_head);
      const u64 bits = reinterpret_cast<u64>(p.k) | reinterpret_cast<u64>(p.v) | strides * sizeof(KV);
      rows_aligned = (bits & (kRowAlign - 1)) == 0;
    }
    prod.init(p, plan::range_begin(p, blockIdx.x), plan::range_end(p, blockIdx.x));
    if (prod.item_end != -12345) CUINFER_DECODE_STAMP(8);  // (a branch on the loaded value: stamped once it landed)
    load_items<kThreads, V>(p, v, items(), prod.chunk_base, prod.item_end);
    __syncthreads();
    CUINFER_DECODE_STAMP(9);
    // All S page-index loads are issued before any is used: one memory round trip, not S, before the first copy.
    PendingToken first[kStages];
#pragma unroll
    for (int m = 0; m < kStages; ++m) first[m] = prod.produce(p, v, items(), slot(m));
#pragma unroll
    for (int m = 0; m < kStages; ++m) prod.finish(p, slot(m), first[m]);
    __syncthreads();
    CUINFER_DECODE_STAMP(10);
#pragma unroll
    for (int m = 0; m < kStages - 1; ++m) {
      issue(p, m);
      cp_async_commit();
    }
  }

  // Top of iteration n: wait for tile n and make it visible to the block. Returns its descriptor.
  __device__ __forceinline__ const Slot* wait(int n) const {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    return slot(n);
  }

  // After wait(n): start the copies of tile n+S-1 (one commit group per iteration, empty or not) and resolve n+S.
  template <class VP> __device__ __forceinline__ void advance(const DecodeParams& p, const VP& v, int n) {
    issue(p, n + kStages - 1);
    cp_async_commit();
    pending = prod.produce(p, v, items(), slot(n + kStages));
  }

  // After the math of iteration n: store the offsets resolved by advance(n).
  __device__ __forceinline__ void finish(const DecodeParams& p, int n) const {
    prod.finish(p, slot(n + kStages), pending);
  }
};

}  // namespace decode
}  // namespace cuinfer
