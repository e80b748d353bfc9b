// Hopper prefill: the producer warpgroup. It walks the CTA's items of the plan (its own range, then the shared pool:
// plan/work.cuh), hands each unit to the consumers through a shared-memory slot, and fills Q and the K / V ring:
//   * Q and every K / V tile that lies wholly inside the unit's keys: TMA boxes issued by one thread (the maps' 128-byte
//     swizzle is the wgmma layout), completing on the stage's barrier by transaction count;
//   * a ragged tile that crosses the unit's last key (a request's tail; a causal diagonal not on a tile boundary):
//     cp.async by all 128 producer threads with the rows past the end zero-filled, so no row of another request (or
//     past the tensor) reaches the consumers' P·V, where a weight of 0 times a non-finite value would be NaN; the
//     producer waits for these copies (one tile at a unit's end);
//   * a paged cache's tiles (rows gathered by page table): the same zero-filled cp.async, but not waited for: each
//     producer thread's copies arrive on the stage's barrier as they land, so tiles stream like TMA ones;
//   * fp8 K / V: each tile's rows (128 bytes each) land in a staging ring of fp8 tiles and are converted into the
//     float16 stage the consumers read; the consumers fence the proxies after their wait. Ragged K / V and a paged
//     cache whose page size is a multiple of 16 (STAGE_TMA): TMA boxes issued by warp 0, converted by warps 1-3
//     (produce_fp8_unit_tma). Other page sizes: cp.async by all 128 threads, which then convert their own chunks
//     (produce_fp8_unit): 1.13-1.18x the time of the TMA staging on P4-P6 (docs/results/h200-2026-12-03g).
// Q rows past a request's end are read from the next rows (or zero-filled past the tensor): they only feed rows that
// are never stored.
// K and V of a stage are released apart by the consumers (k_empty / v_empty), so the next K load starts while a P·V
// still reads the stage's V.
#pragma once
#include "attention/prefill_sm90/unit.cuh"
#include "common/cp_async.cuh"
#include "common/fp8.cuh"
#include "common/mbarrier.cuh"
#include "debug/sm90_probe.cuh"

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

// A paged tile is copied by rows: thread t copies chunks t % 8 and t % 8 + 8 (one in each 64-column block of the
// swizzled tile) of rows t / 8 + 16 i, i < 8; those rows share the swizzle (r % 8), so one shared address plus
// i * 2048. The rows' addresses come from the page table: each thread reads one entry, lane l of warp w the one of row
// 4 w + l % 4 + 16 (l / 4) (the 32 rows the warp copies), and a shuffle hands each row's offset to its copiers.
constexpr int kPagedRows = kBlockN / 16;

// The tile row whose page-table entry thread `tid` reads: row 4 w + l % 4 + 16 (l / 4) for lane l of warp w.
__device__ __forceinline__ int paged_row(int tid) {
  const int lane = tid % 32;
  return (tid / 32) * 4 + lane % 4 + 16 * (lane / 4);
}

// This thread's row of the tile at key `key0`: its element offset from the cache's base (K and V share it), read
// before the stage's empty wait so the page-table latency hides behind it; rows at and past `valid` are not read.
template <class P>
__device__ __forceinline__ i64 paged_row_offset(const P& p, int page_base, int key0, int kvh, int valid, int tid) {
  const int r = paged_row(tid);
  const int key = key0 + r;
  return r < valid ? kv::Paged::offset(p, kv::Paged::page(p, page_base, key, true), key, kvh) : 0;
}

// paged_row_offset in two steps, for a read a tile ahead: this thread's row's page (the global read; -1 past `valid`),
// then its offset, computed where it is used so the read's latency passes under the work between them.
template <class P>
__device__ __forceinline__ int paged_row_page(const P& p, int page_base, int key0, int valid, int tid) {
  const int r = paged_row(tid);
  return r < valid ? kv::Paged::page(p, page_base, key0 + r, true) : -1;
}
template <class P> __device__ __forceinline__ i64 paged_row_at(const P& p, int page, int key0, int kvh, int tid) {
  return page >= 0 ? kv::Paged::offset(p, page, key0 + paged_row(tid), kvh) : 0;
}

