"""The fp8 data movement of the attention kernels, emulated byte by byte in NumPy (no GPU): cp.async of fp8 rows into
the swizzled tiles (common/swizzle.cuh; 64-byte rows copied by 4 threads each), ldmatrix / ldmatrix.trans moving
bytes, the byte pairs of common/fp8.cuh (k_frag, v_frag), the Q fragments in the matching dim order (q_frag_fp8k),
mma.sync m16n8k16 by the ISA's fragment layouts, and the accumulators of the even / odd V tiles brought back to the
usual layout (pv_acc_to_natural's two quad exchanges, and the sm_90 path through the warp's Q rows). A wrong lane,
byte or swizzle rule shows up as a wrong product. The address formulas are transcribed from kernel_src (prefill_sm80
cta.cuh / mainloop.cuh / kernel.cuh finish_fp8_o, decode/kernels.cuh tile_fp8); keep them in step.

The conversion of each byte is the identity here (its exactness is pinned by test_fp8_conversion.py): values are
small integers, exact in every format.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuinfer.reference import fp8

LANES = np.arange(32)
G, T = LANES // 4, LANES % 4


# ---- hardware model ------------------------------------------------------------------------------------------------


def xor_of(r: np.ndarray | int, chunks: int):
    """Swizzle<CHUNKS>::xor_of."""
    return r % 8 if chunks >= 8 else (r // 2) % 4


def byte_offset(r, c, chunks: int):
    """Swizzle<CHUNKS>::byte_offset."""
    return (r * chunks + (c ^ xor_of(r, chunks))) * 16


def ld_make(tile, row, c, chunks: int):
    """LdmatrixAddr<CHUNKS>::make."""
    return tile + row * (chunks * 16) + ((c ^ xor_of(row, chunks)) * 16)


def ld_at(a, s: int, row_shift: int, chunks: int):
    """LdmatrixAddr<CHUNKS>::at."""
    return (a ^ ((s % 4) * 32)) + (s // 4) * 128 + row_shift * (chunks * 16)


def chunk_at(a0, c: int, row_shift: int, chunks: int):
    """ChunkAddr<CHUNKS>::at."""
    return (a0 ^ ((c % 8) * 16)) + (c // 8) * 128 + row_shift * (chunks * 16)


def ldmatrix_bytes(smem: np.ndarray, addr: np.ndarray, n: int = 4, trans: bool = False) -> np.ndarray:
    """ldmatrix .x{n} of b16 matrices over a byte-valued smem: [32 lanes, n regs, 4 bytes] (byte 0 lowest)."""
    assert np.all(addr % 16 == 0)
    out = np.empty((32, n, 4))
    for i in range(n):
        rows = np.stack([smem[a : a + 16] for a in addr[8 * i : 8 * i + 8]])  # [8 rows, 16 bytes]
        if trans:  # lane (g, t): b16 column g of rows 2t, 2t + 1
            out[:, i] = np.stack([rows[2 * T, 2 * G], rows[2 * T, 2 * G + 1], rows[2 * T + 1, 2 * G],
                                  rows[2 * T + 1, 2 * G + 1]], axis=1)  # fmt: skip
        else:  # lane (g, t): row g, bytes 4t .. 4t+3
            out[:, i] = np.stack([rows[G, 4 * T + b] for b in range(4)], axis=1)
    return out


def pair(x: np.ndarray, i: int, j: int) -> np.ndarray:
    """fp8::pair<T, F8, I, J> on [.., 4 bytes] -> [.., 2 halves] (conversion: identity on these values)."""
    return np.stack([x[..., i], x[..., j]], axis=-1)


def mma(d: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """D += A B, fragments by the ISA: a [32, 4 regs, 2 halves], b [32, 2, 2], d [32, 4]."""
    am, bm, cm = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for h in range(2):
        am[G, 2 * T + h], am[G + 8, 2 * T + h] = a[:, 0, h], a[:, 1, h]
        am[G, 2 * T + 8 + h], am[G + 8, 2 * T + 8 + h] = a[:, 2, h], a[:, 3, h]
        bm[2 * T + h, G], bm[2 * T + 8 + h, G] = b[:, 0, h], b[:, 1, h]
        cm[G, 2 * T + h], cm[G + 8, 2 * T + h] = d[:, h], d[:, 2 + h]
    cm = cm + am @ bm
    return np.stack([cm[G, 2 * T], cm[G, 2 * T + 1], cm[G + 8, 2 * T], cm[G + 8, 2 * T + 1]], axis=1)


def c_layout(acc: np.ndarray) -> np.ndarray:
    """[32, 4] accumulators of one n8 tile -> the [16, 8] block they hold."""
    m = np.zeros((16, 8))
    m[G, 2 * T], m[G, 2 * T + 1], m[G + 8, 2 * T], m[G + 8, 2 * T + 1] = acc.T
    return m


def frag_c_to_a(c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """mma::frag_c_to_a: accumulators of n8 tiles 2s, 2s+1 -> the A fragment of k-step s [32, 4, 2]."""
    return np.stack([c0[:, 0:2], c0[:, 2:4], c1[:, 0:2], c1[:, 2:4]], axis=1)


def store_tile_16(smem: np.ndarray, base: int, x: np.ndarray) -> None:
    """A [rows, dim] 16-bit tile, swizzled (Swizzle<dim/8>); each element's value at its first byte (second: NaN)."""
    rows, dim = x.shape
    chunks = dim // 8
    for r in range(rows):
        for c in range(chunks):
            a = base + byte_offset(r, c, chunks)
            smem[a : a + 16 : 2] = x[r, 8 * c : 8 * c + 8]
            smem[a + 1 : a + 16 : 2] = np.nan


