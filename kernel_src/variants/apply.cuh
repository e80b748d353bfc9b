// Applying a variant's q / k transforms (RoPE) to tiles in shared memory: rows of D 16-bit elements in the swizzled
// layout of common/swizzle.cuh (chunk c of row r at slot r * D/8 + (c ^ r % 8)), as both the decode and the prefill
// kernels keep their K tiles. A thread owns a fixed rotate-half chunk pair (c, c + D/16) of the rows it transforms,
// so the DimStates of its 8 dimension pairs are computed once per kernel (pair_states).
#pragma once
#include "common/mma.cuh"
#include "common/swizzle.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"
#include "variants/contract.cuh"

namespace cuinfer {
namespace variant {

// The DimStates of dimension pairs 8c .. 8c+7 (c < D/16): each serves dims i and i + D/2.
template <class V, int D, class VP>
__device__ __forceinline__ void pair_states(const VP& v, int c, typename V::DimState (&s)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = V::dim_state(v, 8 * c + i, D);
}

// key_transform on row r (key `pos`) of the K tile `tile`, chunk pair c, given the PosStates of (pos, 8c + i).
template <class V, int D, class T, class VP>
__device__ __forceinline__ void key_transform_row(const VP& v, const Index& ix, T* tile, int r, int pos, int c,
                                                  const typename V::DimState (&s)[8],
                                                  const typename V::PosState (&kp)[8]) {
  constexpr int kChunks = D / 8;
  T* lo_p = tile + Swizzle<kChunks>::slot(r, c) * 8;
  T* hi_p = tile + Swizzle<kChunks>::slot(r, c + kChunks / 2) * 8;
  Vec<T, 8> lo, hi;
  lo.load(lo_p);
  hi.load(hi_p);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float x = to_float(lo[i]), y = to_float(hi[i]);
    lo[i] = from_float<T>(V::key_transform(v, s[i], kp[i], ix, pos, 8 * c + i, x, y));
    hi[i] = from_float<T>(V::key_transform(v, s[i], kp[i], ix, pos, 8 * c + i + D / 2, y, x));
  }
  lo.store(lo_p);
  hi.store(hi_p);
}

// The PosStates of key pos for dimension pairs 8c .. 8c+7.
template <class V, class VP>
__device__ __forceinline__ void pos_states(const VP& v, int c, int pos, const typename V::DimState (&s)[8],
                                           typename V::PosState (&kp)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) kp[i] = V::pos_state(v, s[i], 8 * c + i, pos);
}

// key_transform on rows [0, rows) of the K tile `tile` (row r is key key0 + r), kThreads threads from thread `tid`;
// the caller synchronises before and after. Thread tid owns chunk pair c = tid % (D/16), the one its `s` was made for.
// Every row's PosStates are computed exactly (prefill; decode advances them: KeyStates below).
template <class V, int D, int kThreads, class T, class VP>
__device__ __forceinline__ void key_transform_tile(const VP& v, const Index& ix, T* tile, int key0, int rows,
                                                   const typename V::DimState (&s)[8], int tid) {
  constexpr int kHalf = D / 16;
  static_assert(kThreads % kHalf == 0, "threads cover whole half rows");
  const int c = tid % kHalf;
  for (int r = tid / kHalf; r < rows; r += kThreads / kHalf) {
    typename V::PosState kp[8];
    if constexpr (V::kPosState) pos_states<V>(v, c, key0 + r, s, kp);
    key_transform_row<V, D>(v, ix, tile, r, key0 + r, c, s, kp);
  }
}