// A paged K or V tile into stage buffer `dst`: once `empty` let the stage be refilled (fill `n`), each producer
// thread issues its rows' cp.async copies (rows at and past `valid` zero-filled) and arrives on `full` when they have
// landed (cp.async.mbarrier.arrive.noinc: `full` expects all 128 producer threads). Nothing waits here, so the copies
// of later tiles stream while these are in flight; the consumers fence the proxies after their wait (mbarrier.cuh).
template <class T>
__device__ __forceinline__ void load_paged_tile(u32 dst, u32 full, u32 empty, int n, const T* base, i64 row_offset,
                                                int valid, int tid) {
  if (n > 0) sm90::mbar_wait(empty, (n - 1) & 1);
  const int c = tid % 8, r0 = tid / 8, left = valid - r0;
  const u32 s0 = dst + sm90::Sw128Tile<kBlockN>::chunk_offset(r0, c);
  int lane = (tid % 32) / 8;  // (row r0 + 16 i: lane (tid % 32) / 8 + 4 i read it)
#pragma unroll 4
  for (int i = 0; i < kPagedRows; ++i, lane += 4) {
    const i64 off = __shfl_sync(0xffffffffu, row_offset, lane);
    const bool ok = 16 * i < left;
    const T* g = base + (ok ? off + c * 8 : 0);
    cp_async_16(s0 + i * 2048, g, ok);
    cp_async_16(s0 + i * 2048 + sm90::Sw128Tile<kBlockN>::kBlockBytes, g + (ok ? 64 : 0), ok);
  }
  sm90::mbar_arrive_cp_async(full);
}

// One ragged K or V tile into stage buffer `dst` (ready on barrier `full` once `empty` let the stage be refilled; `n`
// = the stage's fill count): TMA for a whole tile, cp.async with zero fill for one that crosses the unit's last key.
// Every producer thread waits for `empty` on every tile, TMA tiles included: a parity wait only tells the phase it
// asks for from the one before, so a thread that skipped waits and asked for a later fill's parity would see an older
// phase complete and overwrite a stage still being read.
template <class T>
__device__ __forceinline__ void load_tile(u32 dst, u32 full, u32 empty, int n, bool whole, const sm90::TmaDesc* map,
                                          const T* base, i64 stride, int head, int row, int valid, int tid) {
  if (n > 0) sm90::mbar_wait(empty, (n - 1) & 1);
  if (whole) {
    if (tid == 0) {
      sm90::mbar_arrive_expect_tx(full, Shape<128>::kTileBytes);
      sm90::tma_load_3d(dst, map, full, 0, head, row);
      sm90::tma_load_3d(dst + sm90::Sw128Tile<kBlockN>::kBlockBytes, map, full, 64, head, row);
    }
    return;
  }
  copy_tile_zfill<T>(dst, base + row * stride, stride, valid, tid);
  cp_async_commit();
  cp_async_wait<0>();
  sm90::fence_proxy_async();  // (generic-proxy writes, read by the async proxy of wgmma)
  sm90::named_barrier_sync(kProducerBarrier, 128);
  if (tid == 0) sm90::mbar_arrive(full);
}

// ---- fp8 K / V ---------------------------------------------------------------------------------------------------
// A tile of fp8 K or V is 128 rows of 128 bytes, staged row-major (chunk c of row r at r * 128 + c * 16) in a ring of
// kStages K and kStages V tiles after the 16-bit rings. A paged cache whose page size is not a multiple of 16 (the
// TMA staging's boxes below need 16 slots of one page; shorter boxes, and one warp issuing all the cp.async copies,
// measured slower: docs/results/h200-2026-12-03g) stages with cp.async: thread t stages chunk c = t % 8 of rows
// r0 + 16 i (i < 8, fp8_row; rows at and past `valid` zero-filled), and later converts exactly those chunks: 16 fp8
// elements into 16-bit chunks 2c and 2c + 1 of the row in the swizzled stage, so it waits for its own copies only.
// The eight threads of a quarter-warp take chunks 0-3 of one row and 4-7 of the next (or the other way round): their
// 16-bit chunks 2c (then 2c + 1) are 4 in each 128-byte column block, at in-block indices of both parities (the
// swizzle XORs them with r % 8), so each store hits 8 distinct bank groups; and the 8 staged chunks they read are 128
// contiguous bytes.
constexpr int kFp8TileBytes = kBlockN * 128;

