// Hopper prefill: the producer warpgroup. It walks the CTA's items of the plan (its own range, then the shared pool:
// plan/work.cuh), hands each unit to the consumers through a shared-memory slot, and fills Q and the K / V ring:
//   * Q and every K / V tile that lies wholly inside the unit's keys: TMA boxes issued by one thread (the maps' 128-byte
//     swizzle is the wgmma layout), completing on the stage's barrier by transaction count;
//   * a paged cache's tiles (rows gathered by page table), and a ragged tile that crosses the unit's last key (a
//     request's tail; a causal diagonal not on a tile boundary): cp.async by all 128 producer threads with the rows
//     past the end zero-filled, so no row of another request (or past the tensor) reaches the consumers' P·V, where
//     a weight of 0 times a non-finite value would be NaN.
// Q rows past a request's end are read from the next rows (or zero-filled past the tensor): they only feed rows that
// are never stored.
// K and V of a stage are released apart by the consumers (k_empty / v_empty), so the next K load starts while a P·V
// still reads the stage's V.
#pragma once
#include "attention/prefill_sm90/unit.cuh"
#include "common/cp_async.cuh"
#include "common/mbarrier.cuh"

namespace cuinfer {
namespace prefill_sm90 {

constexpr u32 kProducerBarrier = 3;  // named barrier of the producer warpgroup (1 and 2: the consumers' turns)

// Copies `valid` rows (stride `stride` elements) of 128 16-bit elements from `src` into a swizzled 128-row tile,
// zero-filling rows at and past `valid`. Thread t copies 16-byte chunk t % 16 of rows t / 16 + 8 i: those share the
// swizzle (r % 8), so one shared address plus i * 1024 and one global pointer plus i * 8 rows.
template <class T>
__device__ __forceinline__ void copy_tile_zfill(u32 dst, const T* src, i64 stride, int valid, int tid) {
  const int c = tid % 16, r0 = tid / 16;
  const u32 s0 = dst + sm90::Sw128Tile<kBlockN>::chunk_offset(r0, c);
  const T* g = src + r0 * stride + c * 8;
  const i64 step = 8 * stride;
#pragma unroll 4
  for (int i = 0; i < kBlockN / 8; ++i) {
    const bool ok = r0 + 8 * i < valid;
    cp_async_16(s0 + i * 1024, ok ? g : src, ok);  // (a row past the end: 16 zero bytes, nothing read)
    g += step;
  }
}

// A paged tile: the same copy with each row's address from the page table (K and V share strides).
template <class T, class P>
__device__ __forceinline__ void copy_paged_zfill(u32 dst, const T* base, const P& p, int page_base, int key0, int kvh,
                                                 int valid, int tid) {
  const int c = tid % 16, r0 = tid / 16;
  const u32 s0 = dst + sm90::Sw128Tile<kBlockN>::chunk_offset(r0, c);
#pragma unroll 8
  for (int i = 0; i < kBlockN / 8; ++i) {
    const int key = key0 + r0 + 8 * i;
    const bool ok = r0 + 8 * i < valid;
    const int page = kv::Paged::page(p, page_base, key, ok);
    cp_async_16(s0 + i * 1024, base + (ok ? kv::Paged::offset(p, page, key, kvh) + c * 8 : 0), ok);
  }
}

// One K or V tile into stage buffer `dst` (ready on barrier `full` once `empty` let the stage be refilled; `n` = the
// stage's fill count): TMA for a whole tile, cp.async with zero fill for one that crosses the unit's last key.
// Every producer thread waits for `empty` on every tile, TMA tiles included: a parity wait only tells the phase it
// asks for from the one before, so a thread that skipped waits and asked for a later fill's parity would see an older
// phase complete and overwrite a stage still being read.
// Paged caches (KV = kv::Paged) copy every tile by page table: `row` is the tile's first key, `base` the cache.
template <class T, class KV, class P>
__device__ __forceinline__ void load_tile(u32 dst, u32 full, u32 empty, int n, bool whole, const sm90::TmaDesc* map,
                                          const T* base, i64 stride, int head, int row, int valid, int tid,
                                          const P& p, int page_base) {
  if (n > 0) sm90::mbar_wait(empty, (n - 1) & 1);
  if (whole) {
    if (tid == 0) {
      sm90::mbar_arrive_expect_tx(full, Shape<128>::kTileBytes);
      sm90::tma_load_3d(dst, map, full, 0, head, row);
      sm90::tma_load_3d(dst + sm90::Sw128Tile<kBlockN>::kBlockBytes, map, full, 64, head, row);
    }
    return;
  }
  if constexpr (KV::kPaged) {
    copy_paged_zfill<T>(dst, base, p, page_base, row, head, valid, tid);
  } else {
    copy_tile_zfill<T>(dst, base + row * stride, stride, valid, tid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  sm90::fence_proxy_async();  // (generic-proxy writes, read by the async proxy of wgmma)
  sm90::named_barrier_sync(kProducerBarrier, 128);
  if (tid == 0) sm90::mbar_arrive(full);
}

template <class T, class V, class KV, class P, class VP>
__device__ __forceinline__ void produce(const P& p, const VP& vp, const Bars& bars, u32 sq, u32 sk, u32 sv,
                                        Unit* slot, int* bcast, const sm90::TmaDesc* tm_q, const sm90::TmaDesc* tm_k,
                                        const sm90::TmaDesc* tm_v, int tid) {
  constexpr int D = 128;
  const int num_ctas = static_cast<int>(gridDim.x);
  int own = plan::range_begin(p, blockIdx.x);
  const int own_end = plan::range_end(p, blockIdx.x);
  const int pool_lo = plan::range_begin(p, num_ctas), pool_hi = plan::range_end(p, num_ctas);
  bool in_pool = false;
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  int tile = 0;  // K / V tiles loaded so far (all units): stage tile % kStages, fill tile / kStages
  for (int n_q = 0;; ++n_q) {
    // thread 0 picks the next item (own range, then the pool) and broadcasts it (two slots: the one written here was
    // last read before the previous item's barrier)
    if (tid == 0) {
      int it = -1;
      if (own < own_end) {
        it = own++;
      } else if (pool_lo < pool_hi) {
        in_pool = true;
        const int x = plan::take_pool_item(static_cast<int*>(p.pool_count), pool_lo, pool_hi);
        it = x < pool_hi ? x : -1;
      }
      bcast[n_q & 1] = it;
    }
    sm90::named_barrier_sync(kProducerBarrier, 128);
    const int it = bcast[n_q & 1];
    if (tid == 0 && n_q > 0) sm90::mbar_wait(bars.q_empty(), (n_q - 1) & 1);  // the consumers are done with Q
    if (it < 0) {
      if (tid == 0) {
        slot->n_tiles = -1;
        sm90::mbar_arrive(bars.q_full());
        if (in_pool) plan::leave_pool(static_cast<int*>(p.pool_count), static_cast<u32>(num_ctas));
      }
      break;
    }
    const Unit w = resolve_unit<V, KV>(p, vp, it, D);
    if (tid == 0) {
      *slot = w;  // (read by the consumers after q_full)
      sm90::mbar_arrive_expect_tx(bars.q_full(), Shape<D>::kQBytes);
      sm90::tma_load_3d(sq, tm_q, bars.q_full(), 0, w.head, w.q0 + w.row0);
      sm90::tma_load_3d(sq + sm90::Sw128Tile<kBlockM>::kBlockBytes, tm_q, bars.q_full(), 64, w.head, w.q0 + w.row0);
    }
    const int kvh = w.head / p.group_size;
    // ragged: rows are global token indices (as the TMA coordinates) from the head's base; paged: keys of the request
    // from the cache's base (the page table gives each row's address)
    const T* kh = KV::kPaged ? k : k + kvh * p.k_stride_h;
    const T* vh = KV::kPaged ? v : v + kvh * p.v_stride_h;
    const int row0 = KV::kPaged ? 0 : w.k0;
    for (int i = 0; i < w.n_tiles; ++i, ++tile) {
      const int s = tile % kStages, n = tile / kStages;
      const int key0 = (w.t_first + i) * kBlockN;
      const bool whole = !KV::kPaged && key0 + kBlockN <= w.key_hi;
      const int valid = w.key_hi - key0;
      load_tile<T, KV>(sk + s * Shape<D>::kTileBytes, bars.k_full(s), bars.k_empty(s), n, whole, tm_k, kh,
                       p.k_stride_n, kvh, row0 + key0, valid, tid, p, w.k0);
      load_tile<T, KV>(sv + s * Shape<D>::kTileBytes, bars.v_full(s), bars.v_empty(s), n, whole, tm_v, vh,
                       p.v_stride_n, kvh, row0 + key0, valid, tid, p, w.k0);
    }
  }
}

}  // namespace prefill_sm90
}  // namespace cuinfer
