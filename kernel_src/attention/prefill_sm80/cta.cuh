// One CTA of the plan inside a launched block: its thread coordinates, shared-memory map, ldmatrix lane addresses,
// copy mapping and barrier. Everything here is fixed for the kernel's lifetime.
#pragma once
#include "common/ldst.cuh"
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "common/types.cuh"

namespace cuinfer {
namespace prefill {

// Item facts every warp reads now and then from shared memory (kept out of the registers the accumulators fill):
// the first 7 ints of the CTA's info block.
enum InfoField : int { kIKvBase, kIKvHead, kIQShift, kIKvLen, kIRow0, kIReq, kINextSlot };
// A warp's own ints (kWarpInts per warp, after the info block): its masking bounds and its copy facts.
//   kWUpper: keys >= this need the upper mask in some row; kWSkip: keys >= this are masked in every row (skip);
//   kWLower: keys < this need the lower mask in some row; kWBelow: keys < this are masked in every row;
//   kWKvBase, kWKvHead: kv_base and kvh for this warp's copies (readable before a barrier: its lane 0 wrote them);
//   kWKScale, kWVScale (fp8 K/V): the item's factors of the k / v scale arrays (float bits, 1 without arrays);
//   kWItem (fp8 K/V converted by the CTA, Traits::kConvert): the item being run (kernel.cuh run_item).
//   A logits variant's exact-path flag (kernel.cuh kStickyExact) takes kWKScale's int with 16-bit K/V and the int
//   after kWItem with fp8 converted by the CTA.
enum WarpField : int { kWUpper, kWSkip, kWLower, kWBelow, kWKvBase, kWKvHead, kWKScale, kWVScale, kWItem };

template <class C> struct Cta {
  // Paired blocks: thread group wg (the kThreads threads from wg * kThreads) is CTA 2 blockIdx.x + wg of the plan's
  // 2 gridDim.x, with its own shared memory, items and named barrier; nothing else is shared. Measured on the H200
  // (bench/lab/tune_prefill.py): +3-4 % on the ragged 128 x 64 tiles, 4-9 % slower on the paged and 64-row ones
  // (those keep one group per block).
  u32 wg, cta, num_ctas;
  unsigned char* smem;
  u32 q_smem, k_smem, v_smem;
  i64* page_off;
  int* info;
  int* table;
  // The thread within its group, taken modulo the group size in every build (the bound lets ptxas fold the copy and
  // table addressing: +3-4 % on the paged P4-P6 kernels, measured; the index is the same).
  int tid, lane, wq, wkv;
  int warp_row0;  // first tile row of this warp
  int warp_col0;  // first key of this warp within a KV tile
  // ldmatrix lane addresses for k-step 0 (item independent): A from Q, B from K (n-major), B from V (k-major, .trans).
  // fp8 K/V: q8_lane is the 8-byte Q fragment address of mainloop.cuh qk_tile_fp8 (row g, dims 4t .. 4t+3) and k_lane
  // the address of key `lane` of the warp's slice at chunk 0.
  u32 q_lane, k_lane, v_lane, q8_lane;
  // Copy mapping: thread -> chunks (tid % 8) + 8c of rows (tid / 8) + kRowsPerPass * i. Every row it touches has the
  // same row % 8, so its swizzled smem offsets are one base plus immediates: cp_qk_dst + i * pass + c * 128.
  int cp_row, cp_chunk;
  u32 cp_qk_dst, cp_vo_dst;
  // fp8 K / V copies (16-bit K / V use cp_row, cp_chunk, cp_qk_dst, cp_vo_dst): row kv_row + kKVRowsPerPass * i,
  // chunks kv_chunk + 8c; cp_k_dst / cp_v_dst their swizzled offsets (Loader::kv_row() etc. pick the set).
  int kv_row, kv_chunk;
  u32 cp_k_dst, cp_v_dst;

  __device__ __forceinline__ void init(unsigned char* smem_block) {
    constexpr int NT = C::kThreads, GROUPS = C::kGroups, MMA_Q = C::kMmaQ, MMA_KV = C::kMmaKV;
    wg = GROUPS > 1 ? threadIdx.x / NT : 0u;
    cta = GROUPS > 1 ? blockIdx.x * 2u + wg : blockIdx.x;
    num_ctas = GROUPS > 1 ? gridDim.x * 2u : gridDim.x;
    smem = smem_block + (GROUPS > 1 ? wg * C::kGroupBytes : 0u);
    const u32 smem_base = mma::smem_addr(smem);
    q_smem = smem_base;
    k_smem = smem_base + C::kKOff;
    v_smem = smem_base + C::kVOff;
    page_off = reinterpret_cast<i64*>(smem + C::kPageOff);
    info = reinterpret_cast<int*>(smem + C::kInfoOff);
    table = reinterpret_cast<int*>(smem + C::kTableOff);
    const u32 ltid = threadIdx.x % NT;
    tid = static_cast<int>(ltid), lane = static_cast<int>(threadIdx.x % 32u);
    wq = static_cast<int>((ltid / 32u) % C::kWarpsQ), wkv = static_cast<int>(ltid / 32u / C::kWarpsQ);
    warp_row0 = wq * MMA_Q * 16;
    warp_col0 = wkv * MMA_KV * 16;
    using LdQK = LdmatrixAddr<C::kChunksQK>;
    using LdVO = LdmatrixAddr<C::kChunksVMma>;
    q_lane = LdQK::make(q_smem, warp_row0 + lane % 16, lane / 16);
    if constexpr (C::kKV8 && !C::kConvert) {
      q8_lane = LdQK::make(q_smem, warp_row0 + lane / 4, (lane % 4) / 2) + (lane % 2) * 8;
      k_lane = k_smem + Swizzle<C::kChunksK>::byte_offset(warp_col0 + lane, 0);
    } else {  // (kConvert: the 16-bit K and V tiles, one each)
      const u32 k16 = C::kConvert ? smem_base + C::kK16Off : k_smem;
      k_lane = LdQK::make(k16, warp_col0 + lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
    }
    // (fp8 .trans x4: the same rows and halves)
    v_lane = LdVO::make(C::kConvert ? smem_base + C::kV16Off : v_smem, warp_col0 + lane % 16, lane / 16);
    cp_row = tid / 8, cp_chunk = tid % 8;
    cp_qk_dst = cp_row * (C::kChunksQK * 16) + ((cp_chunk ^ (cp_row % 8)) * 16);
    cp_vo_dst = cp_row * (C::kChunksVO * 16) + ((cp_chunk ^ (cp_row % 8)) * 16);
    if constexpr (C::kKV8) {
      if constexpr (C::kKVPairRows) {
        // lanes 4 q .. 4 q + 3: row (q / 2) + 4 (q % 2) of the warp's 8, chunks lane % 4 and lane % 4 + 4: the 8 lanes
        // of a 16-byte phase (rows r, r + 4) write slots {0..3} ^ r % 8 and that ^ 4, one 128-byte line; the 16 of an
        // 8-byte phase of the conversion take rows r, r + 4, r + 1, r + 5 (convert_tile's half order)
        const int q = lane / 4;
        kv_row = (tid / 32) * 8 + ((q >> 1) | ((q & 1) << 2)), kv_chunk = tid % 4;
      } else {
        kv_row = tid / C::kKVThreadsPerRow, kv_chunk = tid % C::kKVThreadsPerRow;
      }
      cp_k_dst = Swizzle<C::kChunksK>::byte_offset(kv_row, kv_chunk);
      cp_v_dst = Swizzle<C::kChunksVO>::byte_offset(kv_row, kv_chunk);
    }
  }

  // The group's barrier: named barrier 1 + wg of its kThreads threads in a paired block, else the block's.
  __device__ __forceinline__ void sync() const {
    if constexpr (C::kGroups > 1) {
      asm volatile("bar.sync %0, %1;" ::"r"(1 + wg), "n"(C::kThreads) : "memory");
    } else {
      __syncthreads();
    }
  }

  __device__ __forceinline__ int* warp_ints() const { return info + C::kInfoInts + C::kWarpInts * (tid / 32); }
  // The work range being run, [sched[0], sched[1]), and the pool, [sched[2], sched[3]): written by thread 0 between two
  // barriers and read from smem where needed (fewer registers across the KV loop).
  __device__ __forceinline__ int* sched() const { return info + 8; }

  // Cross-item: whether the item after `item` (in table slot `slot`) is in this table and this range, i.e. whether
  // `item` starts it. (A volatile read of the range end each time: not kept in a register across the loop.)
  __device__ __forceinline__ bool next_in_table(int item, int slot) const {
    return slot + 1 < C::kTableItems && item + 1 < lds_volatile(sched() + 1);
  }
};

}  // namespace prefill
}  // namespace cuinfer