__device__ __forceinline__ int fp8_row(int tid) {
  const int q = tid / 8;  // quarter-warp: rows 2 (q / 2) and 2 (q / 2) + 1 of the pass, chunks by the lane's half
  return (q & ~1) | (((tid % 8) >> 2) ^ (q & 1));
}

// The rows of a paged tile: this warp's row offsets (paged_row_at), shuffled to the row's copiers.
__device__ __forceinline__ void stage_fp8_tile(u32 dst8, const unsigned char* base, i64 paged_row, int valid, int tid) {
  const int c = tid % 8, r0 = fp8_row(tid), left = valid - r0;
  const u32 s0 = dst8 + r0 * 128 + c * 16;
  int lane = r0 % 4;  // (the offset of row r0 + 16 i was read by lane r0 % 4 + 4 i of this warp: paged_row)
#pragma unroll 4
  for (int i = 0; i < kPagedRows; ++i, lane += 4) {
    const i64 off = __shfl_sync(0xffffffffu, paged_row, lane);
    const bool ok = 16 * i < left;
    cp_async_16(s0 + i * 2048, base + (ok ? off + c * 16 : 0), ok);
  }
}

// Converts this thread's chunks of the staged fp8 tile at `src8` into the float16 stage at `dst`: pairs of bytes as
// float16 values (fp8::k_pairs: one cvt.rn.f16x2.e4m3x2 per pair on sm_90, F2FP; e5m2, a float16's upper byte: one
// byte permute), reading kBatch chunks before converting them: all 8 of its chunks of the tile, so the shared loads'
// latency is paid once per tile (the producer's 88 registers hold them; 2 chunks at a time, as the 64 registers
// allowed, measured 4-5 % slower on P4-P6 over e4m3, docs/results/h200-2026-12-03f). V converts like K: e4m3 V
// through fp8.cuh's integer bit path (three integer ops per pair, leaving the conversion pipe to the consumers' P
// packing) measured 2-2.5 % slower (docs/results/h200-2026-12-03d).
template <class F8, int kBatch = 8>
__device__ __forceinline__ void convert_fp8_tile(u32 dst, u32 src8, int tid) {
  const int c = tid % 8, r0 = fp8_row(tid);
  // rows r0 + 16 i share the swizzle (r % 8): row 0's addresses plus i * 2048, in the staging tile and in the stage
  const u32 src = src8 + r0 * 128 + c * 16;
  const u32 first = dst + sm90::Sw128Tile<kBlockN>::chunk_offset(r0, 2 * c);
  const u32 second = dst + sm90::Sw128Tile<kBlockN>::chunk_offset(r0, 2 * c + 1);
#pragma unroll
  for (int i0 = 0; i0 < kPagedRows; i0 += kBatch) {
    uint4 x[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(x[j].x), "=r"(x[j].y), "=r"(x[j].z), "=r"(x[j].w) : "r"(src + (i0 + j) * 2048));
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const u32 off = (i0 + j) * 2048;
      u32 o[8];
      fp8::k_pairs<F8>(x[j].x, o[0], o[1]);  // (bytes (0, 1), (2, 3): fp8::F16sK<F8>::kPow is 0 on sm_90)
      fp8::k_pairs<F8>(x[j].y, o[2], o[3]);
      fp8::k_pairs<F8>(x[j].z, o[4], o[5]);
      fp8::k_pairs<F8>(x[j].w, o[6], o[7]);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(first + off), "r"(o[0]), "r"(o[1]), "r"(o[2]),
                   "r"(o[3]) : "memory");
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(second + off), "r"(o[4]), "r"(o[5]), "r"(o[6]),
                   "r"(o[7]) : "memory");
    }
  }
}

// Tile `tile`'s staged K (or V) into its float16 stage at `dst` once the consumers freed it (`empty`, fill n), then this
// thread arrives on `full` (an fp8 kernel's full barriers expect all 128 producer threads). The consumers fence the
// proxies after their wait (mbarrier.cuh): a fence here (MEMBAR.ALL.CTA) would also wait for this thread's cp.async
// copies of the next tile, issued just before.
template <class F8>
__device__ __forceinline__ void convert_fp8_stage(u32 dst, u32 src8, u32 full, u32 empty, int tile, int tid) {
  const int n = tile / kStages;
  if (n > 0) sm90::mbar_wait(empty, (n - 1) & 1);
  if (SM90_PROBE_CONVERT) convert_fp8_tile<F8>(dst, src8, tid);  // (0 only in a lab bound probe: sm90_probe.cuh)
  sm90::mbar_arrive(full);
}