// A decode thread's transform states for K tiles of kTile keys: the DimStates of its dimension pairs 8c .. 8c+7
// (c = tid % (D/16)) and, with pos_advance, the PosStates of the distance between the rows of a tile it transforms
// (kThreads / (D/16) keys).
template <class V, int D, int kThreads, int kTile> struct KeyStates {
  static constexpr int kHalf = D / 16;
  static constexpr int kRowStep = kThreads / kHalf;
  static constexpr int kRows = (kTile + kRowStep - 1) / kRowStep;  // rows of a tile per thread, at most
  static_assert(kThreads % kHalf == 0, "threads cover whole half rows");
  typename V::DimState s[8];
  typename V::PosState step[8];

  // (also the q transform's: a thread's q chunks are its K chunk pair)
  template <class VP> __device__ __forceinline__ void init(const VP& v, int tid) {
    const int c = tid % kHalf;
    pair_states<V, D>(v, c, s);
    if constexpr (V::kPosAdvance) pos_states<V>(v, c, kRowStep, s, step);
  }

  // key_transform on rows [0, rows) of the K tile (row r is key key0 + r; rows <= kTile), as key_transform_tile;
  // with pos_advance the PosStates of this thread's first row are exact and each further row's come from pos_advance
  // by one step (at most kRows - 1 advances per tile, re-seeded exactly at every tile).
  template <class T, class VP>
  __device__ __forceinline__ void transform_tile(const VP& v, const Index& ix, T* tile, int key0, int rows,
                                                 int tid) const {
    if constexpr (!V::kPosAdvance) {
      key_transform_tile<V, D, kThreads>(v, ix, tile, key0, rows, s, tid);
    } else {
      const int c = static_cast<unsigned>(tid) % kHalf;
      const int r0 = static_cast<unsigned>(tid) / kHalf;
      typename V::PosState kp[8];
      pos_states<V>(v, c, key0 + r0, s, kp);
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int r = r0 + j * kRowStep;
        if (r >= rows) break;
        if (j > 0) {
#pragma unroll
          for (int i = 0; i < 8; ++i) V::pos_advance(v, s[i], 8 * c + i, kp[i], step[i]);
        }
        key_transform_row<V, D>(v, ix, tile, r, key0 + r, c, s, kp);
      }
    }
  }
};

