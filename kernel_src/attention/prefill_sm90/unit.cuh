// Hopper prefill (wgmma + TMA): the block's shared-memory layout, its barriers, and the work unit one item of the plan
// becomes. The planner plans sm90 prefill with one query head per item (group 1: the item's "KV head" is its query
// head, cuinfer/prefill/sm90.py), 128-row query tiles and 128-key granules, so a unit is 128 query rows of one head
// of one request over a KV range whose pieces (split items) are cut on tile boundaries.
#pragma once
#include "common/types.cuh"
#include "common/wgmma.cuh"
#include "kv/paged.cuh"
#include "kv/ragged.cuh"
#include "plan/work.cuh"

namespace cuinfer {
namespace prefill_sm90 {

constexpr int kBlockM = 128;  // query rows of a unit (64 per consumer warpgroup)
constexpr int kBlockN = 128;  // keys of a K / V tile
constexpr int kStages = 2;    // K / V ring (3 measured no faster: docs/results/h200-2026-12-02g)
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
// setmaxnreg moves registers between the warpgroups inside the block's allocation (168 per thread at 384 threads: ptxas
// rounds 65536 / 384 down to a multiple of 8); an increase that the pool cannot cover blocks forever.
constexpr int kProducerRegs = 56;
constexpr int kConsumerRegs = 224;
// fp8 K / V: the producer converts the tiles (its item walk, the staging copies' state and a whole tile's chunks,
// 32 registers); at 208 registers the fp8 specialisations that CI compiles are spill-free (tests/compile)
constexpr int kProducerRegsFp8 = 88;
constexpr int kConsumerRegsFp8 = 208;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 168 * kThreads &&
                  128 * kProducerRegsFp8 + 256 * kConsumerRegsFp8 <= 168 * kThreads,
              "the warpgroups' registers after setmaxnreg must fit the block's allocation");

template <int D> struct Shape {
  static_assert(D == 128, "the sm90 prefill kernel is built for head_dim 128");
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kTileBytes = kBlockN * D * 2;  // one K or V tile (16-bit)
  // (the block's dynamic shared memory, Q, the rings, Bars, the unit slot and the item broadcast behind 1024 bytes of
  // alignment, is cuinfer/prefill/sm90.py's SMEM_BYTES)
};

// mbarriers (8 bytes each) after the tiles
struct Bars {
  u32 base;
  __device__ u32 q_full() const { return base; }
  __device__ u32 q_empty() const { return base + 8; }
  __device__ u32 k_full(int s) const { return base + 8 * (2 + s); }
  __device__ u32 v_full(int s) const { return base + 8 * (2 + kStages + s); }
  __device__ u32 k_empty(int s) const { return base + 8 * (2 + 2 * kStages + s); }
  __device__ u32 v_empty(int s) const { return base + 8 * (2 + 3 * kStages + s); }
  __device__ u32 end() const { return base + 8 * (2 + 4 * kStages); }
};

// One item as the kernel runs it. Keys [t_first * kBlockN, key_hi) are loaded; tiles inside [mask_lo, mask_hi) need
// no range mask. k0: the request's first K / V row (ragged) or page-table entry (paged). n_tiles < 0 marks the end of
// the CTA's work.
struct Unit {
  int req, head, row0, q0, qo_len, k0, kv_len;
  int key_hi, mask_lo, mask_hi, t_first, n_tiles, partial;
};

// Item `it` of the plan as a unit: the variant's key ranges of its first and last rows (monotone in the row, as
// causal and window are) bound the keys it loads, within the item's KV range [kv_start, kv_end) (a split item's
// piece). Pieces are cut at multiples of kBlockN (the planner's granule); only a window's lower bound starts an item
// off a tile, and the keys below it are masked by the window itself.
template <class V, class KV, class P, class VP>
__device__ __forceinline__ Unit resolve_unit(const P& p, const VP& vp, int it, int head_dim) {
  Unit w;
  const plan::ItemRef ref = plan::item_ref(p, it);
  w.head = ref.kv_head;  // (one query head per item)
  w.partial = ref.partial;
  w.req = plan::req(p, ref.entry);
  const int* qo_indptr = static_cast<const int*>(p.qo_indptr);
  const int* kv_indptr = static_cast<const int*>(p.kv_indptr);
  w.q0 = qo_indptr[w.req];
  w.qo_len = qo_indptr[w.req + 1] - w.q0;
  w.k0 = kv_indptr[w.req];
  w.kv_len = KV::len(p, w.req, w.k0);
  w.row0 = plan::qo_tile(p, ref.entry) * kBlockM;
  const int kv_start = plan::kv_start(p, ref.entry), kv_end = min(plan::kv_end(p, ref.entry), w.kv_len);
  const int diag = w.kv_len - w.qo_len, r_last = min(w.row0 + kBlockM, w.qo_len) - 1;
  const int kvh = w.head / p.group_size;
  const variant::Index first{w.req, w.row0, w.row0 + diag, w.head, kvh, w.qo_len, w.kv_len, head_dim};
  const variant::Index last{w.req, r_last, r_last + diag, w.head, kvh, w.qo_len, w.kv_len, head_dim};
  int lo_f = variant::kNoLowerBound, hi_f = w.kv_len, lo_l = variant::kNoLowerBound, hi_l = w.kv_len;
  V::key_range(vp, first, lo_f, hi_f);
  V::key_range(vp, last, lo_l, hi_l);
  w.key_hi = max(0, min(kv_end, max(hi_f, hi_l)));
  const int key_lo = max(kv_start, min(w.key_hi, min(lo_f, lo_l)));
  w.mask_lo = max(lo_f, lo_l);
  w.mask_hi = min(w.key_hi, min(hi_f, hi_l));
  w.t_first = max(0, key_lo) / kBlockN;
  w.n_tiles = max(0, (w.key_hi + kBlockN - 1) / kBlockN - w.t_first);
  return w;
}

}  // namespace prefill_sm90
}  // namespace cuinfer