// The fp8 K / V tiles of unit `w` (KV head kvh), tiles tile .. tile + w.n_tiles - 1 of the ring: staged with cp.async
// and converted into the float16 stages (the fp8 section above). Returns the ring's tile count after the unit.
template <class KVT, class KV, class P>
__device__ __forceinline__ int produce_fp8_unit(const P& p, const Bars& bars, const Unit& w, u32 sk, u32 sv, u32 s8,
                                                int kvh, int tile, int tid) {
  constexpr int D = 128;
  // Per tile i: stage K(i), convert K(i - 1), convert V(i - 2), stage V(i) (V's staging slot is free once V(i - 2)
  // is converted). K runs a tile ahead of V: the consumers free a stage's K half a tile before its V (k_empty after
  // Q K^T, v_empty after the P V one tile later), and a K tile is needed a tile before its V.
  // Copy groups per thread, oldest first: K(i - 1), V(i - 1), K(i): two newer than K(i - 1).
  const unsigned char* k8 = static_cast<const unsigned char*>(p.k);
  const unsigned char* v8 = static_cast<const unsigned char*>(p.v);
  // Each tile's page-table entry is read a tile ahead (page_next), so its latency passes under the conversions
  // instead of stalling the copies that need it.
  static_assert(KV::kPaged, "ragged fp8 K / V is staged by TMA (produce_fp8_unit_tma)");
  const int t0 = tile, n_tiles = w.n_tiles;
  int page_next = -1;
  {
    const int key_first = w.t_first * kBlockN;
    if (n_tiles > 0) page_next = paged_row_page(p, w.k0, key_first, w.key_hi - key_first, tid);
  }
  for (int i = 0; i <= n_tiles; ++i) {
    i64 row = 0;
    int key0 = 0, valid = 0;
    if (i < n_tiles) {
      key0 = (w.t_first + i) * kBlockN;
      valid = w.key_hi - key0;
      row = paged_row_at(p, page_next, key0, kvh, tid);  // (offsets from the cache's base)
      if (i + 1 < n_tiles) page_next = paged_row_page(p, w.k0, key0 + kBlockN, valid - kBlockN, tid);
      SM90_PROBE_START(probe_s);
      if (SM90_PROBE_STAGE) {  // (0 only in a lab bound probe: sm90_probe.cuh)
        stage_fp8_tile(s8 + ((t0 + i) % kStages) * kFp8TileBytes, k8, row, valid, tid);
      }
      cp_async_commit();
      SM90_PROBE_STOP(probe_s, 4);
    }
    if (i >= 1) {
      const int tk = t0 + i - 1, s = tk % kStages;
      SM90_PROBE_START(probe_w);
      if (i < n_tiles) {
        cp_async_wait<2>();
      } else {
        cp_async_wait<1>();
      }
      SM90_PROBE_STOP(probe_w, 3);
      SM90_PROBE_START(probe_k);
      convert_fp8_stage<KVT>(sk + s * Shape<D>::kTileBytes, s8 + s * kFp8TileBytes, bars.k_full(s), bars.k_empty(s),
                             tk, tid);
      SM90_PROBE_STOP(probe_k, 1);
    }
    if (i >= 2) {
      const int tv = t0 + i - 2, s = tv % kStages;
      SM90_PROBE_START(probe_v);
      convert_fp8_stage<KVT>(sv + s * Shape<D>::kTileBytes, s8 + (kStages + s) * kFp8TileBytes, bars.v_full(s),
                             bars.v_empty(s), tv, tid);
      SM90_PROBE_STOP(probe_v, 2);
    }
    if (i < n_tiles) {
      SM90_PROBE_START(probe_sv);
      if (SM90_PROBE_STAGE) {
        stage_fp8_tile(s8 + (kStages + (t0 + i) % kStages) * kFp8TileBytes, v8, row, valid, tid);
      }
      cp_async_commit();
      SM90_PROBE_STOP(probe_sv, 6);
    }
  }
  if (n_tiles > 0) {
    const int tv = t0 + n_tiles - 1, s = tv % kStages;
    cp_async_wait<0>();
    convert_fp8_stage<KVT>(sv + s * Shape<D>::kTileBytes, s8 + (kStages + s) * kFp8TileBytes, bars.v_full(s),
                           bars.v_empty(s), tv, tid);
  }
  return t0 + n_tiles;
}