// The q / k transforms on mma.sync m16n8k16 fragments in registers (the tensor-core decode kernel with one warp along
// the dims): no shared-memory round trip, no barrier. A thread's fragments of k-step kk hold, for each of its two
// rows (keys gid and gid + 8 of a B fragment from ldmatrix_x4; query rows gid and gid + 8 of an A fragment), dims
// 16 kk + 2 tig + {0, 1} and 16 kk + 8 + 2 tig + {0, 1}; rotate-half's partner of dim d < D/2 is d + D/2, the same
// register of k-step kk + D/32 of the same thread. So a thread owns D/8 dimension pairs, slot i = 4 kk' + j
// (kk' < D/32, j < 4) being pair 16 kk' + 8 (j / 2) + 2 tig + j % 2, and transforms them with no shuffle.
// States: a table in shared memory of every pair's DimState and, with pos_advance, the PosState of a distance of
// 8 keys (key gid -> gid + 8), filled once per CTA (init; the caller synchronises) and read per tile (a thread's 16
// pairs at D = 128 would hold 64 registers more than the shared-memory path's states). Per tile the PosStates of key
// gid are exact, gid + 8's advanced by one step (or exact without pos_advance). The transformed values are rounded
// to the 16-bit type T as the shared-memory path does.
template <class V, int D, int kTile> struct FragStates {
  static constexpr int kPairs = D / 8;
  static constexpr int kSteps = D / 32;  // k-steps of the low half
  // With pos_advance the PosStates of key gid carry over from tile to tile (one advance by the tile's kTile keys) while
  // the tiles continue each other's positions (an item's; a PosState depends on the position alone), exact again
  // every kReseed tiles and at any tile that does not continue the last: at most kReseed - 1 advances by a tile and
  // one by 8 between a key and its exact seed. 16 (not 4): a seed tile costs a carried one's work plus ~125
  // instructions per thread (the range reductions and the MUFU sin / cos), and the fused-RoPE decode on D6 runs
  // its rotation at the issue rate of 2 warps per scheduler; RoPE's sin / cos stay within ~7e-6 (docs/variants.md).
  // (Head dim 64 keeps the exact seed at every tile: the second table would cost its 3 CTAs per SM their last
  // 768 bytes of shared memory.)
  static constexpr bool kCarry = V::kPosAdvance && D >= 128;
  static constexpr int kReseed = 16;
  struct alignas(16) Entry {  // a seed tile's: the DimState and the step of 8 keys (16 bytes for RoPE: one LDS.128)
    typename V::DimState s;
    typename V::PosState step;
  };
  struct alignas(16) Move {  // a carried tile's: the steps of kTile and of 8 keys
    typename V::PosState tile;
    typename V::PosState step;
  };
  // The tables, one shared-memory array: [D / 2] Entries, then (with kCarry) [D / 2] Moves. One base register
  // addresses both (the Moves at a constant offset from it): with a table of its own the Moves' address was
  // rebuilt at every carried tile (the CTA's shared window, its offset, a multiply-add: 4 instructions), since the
  // register-bound kernel does not keep a second base live.
  struct alignas(16) CarryTables {
    Entry e[D / 2];
    Move m[D / 2];
  };
  struct alignas(16) SeedTables {  // (no Moves: not a byte more of the CTA's shared memory)
    Entry e[D / 2];
  };
  using Tables = typename PickState<kCarry, CarryTables, SeedTables>::type;
  const Tables* tab;
  typename V::PosState carry[kPairs];  // the PosStates of key gid at the last tile
  int next, run;  // key gid's position at a tile that continues the last one; tiles since the last exact seed

  static __device__ __forceinline__ int pair(int i, int tig) {
    return 16 * (i / 4) + 8 * ((i % 4) / 2) + 2 * tig + (i % 2);
  }

  template <class VP> __device__ __forceinline__ void init(const VP& v, Tables* tables, int tid, int threads) {
    for (int i = tid; i < D / 2; i += threads) {
      Entry e;
      e.s = V::dim_state(v, i, D);
      if constexpr (V::kPosAdvance) e.step = V::pos_state(v, e.s, i, 8);
      tables->e[i] = e;
      if constexpr (kCarry) {
        Move m;
        m.tile = V::pos_state(v, e.s, i, kTile);
        m.step = e.step;
        tables->m[i] = m;
      }
    }
    tab = tables;
    next = -2147483647;
    run = 0;
  }

  // Two 16-bit values of one register -> floats (bf16: one shift, one mask), and back with mma::pack2 (round to
  // nearest even).
  template <class T> static __device__ __forceinline__ void unpack(u32 r, float& a, float& b) {
    if constexpr (is_same<T, __nv_bfloat16>::value) {
      a = __uint_as_float(r << 16);
      b = __uint_as_float(r & 0xffff0000u);
    } else {
      const T* e = reinterpret_cast<const T*>(&r);
      a = to_float(e[0]);
      b = to_float(e[1]);
    }
  }

  // key_transform on this thread's B fragments of a 16-key block (b[kk]: k-step kk, ldmatrix_x4 order: key gid dims
  // +0..1 / +8..9, then key gid + 8 the same), key gid at position pos (tiles of one item come kTile keys apart, in
  // order); ix as the shared-memory path's. Block-uniform: every thread of the CTA calls it at every tile.
  template <class T, class VP>
  __device__ __forceinline__ void keys(const VP& v, const Index& ix, u32 (&b)[D / 16][4], int pos, int tig) {
    if constexpr (kCarry) {
      const bool seed = pos != next || run >= kReseed;  // (the same for every thread: pos - next is a tile's)
      next = pos + kTile;
      if (seed) {
        run = 1;
        rotate<true, T>(v, ix, b, pos, tig);
      } else {
        ++run;
        rotate<false, T>(v, ix, b, pos, tig);
      }
    } else {
      rotate<true, T>(v, ix, b, pos, tig);
    }
  }

  // kSeed: key gid's PosStates exact (else carried from the last tile and advanced by kTile keys).
  template <bool kSeed, class T, class VP>
  __device__ __forceinline__ void rotate(const VP& v, const Index& ix, u32 (&b)[D / 16][4], int pos, int tig) {
    // pair by pair (its PosState of key gid, then of key gid + 8), so few states are live at once
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float x[2][2], y[2][2];  // [key][element]: dims 16 kk + 8 r + 2 tig + e and their partners (+ D/2)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          unpack<T>(b[kk][2 * h + r], x[h][0], x[h][1]);
          unpack<T>(b[kk + kSteps][2 * h + r], y[h][0], y[h][1]);
        }
        float xo[2][2], yo[2][2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * kk + 2 * r + e, dim = pair(i, tig);
          typename V::DimState st;
          typename V::PosState kp, step;
          if constexpr (kSeed) {
            const Entry en = tab->e[dim];
            st = en.s;
            step = en.step;
            if constexpr (V::kPosState) kp = V::pos_state(v, st, dim, pos);
          } else {
            const Move mv = tab->m[dim];
            st = tab->e[dim].s;  // (not loaded when the variant's advance and transform do not read it: RoPE)
            step = mv.step;
            kp = carry[i];
            V::pos_advance(v, st, dim, kp, mv.tile);  // (RoPE's advance reads no DimState)
          }
          if constexpr (kCarry) carry[i] = kp;
          xo[0][e] = V::key_transform(v, st, kp, ix, pos, dim, x[0][e], y[0][e]);
          yo[0][e] = V::key_transform(v, st, kp, ix, pos, dim + D / 2, y[0][e], x[0][e]);
          if constexpr (V::kPosState) {
            if constexpr (V::kPosAdvance) {
              V::pos_advance(v, st, dim, kp, step);
            } else {
              kp = V::pos_state(v, st, dim, pos + 8);
            }
          }
          xo[1][e] = V::key_transform(v, st, kp, ix, pos + 8, dim, x[1][e], y[1][e]);
          yo[1][e] = V::key_transform(v, st, kp, ix, pos + 8, dim + D / 2, y[1][e], x[1][e]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          b[kk][2 * h + r] = mma::pack2<T>(xo[h][0], xo[h][1]);
          b[kk + kSteps][2 * h + r] = mma::pack2<T>(yo[h][0], yo[h][1]);
        }
      }
    }
  }

  // query_transform on this thread's A fragments of the query tile (a[kk]: registers 0 / 2 row gid dims +0..1 /
  // +8..9, 1 / 3 row gid + 8 the same); ix[0], ix[1]: the rows' indices.
  template <class T, class VP>
  __device__ __forceinline__ void queries(const VP& v, const Index (&ix)[2], u32 (&a)[D / 16][4], int tig) const {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const int row = reg % 2, r = reg / 2;
        u32& lo = a[kk][reg];
        u32& hi = a[kk + kSteps][reg];
        float x[2], y[2], xo[2], yo[2];
        unpack<T>(lo, x[0], x[1]);
        unpack<T>(hi, y[0], y[1]);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 4 * kk + 2 * r + e, dim = pair(i, tig);
          const typename V::DimState st = tab->e[dim].s;
          xo[e] = V::query_transform(v, st, ix[row], dim, x[e], y[e]);
          yo[e] = V::query_transform(v, st, ix[row], dim + D / 2, y[e], x[e]);
        }
        lo = mma::pack2<T>(xo[0], xo[1]);
        hi = mma::pack2<T>(yo[0], yo[1]);
      }
    }
  }
};

