"""The prefill kernel's data movement, emulated in NumPy: cp.async into the swizzled tiles, ldmatrix (plain and
.trans) with the kernel's lane addresses (common/swizzle.cuh LdmatrixAddr), mma.sync m16n8k16 as the PTX ISA lays out
its fragments, and the accumulator -> A-fragment reuse of P. A wrong lane-to-row rule shows up here as a wrong
product, without a GPU. The formulas below are transcribed from kernel_src/attention/prefill.cuh; keep them in step.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuinfer.prefill.tiles import smem_bytes, tile_config

LANES = np.arange(32)
G, T = LANES // 4, LANES % 4  # group and thread-in-group of each lane


# ---- hardware model (PTX ISA: ldmatrix, mma.m16n8k16 fragment layouts) ---------------------------------------------


def ldmatrix_x4(smem: np.ndarray, addr: np.ndarray, trans: bool = False) -> np.ndarray:
    """Four 8x8 matrices; lanes 8i..8i+7 address the rows of matrix i. Returns [32 lanes, 4 regs, 2 halves]."""
    assert addr.shape == (32,) and np.all(addr % 16 == 0)
    rows = np.stack([smem[a // 2 : a // 2 + 8] for a in addr])  # 8 elements (16 bytes) per row address
    out = np.empty((32, 4, 2), dtype=smem.dtype)
    for i in range(4):
        m = rows[8 * i : 8 * i + 8]  # [row, col]
        if trans:
            m = m.T
        out[:, i, 0] = m[G, 2 * T]
        out[:, i, 1] = m[G, 2 * T + 1]
    return out


def stmatrix_x4(smem: np.ndarray, addr: np.ndarray, regs: np.ndarray) -> None:
    """The inverse of ldmatrix_x4 (sm_90): regs [32 lanes, 4 regs, 2 halves] hold four 8x8 matrices in the fragment
    layout (lane g*4+t: row g, columns 2t, 2t+1 of each); lanes 8i..8i+7 give the row addresses of matrix i."""
    assert addr.shape == (32,) and np.all(addr % 16 == 0)
    for i in range(4):
        m = np.empty((8, 8))
        m[G, 2 * T] = regs[:, i, 0]
        m[G, 2 * T + 1] = regs[:, i, 1]
        for row in range(8):
            a = addr[8 * i + row]
            smem[a // 2 : a // 2 + 8] = m[row]


def mma_m16n8k16(d: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """D += A B with A [16x16] from a [32, 4, 2], B [16x8] from b [32, 2, 2], C/D [32, 4] (the ISA's layouts)."""
    am = np.zeros((16, 16))
    bm = np.zeros((16, 8))
    for h in range(2):
        am[G, 2 * T + h] = a[:, 0, h]
        am[G + 8, 2 * T + h] = a[:, 1, h]
        am[G, 2 * T + 8 + h] = a[:, 2, h]
        am[G + 8, 2 * T + 8 + h] = a[:, 3, h]
        bm[2 * T + h, G] = b[:, 0, h]
        bm[2 * T + 8 + h, G] = b[:, 1, h]
    cm = np.zeros((16, 8))
    for h in range(2):
        cm[G, 2 * T + h] = d[:, h]
        cm[G + 8, 2 * T + h] = d[:, 2 + h]
    cm = cm + am @ bm
    out = np.empty((32, 4))
    for h in range(2):
        out[:, h] = cm[G, 2 * T + h]
        out[:, 2 + h] = cm[G + 8, 2 * T + h]
    return out


# ---- the kernel's address rules (prefill.cuh / swizzle.cuh) ------------------------------------------------------


def ld_make(tile: int, row: np.ndarray, c: np.ndarray, chunks: int) -> np.ndarray:
    return tile + row * (chunks * 16) + ((c ^ (row % 8)) * 16)


def ld_at(a: np.ndarray, s: int, row_shift: int, chunks: int) -> np.ndarray:
    return (a ^ ((s % 4) * 32)) + (s // 4) * 128 + row_shift * (chunks * 16)


def cp_async_tile(src: np.ndarray, threads: int, base: int, smem: np.ndarray) -> None:
    """The kernel's copy of a [rows, dim] tile: thread -> chunks (tid % 8) + 8c of rows tid / 8 + pass * i."""
    rows, dim = src.shape
    chunks = dim // 8
    per_pass = threads // 8
    for tid in range(threads):
        cp_row, cp_chunk = tid // 8, tid % 8
        dst0 = cp_row * (chunks * 16) + ((cp_chunk ^ (cp_row % 8)) * 16)
        for i in range(-(-rows // per_pass)):
            r = cp_row + i * per_pass
            if r >= rows:
                continue
            for c in range(chunks // 8):
                dst = base + dst0 + i * per_pass * chunks * 16 + c * 128
                e = (c * 8 + cp_chunk) * 8
                smem[dst // 2 : dst // 2 + 8] = src[r, e : e + 8]


CONFIGS = [
    pytest.param(128, 64, 128, 128, id="q128-kv64-d128"),
    pytest.param(128, 32, 64, 64, id="q128-kv32-d64"),
    pytest.param(64, 64, 256, 256, id="q64-kv64-d256"),
    pytest.param(32, 64, 192, 128, id="q32-kv64-d192x128"),
    pytest.param(16, 64, 128, 128, id="q16-kv64-d128"),
    pytest.param(16, 128, 64, 64, id="q16-kv128-d64"),
    pytest.param(128, 32, 256, 256, id="q128-8warps-d256"),
]


@pytest.mark.parametrize(("tile_q", "tile_kv", "dqk", "dvo"), CONFIGS)
def test_qk_and_pv_fragments_reproduce_the_products(tile_q, tile_kv, dqk, dvo, rng):
    cfg = tile_config(tile_q, tile_kv, dvo)
    cq, cv = dqk // 8, dvo // 8
    q = rng.integers(-4, 5, (tile_q, dqk)).astype(np.float64)  # small integers: exact products
    k = rng.integers(-4, 5, (tile_kv, dqk)).astype(np.float64)
    v = rng.integers(-4, 5, (tile_kv, dvo)).astype(np.float64)
    p = rng.integers(-3, 4, (tile_q, tile_kv)).astype(np.float64)  # stands in for the probabilities
    q_off, k_off = 0, tile_q * dqk * 2
    v_off = k_off + tile_kv * dqk * 2
    smem = np.full((v_off + tile_kv * dvo * 2) // 2, np.nan)
    cp_async_tile(q, cfg.threads, q_off, smem)
    cp_async_tile(k, cfg.threads, k_off, smem)
    cp_async_tile(v, cfg.threads, v_off, smem)
    assert not np.isnan(smem).any(), "the copies must fill every element of every tile"

    s_want, o_want = q @ k.T, p @ v
    for warp in range(cfg.threads // 32):
        wq, wkv = warp % cfg.warps_q, warp // cfg.warps_q
        row0, col0 = wq * cfg.mma_q * 16, wkv * cfg.mma_kv * 16
        q_lane = ld_make(q_off, row0 + LANES % 16, LANES // 16, cq)
        k_lane = ld_make(k_off, col0 + LANES % 8 + 8 * (LANES // 16), (LANES // 8) % 2, cq)
        v_lane = ld_make(v_off, col0 + LANES % 16, LANES // 16, cv)

        s = np.zeros((cfg.mma_q, 2 * cfg.mma_kv, 32, 4))
        for kk in range(dqk // 16):
            a = [ldmatrix_x4(smem, ld_at(q_lane, kk, mq * 16, cq)) for mq in range(cfg.mma_q)]
            for nn in range(cfg.mma_kv):
                bk = ldmatrix_x4(smem, ld_at(k_lane, kk, nn * 16, cq))
                for mq in range(cfg.mma_q):
                    s[mq, 2 * nn] = mma_m16n8k16(s[mq, 2 * nn], a[mq], bk[:, 0:2])
                    s[mq, 2 * nn + 1] = mma_m16n8k16(s[mq, 2 * nn + 1], a[mq], bk[:, 2:4])

        o = np.zeros((cfg.mma_q, dvo // 8, 32, 4))
        for kk in range(cfg.mma_kv):
            pa = []
            for mq in range(cfg.mma_q):
                # frag_c_to_a: the accumulators of n-tiles 2kk, 2kk+1 become the A fragment (values from P here)
                rows = row0 + mq * 16 + G
                keys = col0 + kk * 16 + 2 * T
                frag = np.empty((32, 4, 2))
                for h in range(2):
                    frag[:, 0, h] = p[rows, keys + h]
                    frag[:, 1, h] = p[rows + 8, keys + h]
                    frag[:, 2, h] = p[rows, keys + 8 + h]
                    frag[:, 3, h] = p[rows + 8, keys + 8 + h]
                pa.append(frag)
            for dn in range(dvo // 16):
                bv = ldmatrix_x4(smem, ld_at(v_lane, dn, kk * 16, cv), trans=True)
                for mq in range(cfg.mma_q):
                    o[mq, 2 * dn] = mma_m16n8k16(o[mq, 2 * dn], pa[mq], bv[:, 0:2])
                    o[mq, 2 * dn + 1] = mma_m16n8k16(o[mq, 2 * dn + 1], pa[mq], bv[:, 2:4])

        for mq in range(cfg.mma_q):
            for e in range(4):
                rows = row0 + mq * 16 + G + 8 * (e // 2)
                for j in range(2 * cfg.mma_kv):
                    keys = col0 + j * 8 + 2 * T + e % 2  # the kernel's key of element (mq, j, e)
                    np.testing.assert_array_equal(s[mq, j, :, e], s_want[rows, keys], err_msg=f"S warp {warp}")
                for j in range(dvo // 8):
                    cols = j * 8 + 2 * T + e % 2
                    # P.V over this warp's keys only (warps along the KV tile merge later)
                    part = p[:, col0 : col0 + 16 * cfg.mma_kv] @ v[col0 : col0 + 16 * cfg.mma_kv]
                    np.testing.assert_array_equal(o[mq, j, :, e], part[rows, cols], err_msg=f"O warp {warp}")
    assert o_want.shape == (tile_q, dvo)


@pytest.mark.parametrize("chunks", [pytest.param(c, id=f"{c * 8}-dims") for c in (8, 16, 24, 32)])
def test_ldmatrix_phases_and_copies_are_bank_conflict_free(chunks):
    """Each 8-lane phase of an ldmatrix and each 8-thread group of a cp.async touches 8 distinct 16-byte bank groups."""
    for make in (
        lambda: ld_make(0, LANES % 16, LANES // 16, chunks),  # A from Q / B from V (.trans)
        lambda: ld_make(0, LANES % 8 + 8 * (LANES // 16), (LANES // 8) % 2, chunks),  # B from K
    ):
        base = make()
        for s in range(chunks // 2):
            for shift in (0, 16, 32):
                addr = ld_at(base, s, shift, chunks)
                for phase in range(4):
                    groups = (addr[8 * phase : 8 * phase + 8] // 16) % 8
                    assert len(set(groups.tolist())) == 8, (s, shift, phase, groups)
    for tid0 in range(0, 128, 8):
        tids = np.arange(tid0, tid0 + 8)
        cp_row, cp_chunk = tids // 8, tids % 8
        dst = cp_row * (chunks * 16) + ((cp_chunk ^ (cp_row % 8)) * 16)
        assert len(set(((dst // 16) % 8).tolist())) == 8


@pytest.mark.parametrize(("tile_q", "tile_kv", "dqk", "dvo", "paged", "want"), [
    # Q 128x128 bf16 + 2 stages x (K + V) 64x128 + item info (12 + 8 per warp ints: the item's facts, the work
    # ranges, the warps' bounds) + the cross-item table
    # (16 items x 10 ints; one warp per row block: no epilogue staging)
    pytest.param(128, 64, 128, 128, False, 32768 + 2 * 2 * 16384 + (12 + 32) * 4 + 640, id="p1-ragged"),
    # + paged row offsets: 128 threads x 4 rows x 8 bytes
    pytest.param(128, 64, 128, 128, True, 32768 + 2 * 2 * 16384 + 4096 + (12 + 32) * 4 + 640, id="p4-paged"),
    # Q 16 rows; the epilogue staging (4 warps x 16 rows x (128 + 8) fp32 + m, d) is smaller than the pipeline
    pytest.param(16, 64, 128, 128, False, 4096 + 2 * 2 * 16384 + (12 + 32) * 4, id="decode-tiles"),
    # 8 warps of 16 rows at head dim 256 (one warp per row block: cross-item, no epilogue staging):
    # Q 128x256 + 2 x (K + V) 32x256 = 128 KB, item info (12 + 8 x 8 ints), the item table
    pytest.param(128, 32, 256, 256, False, 65536 + 2 * 32 * 512 * 2 + (12 + 64) * 4 + 640, id="d256-8warps"),
])  # fmt: skip
def test_smem_bytes_worked_examples(tile_q, tile_kv, dqk, dvo, paged, want):
    assert smem_bytes(tile_config(tile_q, tile_kv, dvo), dqk, dvo, paged) == want


# ---- staged epilogue (sm_90 cross-item kernels): stmatrix into the warp's Q rows, 16-byte pieces back -------------

XI_CONFIGS = [
    pytest.param(128, 128, 128, id="q128-d128"),
    pytest.param(128, 256, 256, id="q128-8warps-d256"),
    pytest.param(64, 64, 64, id="q64-d64"),
    pytest.param(128, 192, 128, id="q128-d192x128"),
]


@pytest.mark.parametrize(("tile_q", "dqk", "dvo"), XI_CONFIGS)
def test_staged_epilogue_reads_back_the_rows_the_accumulators_hold(tile_q, dqk, dvo, rng):
    """Each warp writes o (accumulator layout, packed like frag_c_to_a) with stmatrix at the Q ldmatrix addresses of
    its own rows, then lane g*4+t reads chunk (t + 4b) ^ (row % 8) of its rows g + 8h + 16mq: that must be columns
    8(t + 4b) .. +8 of the row, for every row, column and warp, and no warp may touch another warp's rows."""
    cfg = tile_config(tile_q, 64, dvo)
    assert cfg.warps_kv == 1, "the staged epilogue is the cross-item kernels' (one warp per row block)"
    cq = dqk // 8
    o = rng.integers(-1000, 1000, (tile_q, dvo)).astype(np.float64)  # one tile's normalised o
    smem = np.full(tile_q * cq * 8, np.nan)
    for warp in range(cfg.warps_q):
        row0 = warp * cfg.mma_q * 16
        q_lane = ld_make(0, row0 + LANES % 16, LANES // 16, cq)
        before = smem.copy()
        for mq in range(cfg.mma_q):
            rows = row0 + mq * 16 + G
            for s in range(dvo // 16):
                cols = s * 16 + 2 * T
                regs = np.empty((32, 4, 2))
                for h in range(2):  # a[0..3] of the kernel: rows (g, g+8) x n8 blocks (2s, 2s+1)
                    regs[:, 0, h], regs[:, 1, h] = o[rows, cols + h], o[rows + 8, cols + h]
                    regs[:, 2, h], regs[:, 3, h] = o[rows, cols + 8 + h], o[rows + 8, cols + 8 + h]
                stmatrix_x4(smem, ld_at(q_lane, s, mq * 16, cq), regs)
        touched = np.flatnonzero(~np.isnan(smem) & np.isnan(before) | (smem != before) & ~np.isnan(before))
        mine = (touched * 2 // (cq * 16) >= row0) & (touched * 2 // (cq * 16) < row0 + cfg.mma_q * 16)
        assert mine.all(), f"warp {warp} wrote outside its own Q rows"
        for mq in range(cfg.mma_q):
            for h in range(2):
                rows = row0 + mq * 16 + 8 * h + G
                for b in range(dvo // 32):
                    chunk = (T + 4 * b) ^ (rows % 8)
                    for lane in range(32):
                        a = rows[lane] * cq * 16 + chunk[lane] * 16
                        got = smem[a // 2 : a // 2 + 8]
                        c0 = 8 * (T[lane] + 4 * b)
                        np.testing.assert_array_equal(got, o[rows[lane], c0 : c0 + 8], err_msg=f"warp {warp}")


@pytest.mark.parametrize(("tile_q", "dqk", "dvo"), XI_CONFIGS)
def test_per_warp_q_copy_fills_exactly_the_warps_rows(tile_q, dqk, dvo):
    """With the staged epilogue each warp copies its own Q rows: lane -> rows lane / 8 + 4i (i < 4 MMA_Q), chunks
    lane % 8 + 8c. Every (row, chunk) of the warp's rows once, nothing else, and each 8-lane group of a copy
    instruction hits 8 distinct 16-byte bank groups."""
    cfg = tile_config(tile_q, 64, dvo)
    cq = dqk // 8
    for warp in range(cfg.warps_q):
        row0 = warp * cfg.mma_q * 16
        seen = np.zeros((tile_q, cq), dtype=int)
        for i in range(4 * cfg.mma_q):
            r = row0 + LANES // 8 + 4 * i
            for c in range(cq // 8):
                chunk = LANES % 8 + 8 * c
                dst = r * (cq * 16) + ((LANES % 8) ^ (r % 8)) * 16 + c * 128  # the kernel's address
                np.testing.assert_array_equal(dst, r * (cq * 16) + (chunk ^ (r % 8)) * 16)  # = the swizzle's
                np.add.at(seen, (r, chunk), 1)
                for g0 in range(0, 32, 8):
                    assert len(set(((dst[g0 : g0 + 8] // 16) % 8).tolist())) == 8
        want = np.zeros_like(seen)
        want[row0 : row0 + cfg.mma_q * 16] = 1
        np.testing.assert_array_equal(seen, want, err_msg=f"warp {warp}")