// ---- fp8 K / V staged by TMA (STAGE_TMA: ragged K / V, or a paged cache whose page size is a multiple of 16) --------
// Warp 0 of the producer only issues: the staging copies as TMA boxes, and the unit's Q. Warps 1-3 (96 threads) only
// convert. Issuing a copy stalls the issuing warp (~100 cycles per cp.async instruction here, and TMA boxes alike:
// docs/results/h200-2026-12-03g), so the issuing warp does nothing else and runs ahead of the converters on barriers
// alone: a staging slot's full barrier (one arrival with the expected bytes) and its empty barrier (the 96 converters
// arrive after converting it). With all 128 threads both issuing and converting, each thread's conversions waited
// behind its copies: 1.13-1.18x the time on P4-P6 (cp.async); TMA boxes issued by warp 0 between producer barriers
// were no faster. Boxes: ragged, lane 0 one box of 128 rows (rows past the tensor read as zeros); paged, lanes 0-7
// one box of 16 rows each (keys key0 + 16 j .. + 15 lie in one page), each lane's page read a tile ahead. Rows at and
// past `valid` (another request's keys, or a page's stale slots) are converted as zeros.
constexpr int kConverters = 96;

// The staging slots' barriers after the unit slot: full then empty, K slots then V slots.
struct StagedBars {
  u32 base;
  __device__ u32 k_full(int s) const { return base + 8 * s; }
  __device__ u32 v_full(int s) const { return base + 8 * (kStages + s); }
  __device__ u32 k_empty(int s) const { return base + 8 * (2 * kStages + s); }
  __device__ u32 v_empty(int s) const { return base + 8 * (3 * kStages + s); }
};

template <class KV, class P>
__device__ __forceinline__ void stage_fp8_tma(const P& p, u32 dst8, u32 bar, const sm90::TmaDesc* map, int kvh,
                                              int row0, int key0, int valid, int page, int lane) {
  if constexpr (KV::kPaged) {
    const int boxes = min(kBlockN / 16, (valid + 15) / 16);
    if (lane == 0) sm90::mbar_arrive_expect_tx(bar, boxes * 16 * 128);
    __syncwarp();
    if (lane < boxes) {
      const int key = key0 + 16 * lane;
      const int slot = key - static_cast<int>(fast_div(static_cast<u32>(key), p.page_mul, p.page_shift)) * p.page_size;
      sm90::tma_load_4d(dst8 + lane * 16 * 128, map, bar, 0, kvh, slot, page);
    }
  } else {
    if (lane == 0) {
      sm90::mbar_arrive_expect_tx(bar, kFp8TileBytes);
      sm90::tma_load_3d(dst8, map, bar, 0, kvh, row0 + key0);
    }
  }
}

// convert_fp8_tile by the 96 converters (cid = tid - 32): the tile's 32 warp-wide jobs, job j = 4 a + b taking the
// chunks lane l of warp a takes in convert_fp8_tile for rows r0 + 16 b (so each store instruction hits the same bank
// groups), converter warp W doing jobs W + 3 k (11, 11 and 10 jobs), all its chunks read before any is converted.
// Lane l's row of job j is fp8_row(l) + 4 a + 16 b, whose swizzle (r % 8) depends on a's parity only: two base
// addresses per destination chunk, the rest immediates. kMask: rows at and past `valid` as zeros.
template <class F8, bool kMask, int W>
__device__ __forceinline__ void convert_fp8_tile_w(u32 dst, u32 src8, int lane, int valid) {
  constexpr int kJobs = (32 - W + 2) / 3;
  using Tile = sm90::Sw128Tile<kBlockN>;
  const int c = lane % 8, rl = fp8_row(lane);  // (rl < 4)
  const u32 src = src8 + rl * 128 + c * 16;
  const int left = valid - rl;
  const u32 first[2] = {dst + Tile::chunk_offset(rl, 2 * c), dst + Tile::chunk_offset(rl + 4, 2 * c) - 4 * 128};
  const u32 second[2] = {dst + Tile::chunk_offset(rl, 2 * c + 1),
                         dst + Tile::chunk_offset(rl + 4, 2 * c + 1) - 4 * 128};
  uint4 x[kJobs];
#pragma unroll
  for (int k = 0; k < kJobs; ++k) {
    const int j = W + 3 * k, a = j % 4, b = j / 4;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x[k].x), "=r"(x[k].y), "=r"(x[k].z), "=r"(x[k].w) : "r"(src + (4 * a + 16 * b) * 128));
  }