def kv_copy_map(tid: int, chunks: int, convert: bool) -> tuple[int, int, int, bool]:
    """cta.cuh's fp8 K / V copy mapping: (kv_row, kv_chunk, kKVThreadsPerRow, kKVPairRows). 8 threads per row, 4 for
    64-byte rows; kKVPairRows (head dim 128, the CTA converting): 4 threads per row, chunks t and t + 4, lanes 4 q ..
    4 q + 3 of a warp on row (q / 2) + 4 (q % 2) of its 8."""
    pair = convert and chunks == 8
    if pair:
        q = (tid % 32) // 4
        return (tid // 32) * 8 + ((q >> 1) | ((q & 1) << 2)), tid % 4, 4, True
    per_row = min(8, chunks)
    return tid // per_row, tid % per_row, per_row, False


def kv_copy_pieces(chunks: int, rows: int, threads: int, convert: bool):
    """loader.cuh load_k's 16-byte copies per thread: (tid, i, k, row, chunk, smem byte offset as the kernel computes
    it: cp_k_dst plus immediates, or kKVPairRows' second chunk at cp_k_dst ^ 64)."""
    out = []
    for tid in range(threads):
        kv_row, kv_chunk, per_row, pair = kv_copy_map(tid, chunks, convert)
        per_pass = threads // per_row
        dst0 = byte_offset(kv_row, kv_chunk, chunks)
        for i in range(rows // per_pass):
            for k in range(chunks // per_row):
                dst = ((dst0 ^ 64) if (pair and k) else dst0 + k * 128) + i * per_pass * chunks * 16
                out.append((tid, i, k, kv_row + i * per_pass, kv_chunk + k * per_row, dst))
    return out


def copy_fp8_tile(smem: np.ndarray, base: int, x: np.ndarray, threads: int = 128, convert: bool = False) -> None:
    """The prefill loader's K / V copy of a [rows, dim] fp8 tile (cta.cuh kv_row / kv_chunk / cp_k_dst, loader.cuh
    load_k): kKVThreadsPerRow threads per row (8, or 4 for 64-byte rows and kKVPairRows), kKVRowsPerPass rows a
    pass."""
    rows, dim = x.shape
    chunks = dim // 16
    seen = np.zeros(smem.shape, bool)
    for _tid, _i, _k, r, ch, dst0 in kv_copy_pieces(chunks, rows, threads, convert):
        dst = base + dst0
        e = ch * 16
        assert dst0 == byte_offset(r, ch, chunks), "the kernel's address is the swizzle's"
        assert not seen[dst : dst + 16].any(), "two copies write one smem chunk"
        seen[dst : dst + 16] = True
        smem[dst : dst + 16] = x[r, e : e + 16]
    # every row landed where the swizzle puts it
    for r in range(rows):
        for c in range(chunks):
            a = base + byte_offset(r, c, chunks)
            np.testing.assert_array_equal(smem[a : a + 16], x[r, 16 * c : 16 * c + 16])


# ---- prefill: qk_tile_fp8, pv_tile_fp8, finish_fp8_o ------------------------------------------------------------


def to_natural_shuffles(acc_e: np.ndarray, acc_o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp8::pv_acc_to_natural, lane by lane: [32, 4] accumulators of the even / odd tiles -> tiles 2c, 2c+1."""
    acc_e, acc_o = acc_e.copy(), acc_o.copy()
    for h in range(2):
        v = np.stack([acc_e[:, 2 * h], acc_o[:, 2 * h], acc_e[:, 2 * h + 1], acc_o[:, 2 * h + 1]], axis=1)
        for r in range(2):
            bit = (T & 1) if r == 0 else (T >> 1) & 1
            mask = 1 if r == 0 else 2
            x0 = np.where(bit == 1, v[:, 0], v[:, 2])
            x1 = np.where(bit == 1, v[:, 1], v[:, 3])
            y0, y1 = x0[LANES ^ mask], x1[LANES ^ mask]  # shfl.bfly
            v[:, 0], v[:, 1] = np.where(bit == 1, y0, v[:, 0]), np.where(bit == 1, y1, v[:, 1])
            v[:, 2], v[:, 3] = np.where(bit == 0, y0, v[:, 2]), np.where(bit == 0, y1, v[:, 3])
        acc_e[:, 2 * h], acc_e[:, 2 * h + 1] = v[:, 0], v[:, 1]
        acc_o[:, 2 * h], acc_o[:, 2 * h + 1] = v[:, 2], v[:, 3]
    return acc_e, acc_o


def to_natural_smem(o: np.ndarray, piece: int) -> np.ndarray:
    """finish_fp8_o's sm_90 path for one 16-row block o [32 lanes, DVO/8 tiles, 4]: float4 stores of dims 16c + 4t
    .. 4t+3 into a scratch of 16 rows x 4 * piece units (units XOR 4 on odd rows), float2 loads back."""
    o = o.copy()
    chunks = o.shape[1] // 2
    units = 4 * piece
    for c0 in range(0, chunks, piece):
        buf = np.full(16 * units * 4, np.nan)  # floats
        written = np.zeros(buf.shape, bool)
        for cc in range(piece):
            e, od = o[:, 2 * (c0 + cc)], o[:, 2 * (c0 + cc) + 1]
            for h in range(2):
                r = G + 8 * h
                u = r * units + ((4 * cc + T) ^ ((r & 1) << 2))
                vals = np.stack([e[:, 2 * h], od[:, 2 * h], e[:, 2 * h + 1], od[:, 2 * h + 1]], axis=1)
                for lane in range(32):
                    assert not written[4 * u[lane] : 4 * u[lane] + 4].any()
                    written[4 * u[lane] : 4 * u[lane] + 4] = True
                    buf[4 * u[lane] : 4 * u[lane] + 4] = vals[lane]
        for cc in range(piece):
            for h in range(2):
                r = G + 8 * h
                lo = 4 * (r * units + ((4 * cc + T // 2) ^ ((r & 1) << 2))) + 2 * (T & 1)
                hi = 4 * (r * units + ((4 * cc + 2 + T // 2) ^ ((r & 1) << 2))) + 2 * (T & 1)
                o[:, 2 * (c0 + cc), 2 * h], o[:, 2 * (c0 + cc), 2 * h + 1] = buf[lo], buf[lo + 1]
                o[:, 2 * (c0 + cc) + 1, 2 * h], o[:, 2 * (c0 + cc) + 1, 2 * h + 1] = buf[hi], buf[hi + 1]
    return o


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mma_kv", [1, 2, 4])
@pytest.mark.parametrize("natural", ["shuffles", "smem"])
def test_prefill_fp8_fragments_reproduce_the_products(rng, d, mma_kv, natural):
    """One warp's row block (16 rows of Q) against MMA_KV 16-key slices of fp8 K and V: S = Q K^T through
    qk_tile_fp8's fragments, O = P V through pv_tile_fp8's, then finish_fp8_o's exchange to the usual layout."""
    keys = 16 * mma_kv
    q = rng.integers(-4, 5, (16, d)).astype(np.float64)
    k = rng.integers(-4, 5, (keys, d)).astype(np.float64)
    v = rng.integers(-4, 5, (keys, d)).astype(np.float64)
    cq, ck = d // 8, d // 16
    q_off, k_off = 0, 16 * d * 2
    v_off = k_off + keys * d
    smem = np.full(v_off + keys * d + 64 * 16, np.nan)  # (room past the tile: x2 lanes 16-31 address rows 16-31)
    store_tile_16(smem, q_off, q)
    threads = min(128, keys * min(8, ck))  # (whole passes: a CTA's tile is at least one pass of its 128 threads)
    copy_fp8_tile(smem, k_off, k, threads)
    copy_fp8_tile(smem, v_off, v, threads)
    # cta.cuh (warp_row0 = warp_col0 = 0)
    q8_lane = ld_make(q_off, G, T // 2, cq) + (T % 2) * 8
    k_lane = k_off + byte_offset(LANES, 0, ck)
    v_lane = ld_make(v_off, LANES % 16, LANES // 16, ck)
    # qk_tile_fp8
    s = np.zeros((2 * mma_kv, 32, 4))
    for kk in range(d // 16):
        a = np.empty((32, 4, 2))
        r0 = ld_at(q8_lane, kk, 0, cq)
        r8 = ld_at(q8_lane, kk, 8, cq)
        for lane in range(32):  # ld.shared.v2.b32: a0, a2 from row g; a1, a3 from row g + 8 (16-bit values)
            a[lane, 0], a[lane, 2] = smem[r0[lane] : r0[lane] + 4 : 2], smem[r0[lane] + 4 : r0[lane] + 8 : 2]
            a[lane, 1], a[lane, 3] = smem[r8[lane] : r8[lane] + 4 : 2], smem[r8[lane] + 4 : r8[lane] + 8 : 2]
        for nn in range(0, mma_kv, 2):
            n = 4 if nn + 1 < mma_kv else 2
            regs = ldmatrix_bytes(smem, chunk_at(k_lane, kk, nn * 16, ck), n)
            for i in range(n):
                b = np.stack([pair(regs[:, i], 0, 1), pair(regs[:, i], 2, 3)], axis=1)  # k_frag
                s[2 * nn + i] = mma(s[2 * nn + i], a, b)
    got_s = np.concatenate([c_layout(s[j]) for j in range(2 * mma_kv)], axis=1)
    np.testing.assert_array_equal(got_s, q @ k.T)
    # pv_tile_fp8 (P = the scores, small integers)
    o = np.zeros((d // 8, 32, 4))
    for kk in range(mma_kv):
        pa = frag_c_to_a(s[2 * kk], s[2 * kk + 1])
        for c2 in range(d // 32):
            regs = ldmatrix_bytes(smem, ld_at(v_lane, c2, kk * 16, ck), 4, trans=True)
            b = np.empty((4, 32, 2, 2))  # [even c, odd c, even c+1, odd c+1][lane][b0 / b1][half]
            for m in range(2):  # v_frag of tokens 0-7 (b0) and 8-15 (b1) of chunks 2 c2 and 2 c2 + 1
                b[2 * m + 0, :, 0], b[2 * m + 1, :, 0] = pair(regs[:, 2 * m], 0, 2), pair(regs[:, 2 * m], 1, 3)
                b[2 * m + 0, :, 1], b[2 * m + 1, :, 1] = pair(regs[:, 2 * m + 1], 0, 2), pair(regs[:, 2 * m + 1], 1, 3)
            for j in range(4):
                o[4 * c2 + j] = mma(o[4 * c2 + j], pa, b[j])
    want = got_s @ v
    if natural == "shuffles":
        for c in range(d // 16):
            o[2 * c], o[2 * c + 1] = to_natural_shuffles(o[2 * c], o[2 * c + 1])
    else:
        o = to_natural_smem(o.transpose(1, 0, 2), piece=min(d // 16, 8)).transpose(1, 0, 2)
    got_o = np.concatenate([c_layout(o[j]) for j in range(d // 8)], axis=1)
    np.testing.assert_array_equal(got_o, want)


def test_the_smem_exchange_fits_the_warps_q_rows():
    """finish_fp8_o's passes (16 rows x kPiece chunks x 16 dims x 4 bytes) fit the warp's Q rows, for every cross-item
    tile the fp8 policy can choose (one warp per row block: 16 * MMA_Q rows of head_dim_qk 16-bit elements)."""
    for d in (64, 128, 256):
        for mma_q in (1, 2):
            region = mma_q * 16 * d * 2
            piece = min(region // 1024, d // 16)
            assert piece >= 1 and (d // 16) % piece == 0 and 16 * piece * 16 * 4 <= region


# ---- decode: TensorCore::tile_fp8 and load_q ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", (80, 90))
@pytest.mark.parametrize(("d", "warps_kv", "warps_d"), [(64, 4, 1), (128, 4, 1), (256, 2, 2)])
def test_decode_tensor_core_fp8_fragments(rng, d, warps_kv, warps_d, arch):
    """Each warp of the tensor-core decode kernel: its 32 tokens of a 32 * warps_kv token tile, S through tile_fp8's
    K fragments (fp8::k_pairs: bytes (0, 1) and (2, 3), times 2^-kPowK: e4m3 exact by cvt on sm_90a, times 2^-8 by
    the integer path on sm_80) and load_q's Q fragments (dims (4t, 4t+1) and (4t+2, 4t+3), each row times its power
    of two q_f16_scale), the logits rescaled by the rows' inverse scales and 2^kPowK, P against V times 2^-kPowV
    (fp8::v_pairs: bytes (0, 2) and (1, 3); e4m3 exact by a byte permute and cvt on sm_90a, times 2^-8 by
    f16s_pairs' integer path on sm_80) over its DW output dims (o times 2^kPowV at the end), the exchange of
    finish_item."""
    warp_tokens, tile = 32, 32 * warps_kv
    dw = d // warps_d
    q = rng.integers(-4, 5, (16, d)).astype(np.float64)
    k = rng.integers(-4, 5, (tile, d)).astype(np.float64)
    v = rng.integers(-4, 5, (tile, d)).astype(np.float64)
    c8, cq = d // 16, d // 8
    q_off, k_off = 0, 16 * d * 2
    v_off = k_off + tile * d
    smem = np.full(v_off + tile * d, np.nan)
    store_tile_16(smem, q_off, q)
    for base, x in ((k_off, k), (v_off, v)):  # Pipeline::issue: chunk tid % kChunks of row tid / kChunks + pass
        for r in range(tile):
            for c in range(c8):
                a = base + byte_offset(r, c, c8)
                smem[a : a + 16] = x[r, 16 * c : 16 * c + 16]
    # load_q (fp8): rows g and g + 8, chunk 2 kk + t / 2, + 8 (t & 1)
    qf = np.empty((d // 16, 32, 4, 2))
    q_rows = np.empty((d // 16, 32, 2, 4))  # lane's dims 4t .. 4t+3 of k-step kk, rows g and g + 8
    for kk in range(d // 16):
        r0 = q_off + byte_offset(G, 2 * kk + T // 2, cq) + (T & 1) * 8
        r8 = q_off + byte_offset(G + 8, 2 * kk + T // 2, cq) + (T & 1) * 8
        for lane in range(32):
            q_rows[kk, lane, 0] = smem[r0[lane] : r0[lane] + 8 : 2]
            q_rows[kk, lane, 1] = smem[r8[lane] : r8[lane] + 8 : 2]
    amax = np.abs(q_rows).max(axis=(0, 3))  # [32 lanes, 2 rows]: then the quad max
    amax = amax.reshape(8, 4, 2).max(axis=1).repeat(4, axis=0)
    sc, inv = (x.astype(np.float64) for x in fp8.q_f16_scale(amax.astype(np.float32)))
    for kk in range(d // 16):  # q_frag_f16k: a0 = (4t, 4t+1) of row g, a1 of row g + 8, a2 = (4t+2, 4t+3), a3
        for h in range(2):
            x = q_rows[kk, :, h] * sc[:, h : h + 1]
            qf[kk, :, h], qf[kk, :, 2 + h] = x[:, [0, 1]], x[:, [2, 3]]
    kpow = 2.0 ** fp8.v_pairs_pow("float8_e4m3fn", arch)  # V's fragments
    kpow_k = 2.0 ** fp8.k_pairs_pow("float8_e4m3fn", arch)  # K's
    for warp in range(warps_kv * warps_d):
        wkv, wd = warp % warps_kv, warp // warps_kv
        s = np.zeros((warp_tokens // 8, 32, 4))
        for kg in range(warp_tokens // 32):
            a0 = k_off + byte_offset(wkv * warp_tokens + kg * 32 + LANES, 0, c8)
            for kk in range(d // 16):
                regs = ldmatrix_bytes(smem, chunk_at(a0, kk, 0, c8))
                for i in range(4):
                    b = np.stack([pair(regs[:, i], 0, 1), pair(regs[:, i], 2, 3)], axis=1) / kpow_k  # k_pairs
                    s[4 * kg + i] = mma(s[4 * kg + i], qf[kk], b)
        s[..., 0:2] *= (inv[:, 0] * kpow_k)[None, :, None]  # the rows' inverse scales and 2^kPowK (rs0, rs1)
        s[..., 2:4] *= (inv[:, 1] * kpow_k)[None, :, None]
        toks = slice(wkv * warp_tokens, (wkv + 1) * warp_tokens)
        got_s = np.concatenate([c_layout(s[j]) for j in range(warp_tokens // 8)], axis=1)
        np.testing.assert_array_equal(got_s, q @ k[toks].T)
        oacc = np.zeros((dw // 8, 32, 4))
        va = ld_make(v_off, wkv * warp_tokens + LANES % 8 + 8 * ((LANES // 8) % 2), LANES // 16, c8)
        for st in range(warp_tokens // 16):
            pa = frag_c_to_a(s[2 * st], s[2 * st + 1])
            for cp in range(dw // 32):
                regs = ldmatrix_bytes(smem, ld_at(va, (wd * dw) // 32 + cp, st * 16, c8), 4, trans=True)
                e = [pair(regs[:, m], 0, 2) / kpow for m in range(4)]  # v_pairs: (0, 2) even, (1, 3) odd
                od = [pair(regs[:, m], 1, 3) / kpow for m in range(4)]
                for j, bb in enumerate(((e[0], e[1]), (od[0], od[1]), (e[2], e[3]), (od[2], od[3]))):
                    oacc[4 * cp + j] = mma(oacc[4 * cp + j], pa, np.stack(bb, axis=1))
        oacc *= kpow  # (the kernel's v scale times 2^kPow at the item's end)
        for c in range(dw // 16):
            oacc[2 * c], oacc[2 * c + 1] = to_natural_shuffles(oacc[2 * c], oacc[2 * c + 1])
        got_o = np.concatenate([c_layout(oacc[j]) for j in range(dw // 8)], axis=1)
        np.testing.assert_array_equal(got_o, got_s @ v[toks][:, wd * dw : (wd + 1) * dw])


def test_swizzle_of_64_byte_rows_is_conflict_free():
    """Swizzle<4> (fp8 rows of head dim 64): 8 consecutive rows at one chunk hit 8 distinct 16-byte bank groups
    (ldmatrix phases), and 8 consecutive copying threads (rows r, r+1) write one 128-byte line."""
    rows = np.arange(64)
    for c in range(4):
        for r0 in range(0, 64, 8):
            groups = (byte_offset(rows[r0 : r0 + 8], c, 4) // 16) % 8
            assert len(set(groups.tolist())) == 8
    for tid0 in range(0, 128, 8):
        tids = np.arange(tid0, tid0 + 8)
        dst = byte_offset(tids // 4, tids % 4, 4)
        assert len(set((dst // 128).tolist())) == 1 and len(set(((dst // 16) % 8).tolist())) == 8


def _convert_tile_pieces(d: int, tile_kv: int, threads: int):
    """kernel.cuh convert_tile's mapping, the copy's (kv_copy_map: kKVThreadsPerRow threads per row): per thread, row
    pass i and chunk step k, the two 8-byte reads (fp8 tile byte offsets, in issue order) and the two 16-byte writes
    (16-bit tile byte offsets) of fp8 chunk ch = kv_chunk + kKVThreadsPerRow k of row kv_row + i * kKVRowsPerPass,
    half h first: bit 0 of (ch ^ ch / 4 ^ ch / 8), or with kKVPairRows bit 0 of (kv_row ^ kv_row / 4); computed as
    the kernel does (from the copy's offsets, immediates and, kKVPairRows, the chunk + 4 at cp_k_dst ^ 64)."""
    c8, c16 = d // 16, d // 8
    out = []  # (tid, i, k, row, chunk, [(read, write) for the two halves in issue order])
    for tid in range(threads):
        kv_row, kv_chunk, per_row, pair = kv_copy_map(tid, c8, True)
        per_pass = threads // per_row
        assert c8 % per_row == 0 and tile_kv % per_pass == 0 and per_pass % 8 == 0
        h0 = ((kv_row ^ (kv_row >> 2)) if pair else (kv_chunk ^ (kv_chunk >> 2))) & 1
        src = byte_offset(kv_row, kv_chunk, c8)  # cp_k_dst
        d0 = byte_offset(kv_row, 2 * kv_chunk + h0, c16)
        for i in range(tile_kv // per_pass):
            for k in range(c8 // per_row):
                if pair:
                    a = (src ^ 64 if k else src) + i * per_pass * c8 * 16
                    o = i * per_pass * c16 * 16 + k * 128
                    first, h = d0, h0
                else:
                    a = src + i * per_pass * c8 * 16 + k * 128
                    o = i * per_pass * c16 * 16 + k * 256
                    first = d0 ^ 16 if k & 1 else d0
                    h = h0 ^ (k & 1)
                ch = kv_chunk + per_row * k
                if not pair:
                    assert h == (ch ^ (ch >> 2) ^ (ch >> 3)) & 1
                rd = [a + 8 * h, a + 8 - 8 * h]
                wr = [first + o, (first ^ 16) + o]
                out.append((tid, i, k, kv_row + i * per_pass, ch, list(zip(rd, wr, strict=True))))
    return out


@pytest.mark.parametrize(("d", "tile_kv", "threads"), [(64, 32, 128), (128, 64, 128), (256, 64, 256), (256, 64, 128)])
def test_cta_conversion_writes_the_16_bit_tile(rng, d, tile_kv, threads):
    """kernel.cuh convert_tile (kConvert): each thread converts the fp8 chunks it copied (so its own cp.async wait
    suffices: no barrier before the conversion), reading each as two 8-byte halves (pairs (0, 1), (2, 3) of each
    word, in order) and writing half h as 16-bit chunk 2 ch + h; the result is the 16-bit tile the 16-bit math reads
    (the layout store_tile_16 writes), every piece written once, and the kernel's base-plus-immediate addresses are
    the hardware model's swizzle."""
    x = rng.integers(-8, 9, (tile_kv, d)).astype(np.float64)
    c8, c16 = d // 16, d // 8
    src = np.full(tile_kv * d, np.nan)
    copy_fp8_tile(src, 0, x, threads=threads, convert=True)
    dst = np.full(2 * tile_kv * d, np.nan)
    seen = set()
    copies = {(t, i, k): dst0 for t, i, k, _r, _c, dst0 in kv_copy_pieces(c8, tile_kv, threads, True)}
    for tid, i, k, r, ch, halves in _convert_tile_pieces(d, tile_kv, threads):
        # the chunk this thread's own cp.async wrote (load_k's address of that copy)
        own = copies[(tid, i, k)]
        assert all(rd // 16 * 16 == own for rd, _ in halves)
        for rd, wr in halves:
            h = (rd - byte_offset(r, ch, c8)) // 8  # which half this read is
            assert rd == byte_offset(r, ch, c8) + 8 * h and wr == byte_offset(r, 2 * ch + h, c16)
            assert wr not in seen
            seen.add(wr)
            piece = src[rd : rd + 8]  # uint2: 8 fp8 codes
            dst[wr : wr + 16 : 2] = piece
            dst[wr + 1 : wr + 16 : 2] = np.nan
    assert len(seen) == tile_kv * c16
    want = np.full(2 * tile_kv * d, np.nan)
    store_tile_16(want, 0, x)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize(("d", "tile_kv", "threads"), [(64, 32, 128), (128, 64, 128), (256, 64, 256), (256, 64, 128)])
def test_cta_conversion_is_free_of_bank_conflicts(d, tile_kv, threads):
    """convert_tile's shared-memory accesses: each 8-byte read instruction (phases of 16 lanes) and each 16-byte write
    (phases of 8 lanes) touches every 4-byte bank at most once per phase; writing half 0 first would not (even 16-bit
    chunks only: 2-way conflicts)."""

    def banks(addrs, width):
        return [(a // 4 + k) % 32 for a in addrs for k in range(width // 4)]

    pieces = {(tid, i, k): halves for tid, i, k, _r, _c, halves in _convert_tile_pieces(d, tile_kv, threads)}
    per_row = kv_copy_map(0, d // 16, True)[2]
    for warp in range(threads // 32):
        for i in range(tile_kv // (threads // per_row)):
            for k in range(d // 16 // per_row):
                for n in range(2):  # the two reads / writes of a piece, in issue order
                    for lanes, width, which in ((16, 8, 0), (8, 16, 1)):
                        for ph in range(0, 32, lanes):
                            tids = range(32 * warp + ph, 32 * warp + ph + lanes)
                            b = banks([pieces[(t, i, k)][n][which] for t in tids], width)
                            assert len(b) == len(set(b)), (d, warp, i, k, n, which, ph)
    # the old order (half 0 first) conflicts on the writes
    c16 = d // 8
    old = [byte_offset(0, 2 * ch, c16) for ch in range(8)]
    b = banks(old, 16)
    assert len(set(b)) < len(b)


@pytest.mark.parametrize("n_keys", [64, 8192])
def test_pv_with_float16_p_is_within_the_documented_bound(rng, n_keys):
    """traits.cuh kHalfPV (docs/fp8.md): with bf16 q and fp8 V converted by the CTA, P·V takes P in float16. V is exact
    in float16 (every e4m3 code); P = 2^(x - m) <= 2^8 rounds to 11 significant bits, and p < 2^-24 flushes to 0.
    Against the float64 product, the float16 P error stays within the bound (2^-11 relative per p, plus n_keys x
    2^-24 of the row sum for the flushed / subnormal ones) and, summed over every output, below bfloat16 P's error, on
    rows whose p span 2^8 .. 2^-40 (logit gaps far larger than real rows have). (The largest single error is not always
    smaller: with 64 keys a few p near 2^8 dominate a column, and bfloat16 happened to round them closer for ~1.3 % of
    seeds; the sums compared held for 2000 of 2000.)"""
    import ml_dtypes

    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    finite = codes[np.isfinite(codes)]
    assert np.array_equal(finite.astype(np.float16).astype(np.float64), finite)  # V exact in float16
    v = rng.choice(finite, (n_keys, 16))
    err_half = err_bf16 = 0.0
    for _ in range(4):
        x = rng.uniform(-40, 8, n_keys)  # base-2 logits relative to the reference max m
        p = np.exp2(x)
        exact = p @ v
        half = p.astype(np.float16).astype(np.float64) @ v
        bf16 = p.astype(ml_dtypes.bfloat16).astype(np.float64) @ v
        scale = np.abs(p) @ np.abs(v)
        bound = 2.0**-11 * scale + n_keys * 2.0**-24 * np.abs(v).max(axis=0)
        assert np.all(np.abs(half - exact) <= bound)
        err_half += np.abs(half - exact).sum()
        err_bf16 += np.abs(bf16 - exact).sum()
    assert err_half < err_bf16


@pytest.mark.parametrize(
    ("d", "tile_kv", "convert"), [(128, 64, True), (128, 64, False), (256, 64, True), (64, 32, True)]
)
def test_fp8_copies_are_free_of_bank_conflicts_and_whole_segments(d, tile_kv, convert):
    """loader.cuh load_k / load_v (cp.async, 16 bytes a lane): every 8-lane phase of each copy instruction writes 8
    distinct 16-byte bank groups, and the 32 lanes of an instruction read whole 64-byte (or 128-byte) segments of their
    rows. kKVPairRows (head dim 128, the CTA converting: 4 threads per row, chunks t and t + 4) needs its row order
    for that: rows in lane order (tid / 4) would put two rows with the same swizzle in a phase (2-way conflicts)."""
    chunks = d // 16
    threads = 128
    pieces = {(t, i, k): (r, ch, dst) for t, i, k, r, ch, dst in kv_copy_pieces(chunks, tile_kv, threads, convert)}
    per_row = kv_copy_map(0, chunks, convert)[2]
    for warp in range(threads // 32):
        for i in range(tile_kv // (threads // per_row)):
            for k in range(chunks // per_row):
                lanes = [pieces[(32 * warp + ln, i, k)] for ln in range(32)]
                for ph in range(0, 32, 8):
                    groups = [(dst // 16) % 8 for _, _, dst in lanes[ph : ph + 8]]
                    assert len(set(groups)) == 8, (d, warp, i, k, ph)
                by_row: dict[int, list[int]] = {}
                for r, ch, _ in lanes:
                    by_row.setdefault(r, []).append(ch)
                for chs in by_row.values():  # contiguous chunks of one row: a whole segment
                    assert sorted(chs) == list(range(min(chs), min(chs) + len(chs))) and len(chs) * 16 >= 64
    if d == 128 and convert:  # the plain row order conflicts
        naive = [byte_offset(t // 4, t % 4, chunks) for t in range(8)]
        assert len({(a // 16) % 8 for a in naive}) < 8