// value_transform on rows [0, rows) of the V tile `tile` (DV 16-bit elements per row, swizzled like K; row r is key
// key0 + r), kThreads threads from thread `tid`, one 16-byte chunk at a time; the caller synchronises before and after.
template <class V, int DV, int kThreads, class T, class VP>
__device__ __forceinline__ void value_transform_tile(const VP& v, const Index& ix, T* tile, int key0, int rows,
                                                     int tid) {
  constexpr int kChunks = DV / 8;
#pragma unroll 1
  for (int u = tid; u < rows * kChunks; u += kThreads) {
    const int r = u / kChunks, c = u % kChunks;
    T* p = tile + Swizzle<kChunks>::slot(r, c) * 8;
    Vec<T, 8> x;
    x.load(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = from_float<T>(V::value_transform(v, ix, key0 + r, 8 * c + i, to_float(x[i])));
    x.store(p);
  }
}

// query_transform on 8 dims [8c, 8c + 8) of one query row held in registers, given the partner dims (8c ± D/2).
template <class V, int D, class VP>
__device__ __forceinline__ void query_transform_chunk(const VP& v, const Index& ix, int c, float (&x)[8],
                                                      const float (&partner)[8]) {
  constexpr int kHalf = D / 16;
  const int pair0 = (c < kHalf ? c : c - kHalf) * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[i] = V::query_transform(v, V::dim_state(v, pair0 + i, D), ix, 8 * c + i, x[i], partner[i]);
  }
}

// ... given the DimStates of the chunk's pairs (c % (D/16): the decode kernels' KeyStates::s, made for the same pairs).
template <class V, int D, class VP>
__device__ __forceinline__ void query_transform_chunk(const VP& v, const Index& ix, int c, float (&x)[8],
                                                      const float (&partner)[8], const typename V::DimState (&s)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = V::query_transform(v, s[i], ix, 8 * c + i, x[i], partner[i]);
}

}  // namespace variant
}  // namespace cuinfer