#pragma unroll
  for (int k = 0; k < kJobs; ++k) {
    const int j = W + 3 * k, a = j % 4, b = j / 4;
    u32 o[8];
    fp8::k_pairs<F8>(x[k].x, o[0], o[1]);
    fp8::k_pairs<F8>(x[k].y, o[2], o[3]);
    fp8::k_pairs<F8>(x[k].z, o[4], o[5]);
    fp8::k_pairs<F8>(x[k].w, o[6], o[7]);
    if constexpr (kMask) {
      if (4 * a + 16 * b >= left) {  // (row rl + 4 a + 16 b at or past `valid`)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = 0u;
      }
    }
    const u32 off = (4 * a + 16 * b) * 128;
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(first[a & 1] + off), "r"(o[0]), "r"(o[1]),
                 "r"(o[2]), "r"(o[3]) : "memory");
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(second[a & 1] + off), "r"(o[4]), "r"(o[5]),
                 "r"(o[6]), "r"(o[7]) : "memory");
  }
}

template <class F8, bool kMask>
__device__ __forceinline__ void convert_fp8_tile_by3(u32 dst, u32 src8, int cid, int valid) {
  const int w = cid / 32, lane = cid % 32;
  if (w == 0) {
    convert_fp8_tile_w<F8, kMask, 0>(dst, src8, lane, valid);
  } else if (w == 1) {
    convert_fp8_tile_w<F8, kMask, 1>(dst, src8, lane, valid);
  } else {
    convert_fp8_tile_w<F8, kMask, 2>(dst, src8, lane, valid);
  }
}

// A converter's part of tile `tile`: wait for its staging slot's boxes (`full`, fill tile / kStages) and the float16
// stage (`empty`), convert, arrive on the stage's full barrier and the slot's empty one.
template <class F8>
__device__ __forceinline__ void convert_fp8_staged(u32 dst, u32 src8, u32 staged_full, u32 staged_empty, u32 full,
                                                   u32 empty, int tile, int valid, int cid) {
  const int n = tile / kStages;
  SM90_PROBE_START(probe_a);
  sm90::mbar_wait(staged_full, n & 1);
  SM90_PROBE_STOP_BY(probe_a, 3, 32);
  SM90_PROBE_START(probe_e);
  if (n > 0) sm90::mbar_wait(empty, (n - 1) & 1);
  SM90_PROBE_STOP_BY(probe_e, 7, 32);
  if (valid >= kBlockN) {
    convert_fp8_tile_by3<F8, false>(dst, src8, cid, valid);
  } else {
    convert_fp8_tile_by3<F8, true>(dst, src8, cid, valid);
  }
  sm90::mbar_arrive(full);
  sm90::mbar_arrive(staged_empty);
}

// The n_q-th unit's Q, by thread 0: waiting for the consumers to be done with the previous one (wait_q: the caller
// may have waited already), then the unit slot and Q's two boxes.
__device__ __forceinline__ void load_unit_q(const Bars& bars, const Unit& w, Unit* slot, u32 sq,
                                            const sm90::TmaDesc* tm_q, int n_q, bool wait_q) {
  SM90_PROBE_START(probe_q);
  if (wait_q && n_q > 0) sm90::mbar_wait(bars.q_empty(), (n_q - 1) & 1);
  SM90_PROBE_STOP(probe_q, 5);
  *slot = w;  // (read by the consumers after q_full)
  sm90::mbar_arrive_expect_tx(bars.q_full(), Shape<128>::kQBytes);
  sm90::tma_load_3d(sq, tm_q, bars.q_full(), 0, w.head, w.q0 + w.row0);
  sm90::tma_load_3d(sq + sm90::Sw128Tile<kBlockM>::kBlockBytes, tm_q, bars.q_full(), 64, w.head, w.q0 + w.row0);
}

// The fp8 K / V tiles of unit `w` staged by TMA (tm_k / tm_v: byte maps of K / V) and converted; the issuing warp
// also loads the unit's Q (load_unit_q), after the unit's first K and V boxes so the wait for the consumers to leave
// the previous Q does not hold them back. Returns the ring's tile count after the unit.
template <class KVT, class KV, class P>
__device__ __forceinline__ int produce_fp8_unit_tma(const P& p, const Bars& bars, const StagedBars& st, const Unit& w,
                                                    Unit* slot, u32 sq, u32 sk, u32 sv, u32 s8,
                                                    const sm90::TmaDesc* tm_q, const sm90::TmaDesc* tm_k,
                                                    const sm90::TmaDesc* tm_v, int kvh, int n_q, int tile, int tid) {
  constexpr int D = 128;
  const int t0 = tile, n_tiles = w.n_tiles;
  if (tid < 32) {
    const int lane = tid;
    if (n_tiles == 0 && lane == 0) load_unit_q(bars, w, slot, sq, tm_q, n_q, true);
    int page = -1;  // (paged: lane j < 8, the page of keys key0 + 16 j of the tile being issued)
    if constexpr (KV::kPaged) {
      const int key = w.t_first * kBlockN + 16 * lane;
      if (lane < kBlockN / 16 && n_tiles > 0) page = kv::Paged::page(p, w.k0, key, key < w.key_hi);
    }
    for (int i = 0; i < n_tiles; ++i) {
      const int g = t0 + i, s = g % kStages, n = g / kStages;
      const int key0 = (w.t_first + i) * kBlockN, valid = w.key_hi - key0;
      int page_next = -1;
      if constexpr (KV::kPaged) {
        const int key = key0 + kBlockN + 16 * lane;
        if (lane < kBlockN / 16 && i + 1 < n_tiles) page_next = kv::Paged::page(p, w.k0, key, key < w.key_hi);
      }
      SM90_PROBE_START(probe_s);
      if (n > 0) sm90::mbar_wait(st.k_empty(s), (n - 1) & 1);
      stage_fp8_tma<KV>(p, s8 + s * kFp8TileBytes, st.k_full(s), tm_k, kvh, w.k0, key0, valid, page, lane);
      SM90_PROBE_STOP(probe_s, 4);
      SM90_PROBE_START(probe_sv);
      if (n > 0) sm90::mbar_wait(st.v_empty(s), (n - 1) & 1);
      stage_fp8_tma<KV>(p, s8 + (kStages + s) * kFp8TileBytes, st.v_full(s), tm_v, kvh, w.k0, key0, valid, page,
                        lane);
      SM90_PROBE_STOP(probe_sv, 6);
      if (i == 0 && lane == 0) load_unit_q(bars, w, slot, sq, tm_q, n_q, true);
      __syncwarp();
      page = page_next;
    }
  } else {
    // per tile i: convert K(i - 1), then V(i - 2): K runs a tile ahead of V, as the consumers need them
    const int cid = tid - 32;
    for (int i = 1; i <= n_tiles + 1; ++i) {
      if (i <= n_tiles) {
        const int tk = t0 + i - 1, s = tk % kStages;
        SM90_PROBE_START(probe_k);
        convert_fp8_staged<KVT>(sk + s * Shape<D>::kTileBytes, s8 + s * kFp8TileBytes, st.k_full(s), st.k_empty(s),
                                bars.k_full(s), bars.k_empty(s), tk, w.key_hi - (w.t_first + i - 1) * kBlockN, cid);
        SM90_PROBE_STOP_BY(probe_k, 1, 32);
      }
      if (i >= 2) {
        const int tv = t0 + i - 2, s = tv % kStages;
        SM90_PROBE_START(probe_v);
        convert_fp8_staged<KVT>(sv + s * Shape<D>::kTileBytes, s8 + (kStages + s) * kFp8TileBytes, st.v_full(s),
                                st.v_empty(s), bars.v_full(s), bars.v_empty(s), tv,
                                w.key_hi - (w.t_first + i - 2) * kBlockN, cid);
        SM90_PROBE_STOP_BY(probe_v, 2, 32);
      }
    }
  }
  return t0 + n_tiles;
}

// KVT: the element type of K / V (T, or an fp8 type staged and converted to TM, the math's type); s8: the fp8
// staging ring (fp8 only).
// kStageTma: fp8 tiles staged by TMA (produce_fp8_unit_tma; `staged`: its barriers and pages).
template <class T, class TM, class KVT, bool kStageTma, class V, class KV, class P, class VP>
__device__ __forceinline__ void produce(const P& p, const VP& vp, const Bars& bars, u32 sq, u32 sk, u32 sv, u32 s8,
                                        u32 staged, Unit* slot, int* bcast, const sm90::TmaDesc* tm_q,
                                        const sm90::TmaDesc* tm_k, const sm90::TmaDesc* tm_v, int tid) {
  constexpr int D = 128;
  constexpr bool kFp8 = fp8::IsFp8<KVT>::value;
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
    constexpr bool kLateQ = kStageTma;  // (produce_fp8_unit_tma loads Q after the unit's first boxes)
    SM90_PROBE_START(probe_q);
    if (tid == 0 && n_q > 0 && (!kLateQ || it < 0)) {
      sm90::mbar_wait(bars.q_empty(), (n_q - 1) & 1);  // the consumers are done with Q
    }
    SM90_PROBE_STOP(probe_q, 5);
    if (it < 0) {
      if (tid == 0) {
        slot->n_tiles = -1;
        sm90::mbar_arrive(bars.q_full());
        if (in_pool) plan::leave_pool(static_cast<int*>(p.pool_count), static_cast<u32>(num_ctas));
      }
      if constexpr (KV::kPaged && !kFp8) {  // (no thread leaves with its copies in flight)
        cp_async_commit();
        cp_async_wait<0>();
      }
      break;
    }
    const Unit w = resolve_unit<V, KV>(p, vp, it, D);
    if (!kLateQ && tid == 0) load_unit_q(bars, w, slot, sq, tm_q, n_q, false);  // (q_empty waited above)
    const int kvh = w.head / p.group_size;
    // ragged tiles: rows are global token indices (as the TMA coordinates) from the KV head's base, kh / vh; paged
    // tiles: keys of the request, each row's address from the page table and the cache's base (k / v)
    const T* kh = k + kvh * p.k_stride_h;
    const T* vh = v + kvh * p.v_stride_h;
    if constexpr (kStageTma) {
      tile = produce_fp8_unit_tma<KVT, KV>(p, bars, StagedBars{staged}, w, slot, sq, sk, sv, s8, tm_q, tm_k, tm_v, kvh,
                                           n_q, tile, tid);
    } else if constexpr (kFp8) {
      tile = produce_fp8_unit<KVT, KV>(p, bars, w, sk, sv, s8, kvh, tile, tid);
    } else {
      for (int i = 0; i < w.n_tiles; ++i, ++tile) {
        const int s = tile % kStages, n = tile / kStages;
        const int key0 = (w.t_first + i) * kBlockN;
        const int valid = w.key_hi - key0;
        if constexpr (KV::kPaged) {
          const i64 row = paged_row_offset(p, w.k0, key0, kvh, valid, tid);
          SM90_PROBE_START(probe_k);
          load_paged_tile<T>(sk + s * Shape<D>::kTileBytes, bars.k_full(s), bars.k_empty(s), n, k, row, valid, tid);
          SM90_PROBE_STOP(probe_k, 1);
          SM90_PROBE_START(probe_v);
          load_paged_tile<T>(sv + s * Shape<D>::kTileBytes, bars.v_full(s), bars.v_empty(s), n, v, row, valid, tid);
          SM90_PROBE_STOP(probe_v, 2);
        } else {
          const bool whole = key0 + kBlockN <= w.key_hi;
          load_tile<T>(sk + s * Shape<D>::kTileBytes, bars.k_full(s), bars.k_empty(s), n, whole, tm_k, kh, p.k_stride_n,
                       kvh, w.k0 + key0, valid, tid);
          load_tile<T>(sv + s * Shape<D>::kTileBytes, bars.v_full(s), bars.v_empty(s), n, whole, tm_v, vh, p.v_stride_n,
                       kvh, w.k0 + key0, valid, tid);
        }
      }
    }
  }
}

}  // namespace prefill_sm90
}  // namespace cuinfer
