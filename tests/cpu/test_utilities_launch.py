"""The GPU path of the serving utilities without a GPU: the launches the host code plans (kernel instance, grid,
block, packed parameters) are run by small NumPy emulators of the kernels' index arithmetic that read and write the
real host memory the parameters point at, and compared with the CPU reference. This catches wrong strides, pointers,
layouts, chunking and coverage before a GPU sees them. The kernels' bit tricks are checked against their constants
in the CUDA source, and the SASS of the memory-bound kernels for loads in flight before the first store.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from cuinfer.interop.arrays import as_tensor

import cuinfer
from cuinfer.utils import bits as PB
from cuinfer.utils import launch as L
from cuinfer.utils import paged as P
from cuinfer.utils import rope as R
from cuinfer.utils import specs as S

I32 = np.int32
BF16 = ml_dtypes.bfloat16
SRC = Path(__file__).resolve().parents[2] / "kernel_src" / "utility"


def cuda(x, name):
    """Import a NumPy array as if it were a CUDA array (the GPU-only checks then apply)."""
    return replace(as_tensor(x, name), device_type="cuda")


class Memory:
    """Reads and writes at the raw addresses the parameters hold, only inside the arrays registered here."""

    def __init__(self, *arrays):
        self.ranges = []
        for a in arrays:
            base = a if a.base is None else a.base
            while isinstance(base, np.ndarray) and base.base is not None:
                base = base.base
            start = base.__array_interface__["data"][0]
            self.ranges.append((start, start + base.nbytes))

    def check(self, addr, nbytes):
        addr = np.atleast_1d(np.asarray(addr, np.int64))
        ok = np.zeros(addr.shape, bool)
        for lo, hi in self.ranges:
            ok |= (addr >= lo) & (addr + nbytes <= hi)
        assert ok.all(), f"an access of {nbytes} bytes at 0x{int(addr[~ok][0]):x} is outside every array"

    def read(self, addr, nbytes):
        self.check(addr, nbytes)
        return np.frombuffer(ctypes.string_at(int(addr), nbytes), np.uint8)

    def i32(self, ptr, index):
        index = np.asarray(index, np.int64)
        out = np.empty(index.shape, np.int64)
        for i, j in np.ndenumerate(index):
            self.check(ptr + 4 * int(j), 4)
            out[i] = ctypes.c_int32.from_address(ptr + 4 * int(j)).value
        return out

    def move(self, dst, src, nbytes):
        for d, s in zip(np.atleast_1d(dst), np.atleast_1d(src), strict=True):
            self.check(d, nbytes)
            self.check(s, nbytes)
            ctypes.memmove(int(d), int(s), nbytes)


def fast_div(n, mul, shift):
    n = np.asarray(n, np.int64)
    return (((n * int(mul)) >> 32) + n) >> int(shift)


# ---- append_paged_kv_cache -----------------------------------------------------------------------------------------


def emulate_append(launch: L.Launch, mem: Memory, itemsize: int, store=None):
    """append.cu: the flat (token, vector) work, the slot lookup shared by K and V, the 16-byte copies (or
    ``store(dst_addresses, src_addresses, side_params)`` of a cache with 1-byte elements: the fp8 store)."""
    p = launch.params
    vec = 16 // itemsize
    assert len(launch.grid) == 1 and launch.block == (S.APPEND_THREADS,)
    w = np.arange(int(p["nnz"]) * int(p["vecs_per_token"]), dtype=np.int64)
    tl = fast_div(w, p["tok_mul"], p["tok_shift"])
    r = w - tl * int(p["vecs_per_token"])
    t = int(p["token_begin"]) + tl
    b = mem.i32(int(p["batch_indices"]), t)
    pos = mem.i32(int(p["positions"]), t)
    ok = (b >= 0) & (b < int(p["batch_size"])) & (pos >= 0)
    bb = np.where(ok, b, 0)
    first = mem.i32(int(p["kv_indptr"]), bb)
    pages = mem.i32(int(p["kv_indptr"]), bb + 1) - first
    last = mem.i32(int(p["kv_last_page_len"]), bb)
    pi = fast_div(np.where(ok, pos, 0), p["page_mul"], p["page_shift"])
    assert (pi[ok] == pos[ok] // int(p["page_size"])).all()
    slot = pos - pi * int(p["page_size"])
    ok &= (pi < pages) & ((pi < pages - 1) | (slot < last)) & (first >= 0) & (first + pi < int(p["num_indices"]))
    page = mem.i32(int(p["kv_indices"]), np.where(ok, first + pi, 0))
    ok &= (page >= 0) & (page < int(p["num_pages"]))
    for side in ("k", "v"):
        s = p[side]
        h = fast_div(r, s["row_mul"], s["row_shift"])
        c = (r - h * int(s["vecs_per_row"])) * vec
        src = int(s["src"]) + (t * int(s["src_s0"]) + h * int(s["src_s1"]) + c) * itemsize
        dst_el = page * int(s["dst_page"]) + slot * int(s["dst_slot"]) + h * int(s["dst_head"]) + c
        dst = int(s["dst"]) + dst_el * (itemsize if store is None else 1)
        live = ok & (r < int(s["vecs_per_token"]))
        if store is None:
            mem.move(dst[live], src[live], 16)
        else:
            store(dst[live], src[live], s)


def _append_case(rng, page_size, layout, as_tuple, dtype, head_dim_v=None):
    hq, hkv, d = 3, 2, 16
    dv = head_dim_v or d
    old, new = np.array([7, 0, 16, 3, 41]), np.array([2, 5, 1, 30, 0])
    seq = old + new
    num_pages = sum(-(-n // page_size) for n in seq) + 3
    n_pages = [-(-n // page_size) for n in seq]
    indices = rng.permutation(num_pages)[: sum(n_pages)].astype(I32)
    indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype(I32)
    last = np.array([n - page_size * (q - 1) for n, q in zip(seq, n_pages, strict=True)], I32)
    shape = (num_pages, page_size, hkv) if layout == "NHD" else (num_pages, hkv, page_size)
    if as_tuple:
        cache = (rng.standard_normal((*shape, d)).astype(dtype), rng.standard_normal((*shape, dv)).astype(dtype))
    else:
        cache = rng.standard_normal((num_pages, 2, *shape[1:], d)).astype(dtype)
    nnz = int(new.sum()) + 2
    qkv = rng.standard_normal((nnz, hq + 2 * hkv, max(d, dv))).astype(dtype)  # k and v: strided slices
    k, v = qkv[:, hq : hq + hkv, :d], qkv[:, hq + hkv :, :dv]
    append_indptr = np.concatenate([[0], np.cumsum(new)]).astype(I32)
    bidx, pos = cuinfer.get_batch_indices_positions(append_indptr, cuinfer.get_seq_lens(indptr, last, page_size), nnz)
    return k, v, bidx, pos, cache, indices, indptr, last, qkv


@pytest.mark.parametrize(
    ("page_size", "layout", "as_tuple", "dtype", "dv", "max_work"),
    [
        pytest.param(1, "NHD", False, np.float16, None, None, id="page1-nhd"),
        pytest.param(5, "HND", False, BF16, None, None, id="page5-hnd"),
        pytest.param(16, "NHD", True, np.float16, 8, None, id="page16-nhd-tuple-dv8"),
        pytest.param(5, "HND", True, BF16, 24, None, id="page5-hnd-tuple-dv24"),
        pytest.param(5, "NHD", False, np.float16, None, 37, id="page5-nhd-chunked"),
    ],
)
def test_append_launch_emulated(rng, monkeypatch, page_size, layout, as_tuple, dtype, dv, max_work):
    k, v, bidx, pos, cache, indices, indptr, last, qkv = _append_case(rng, page_size, layout, as_tuple, dtype, dv)
    want = tuple(c.copy() for c in cache) if as_tuple else cache.copy()
    cuinfer.append_paged_kv_cache(k, v, bidx, pos, want, indices, indptr, last, kv_layout=layout)  # the reference
    if max_work:
        monkeypatch.setattr(P, "_MAX_WORK", max_work)  # tokens x vectors per launch: several launches
    a = P.check_append(k, v, bidx, pos, cache, indices, indptr, last, layout, cuda)
    launches = P.append_launches(a, sms=3)
    assert len(launches) == (1 if not max_work else -(-k.shape[0] // max(1, max_work // (2 * 2))))
    assert {x.name_expr for x in launches} == {S.append_instance(k.dtype.name)}
    assert all(x.grid[0] <= 3 * S.APPEND_BLOCKS_PER_SM for x in launches)
    mem = Memory(qkv, bidx, pos, indices, indptr, last, *(cache if as_tuple else (cache,)))
    for launch in launches:
        emulate_append(launch, mem, 2)
    for got, exp in zip(cache if as_tuple else (cache,), want if as_tuple else (want,), strict=True):
        np.testing.assert_array_equal(got.view(np.uint16), exp.view(np.uint16))


def test_append_launch_skips_out_of_range_rows(rng):
    """Rows the host would reject (check_indices=False leaves them to the kernel) write nothing."""
    k, v, bidx, pos, cache, indices, indptr, last, qkv = _append_case(rng, 5, "NHD", False, np.float16)
    bad_b, bad_p = bidx.copy(), pos.copy()
    bad_b[0], bad_p[1], bad_b[2] = 99, 10_000, -7  # batch index past the batch, position past kv_len, negative
    keep = np.ones(len(bidx), bool)
    keep[:3] = False
    want = cache.copy()
    ok_b = np.where(keep, bidx, -1).astype(I32)
    cuinfer.append_paged_kv_cache(k, v, ok_b, pos, want, indices, indptr, last)
    a = P.check_append(k, v, bad_b, bad_p, cache, indices, indptr, last, "NHD", cuda)
    mem = Memory(qkv, bad_b, bad_p, indices, indptr, last, cache)
    for launch in P.append_launches(a, sms=2):
        emulate_append(launch, mem, 2)
    np.testing.assert_array_equal(cache.view(np.uint16), want.view(np.uint16))


def test_append_gpu_checks_alignment(rng):
    k, v, bidx, pos, cache, indices, indptr, last, _ = _append_case(rng, 5, "NHD", False, np.float16)
    a = P.check_append(k, v, bidx, pos, cache, indices, indptr, last, "NHD", cuda)
    shifted = replace(a.key, ptr=a.key.ptr + 2)
    with pytest.raises(ValueError, match="append_key must have rows that start on 16-byte boundaries"):
        L.check_rows16("append_key", shifted)
    L.check_rows16("append_key", a.key)  # a slice of a fused qkv at a multiple of 8 elements is fine


def test_append_without_requests_or_pages_launches_nothing(rng):
    k = rng.standard_normal((3, 1, 8)).astype(np.float16)
    cache = np.zeros((2, 2, 4, 1, 8), np.float16)
    none = np.full(3, -1, I32)
    a = P.check_append(k, k, none, none, cache, np.zeros(0, I32), np.array([0], I32), np.zeros(0, I32), "NHD", cuda)
    assert P.append_launches(a, sms=4) == []


# ---- RoPE ----------------------------------------------------------------------------------------------------------


def kernel_freq(p, i):
    """rope.cu's pair_freq, in float64 from the packed parameters."""
    f = 2.0 ** (-2.0 * i / int(p["rotary_dim"]) * float(p["log2_theta"]))
    s = np.clip(f * float(p["smooth_a"]) + float(p["smooth_b"]), 0.0, 1.0)
    return (1.0 - s) * (f * float(p["rcp_scale"])) + s * f


def emulate_rope(launch: L.Launch, mem: Memory, dtype, interleave: bool, inplace: bool):
    """rope.cu: units per row, tokens over (blockIdx.x, threadIdx.y), heads over blockIdx.y; fp32 math."""
    p = launch.params
    units, rows = launch.block
    gx, gy = launch.grid
    nnz, hq, hk, r = (int(p[n]) for n in ("nnz", "num_q_heads", "num_k_heads", "rotary_dim"))
    vec = int(re.search(r"apply_rope<[^,]+, (\d+),", launch.name_expr).group(1))
    per_group, rot_units = int(p["heads_per_group"]), int(p["rot_units"])
    assert units * rows <= S.ROPE_THREADS and gy * per_group >= hq + hk > (gy - 1) * per_group
    item = np.dtype(dtype).itemsize
    tokens = sorted(t for bx in range(gx) for ty in range(rows) for t in range(bx * rows + ty, nnz, gx * rows))
    assert tokens == list(range(nnz)), "every token once"
    for t in range(nnz):
        kind = int(p["pos_kind"])
        if kind == S.POS_RAGGED:
            b = max(i for i in range(int(p["batch_size"])) if mem.i32(int(p["indptr"]), i) <= t)
            pos = mem.i32(int(p["offsets"]), b) + t - mem.i32(int(p["indptr"]), b)
        else:
            raw = mem.read(int(p["pos"]) + t * (8 if kind == S.POS_INT64 else 4), 8 if kind == S.POS_INT64 else 4)
            pos = int(raw.view(np.int64 if kind == S.POS_INT64 else np.int32)[0])
        for hh in range(hq + hk):
            q_side = hh < hq
            h = hh if q_side else hh - hq
            s0, s1, o0, o1 = (int(p[f"{'q' if q_side else 'k'}{x}"]) for x in ("_s0", "_s1", "o_s0", "o_s1"))
            base_in = int(p["q" if q_side else "k"]) + (t * s0 + h * s1) * item
            base_out = int(p["q_out" if q_side else "k_out"]) + (t * o0 + h * o1) * item
            for u in range(units):
                rot = u < rot_units
                c0 = u * vec if rot else r + (u - rot_units) * vec
                cols = [c0] + ([c0 + r // 2] if rot and not interleave else [])
                x = [mem.read(base_in + c * item, vec * item).view(dtype).astype(np.float32) for c in cols]
                if rot:
                    pairs = np.arange(vec // 2) + c0 // 2 if interleave else np.arange(vec) + c0
                    ang = pos * kernel_freq(p, pairs)
                    cs, sn = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
                    a, b = (x[0][0::2], x[0][1::2]) if interleave else (x[0], x[1])
                    a, b = a * cs - b * sn, b * cs + a * sn
                    if interleave:
                        x[0][0::2], x[0][1::2] = a, b
                    else:
                        x = [a, b]
                for c, val in zip(cols, x, strict=True):
                    out = np.ascontiguousarray(val.astype(dtype)).view(np.uint8)
                    mem.check(base_out + c * item, out.nbytes)
                    ctypes.memmove(base_out + c * item, out.ctypes.data, out.nbytes)


@pytest.mark.parametrize(
    ("head_dim", "rotary_dim", "interleave", "dtype", "angles", "inplace", "vec"),
    [
        pytest.param(64, None, False, np.float16, "pos32", False, 8, id="d64-neox-pos32"),
        pytest.param(64, 32, True, BF16, "pos64", False, 8, id="d64-rot32-interleave-pos64"),
        pytest.param(80, 20, False, np.float16, "ragged", False, 2, id="d80-rot20-neox-ragged-v2"),
        pytest.param(96, 24, False, BF16, "pos32", True, 4, id="d96-rot24-inplace-v4"),
        pytest.param(128, 64, False, np.float16, "llama31", False, 8, id="d128-rot64-llama31"),
    ],
)
def test_rope_launch_emulated(rng, head_dim, rotary_dim, interleave, dtype, angles, inplace, vec):
    nnz, hq, hk = 13, 5, 2
    qkv = rng.standard_normal((nnz, hq + 2 * hk, head_dim)).astype(dtype)
    q, k = qkv[:, :hq], qkv[:, hq : hq + hk]  # strided rows
    pos = rng.integers(0, 1_000_000, nnz)
    llama31 = (1.0, 4.0, 8192.0) if angles == "llama31" else None
    freqs = R.check_freqs(8.0 if llama31 else 1.0, 5e5 if llama31 else 1e4, llama31)
    opts = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=freqs[0], rope_theta=freqs[1])
    indptr, offsets = np.array([0, 4, 4, nnz], I32), np.array([10, 0, 999_000], I32)
    if angles == "ragged":
        spec = {"indptr": indptr, "offsets": offsets}
        pos = np.concatenate([10 + np.arange(4), 999_000 + np.arange(nnz - 4)])
        want = cuinfer.apply_rope(q, k, indptr, offsets, **opts)
    else:
        spec = {"pos_ids": pos.astype(np.int64 if angles == "pos64" else I32)}
        fn = cuinfer.apply_llama31_rope_pos_ids if llama31 else cuinfer.apply_rope_pos_ids
        want = fn(q, k, spec["pos_ids"], **opts)
    a = R.check_rope(q, k, spec, rotary_dim=rotary_dim, interleave=interleave, freqs=freqs, tensor=cuda)
    outs = (q, k) if inplace else tuple(np.full(x.shape, np.nan, dtype) for x in (q, k))
    out_t = (a.q, a.k) if inplace else tuple(cuda(x, n) for x, n in zip(outs, ("q_rope", "k_rope"), strict=True))
    launch = R.rope_launch(a, out_t, inplace, sms=2)
    assert launch.name_expr == S.rope_instance(np.dtype(dtype).name, vec, interleave)
    assert launch.spec in S.all_specs()
    emulate_rope(launch, Memory(qkv, *outs, *spec.values()), dtype, interleave, inplace)
    for got, w in zip(outs, want, strict=True):
        g, e = got.astype(np.float64), w.astype(np.float64)
        assert not np.isnan(g).any(), "an output element was never written"
        ulp = 2.0 ** (-10 if dtype == np.float16 else -7)
        np.testing.assert_allclose(g, e, rtol=ulp, atol=ulp * 2.0**-6)  # fp32 math vs the float64 reference


def test_rope_llama31_parameters_give_the_reference_frequencies():
    freqs = R.check_freqs(8.0, 5e5, (1.0, 4.0, 8192))
    q = np.zeros((1, 1, 128), np.float16)
    a = R.check_rope(q, q, {"pos_ids": np.zeros(1, I32)}, rotary_dim=None, interleave=False, freqs=freqs, tensor=cuda)
    p = R.rope_launch(a, (a.q, a.k), False, sms=1).params
    want = cuinfer.reference.positional.rope_freqs(128, rope_scale=8.0, rope_theta=5e5, llama31=(1.0, 4.0, 8192))
    np.testing.assert_allclose(kernel_freq(p, np.arange(64)), want, rtol=1e-13)


def test_rope_head_groups_fill_the_gpu_for_small_batches():
    q = np.zeros((4, 32, 128), np.float16)
    k = np.zeros((4, 8, 128), np.float16)
    a = R.check_rope(q, k, {"pos_ids": np.zeros(4, I32)}, rotary_dim=None, interleave=False,
                     freqs=(1.0, 1e4, None), tensor=cuda)  # fmt: skip
    launch = R.rope_launch(a, (a.q, a.k), True, sms=132)
    assert launch.block == (8, 32) and launch.grid[0] == 1
    assert launch.grid[1] == 40 and int(launch.params["heads_per_group"]) == 1  # one head per block: 40 blocks
    big = np.zeros((100_000, 1, 128), np.float16)
    a = R.check_rope(big, big, {"pos_ids": np.zeros(100_000, I32)}, rotary_dim=None, interleave=False,
                     freqs=(1.0, 1e4, None), tensor=cuda)  # fmt: skip
    launch = R.rope_launch(a, (a.q, a.k), False, sms=132)
    assert launch.grid == (132 * S.ROPE_BLOCKS_PER_SM, 1)


def test_rope_vector_width_follows_alignment():
    x = np.zeros((3, 2, 65), np.float16)
    q = x[:, :, 1:]  # rows start 2 bytes past an aligned address: only 2-byte chunks reach them
    a = R.check_rope(q, q, {"pos_ids": np.zeros(3, I32)}, rotary_dim=None, interleave=False,
                     freqs=(1.0, 1e4, None), tensor=cuda)  # fmt: skip
    assert R.rope_vec(a, (a.q, a.k)) == 1
    a = replace(a, interleave=True)
    with pytest.raises(ValueError, match="rows on 4-byte boundaries for interleaved RoPE"):
        R.rope_vec(a, (a.q, a.k))


def test_every_selectable_kernel_is_registered():
    registered = {(s.name, e) for s in cuinfer.jit.registry.specs("utility") for e in s.name_exprs}
    for dtype in S.DTYPES:
        assert (S.append_spec(dtype).name, S.append_instance(dtype)) in registered
        for vec in S.ROPE_VECS[dtype]:
            for interleave in (False, True) if vec >= 2 else (False,):
                assert (S.rope_spec(dtype, vec).name, S.rope_instance(dtype, vec, interleave)) in registered
    for kind in ("packbits", "segment_packbits"):
        for order in ("little", "big"):
            assert (S.pack_spec().name, S.pack_instance(kind, order)) in registered
    for kind in S.POSITIONS_KERNELS:
        assert (S.positions_spec().name, S.positions_instance(kind)) in registered


# ---- packbits, positions -------------------------------------------------------------------------------------------


def _pack8(v: int, magic: int) -> int:
    """packbits.cu's pack8 on Python ints (64-bit wrap-around)."""
    m = (1 << 64) - 1
    v = int(v)
    v |= v >> 4
    v |= v >> 2
    v |= v >> 1
    v &= 0x0101010101010101
    return ((v * magic) & m) >> 56


def test_pack8_constants_match_numpy_packbits(rng):
    src = (SRC / "packbits.cu").read_text()
    big, little = (int(x, 16) for x in re.search(r"kBig \? (0x[0-9a-f]+)ull : (0x[0-9a-f]+)ull", src).groups())
    for bits in range(256):
        mask = np.array([(bits >> k) & 1 for k in range(8)], bool)
        raw = np.where(mask, rng.integers(1, 256, 8), 0).astype(np.uint8)  # any nonzero byte is a 1
        v = int(raw.view("<u8")[0])
        assert _pack8(v, little) == np.packbits(mask, bitorder="little")[0]
        assert _pack8(v, big) == np.packbits(mask, bitorder="big")[0]


def test_pack_launch_grids():
    x = np.zeros(100_000, bool)
    out = np.zeros(12_500, np.uint8)
    tx, to = cuda(x, "x"), cuda(out, "out")
    aligned = replace(tx, ptr=tx.ptr - tx.ptr % 16)
    launch = PB.pack_launch("packbits", "little", aligned, to, None, None, 12_500, sms=132)
    assert launch.grid == (-(-100_000 // (S.PACK_WARP_ELEMS * 8)),)  # a warp per 4096 elements
    launch = PB.pack_launch("packbits", "big", replace(aligned, ptr=aligned.ptr + 1), to, None, None, 12_500, sms=132)
    assert launch.grid == (-(-12_500 // 256),)  # unaligned: a thread per output byte
    assert launch.name_expr == S.pack_instance("packbits", "big")


def emulate_positions(launch: L.Launch, mem: Memory, out0: np.ndarray, out1: np.ndarray):
    p = launch.params
    n, batch = int(p["n"]), int(p["batch_size"])
    if launch.name_expr.endswith("batch_indices_positions"):
        indptr = mem.i32(int(p["indptr"]), np.arange(batch + 1))
        for t in range(n):
            live = [b for b in range(batch) if indptr[b] <= t < indptr[b + 1]]
            b = live[0] if live else -1
            out0[t] = b
            out1[t] = -1 if b < 0 else mem.i32(int(p["lens"]), b) - indptr[b + 1] + t
    else:
        for b in range(n):
            pages = mem.i32(int(p["indptr"]), b + 1) - mem.i32(int(p["indptr"]), b)
            out0[b] = (pages - 1) * int(p["page_size"]) + mem.i32(int(p["lens"]), b) if pages > 0 else 0


def test_narrow_indices_emulated():
    src = np.array([0, 5, -1, 2**31 - 1, 7, 9, 11], np.int64)
    out = np.full(7, 99, I32)
    launch = L.index_launch("narrow_indices", cuda(src, "x"), cuda(src, "x"), cuda(out, "o"), cuda(out, "o"), 7, 0,
                            0, sms=2)  # fmt: skip
    p = launch.params
    mem = Memory(src, out)
    vals = [int(mem.read(int(p["indptr"]) + 8 * i, 8).view(np.int64)[0]) for i in range(int(p["n"]))]
    out[:] = np.array(vals, np.int64).astype(I32)  # the kernel's static_cast<int>, 4 entries a thread
    assert launch.name_expr == S.positions_instance("narrow_indices") and launch.grid == (1,)
    np.testing.assert_array_equal(out, src.astype(I32))


def test_positions_launches_emulated():
    indptr, seq = np.array([0, 2, 2, 5], I32), np.array([4, 1, 9], I32)
    b, p = np.zeros(7, I32), np.zeros(7, I32)
    launch = L.index_launch("batch_indices_positions", cuda(indptr, "i"), cuda(seq, "s"), cuda(b, "b"),
                                cuda(p, "p"), 7, 3, 0, sms=4)  # fmt: skip
    emulate_positions(launch, Memory(indptr, seq), b, p)
    want = cuinfer.get_batch_indices_positions(indptr, seq, 7)
    np.testing.assert_array_equal(b, want[0])
    np.testing.assert_array_equal(p, want[1])
    kv_indptr, last = np.array([0, 2, 2, 5, 6], I32), np.array([3, 0, 1, 16], I32)
    lens = np.zeros(4, I32)
    launch = L.index_launch("seq_lens", cuda(kv_indptr, "i"), cuda(last, "l"), cuda(lens, "o"), cuda(lens, "o"),
                                4, 4, 16, sms=4)  # fmt: skip
    emulate_positions(launch, Memory(kv_indptr, last), lens, lens)
    np.testing.assert_array_equal(lens, cuinfer.get_seq_lens(kv_indptr, last, 16))


# ---- SASS: loads in flight before the first store ------------------------------------------------------------------


def _loads_before_first_store(spec, expr, arch="sm_90a"):
    from cuinfer.jit import get_compiled
    from cuinfer.jit.sass import disassemble

    mod = get_compiled(spec, arch)
    ops = disassemble(mod.cubin)[mod.lowered[expr]]
    first_store = next(i for i, op in enumerate(ops) if op.startswith("STG.E.128"))
    return sum(op.startswith("LDG.E") and "128" in op for op in ops[:first_store])


@pytest.mark.compile
def test_memory_bound_kernels_keep_loads_in_flight():
    from cuinfer.jit.sass import find_cuobjdump

    if find_cuobjdump() is None:
        pytest.skip("cuobjdump wheel not installed")
    assert _loads_before_first_store(S.append_spec("float16"), S.append_instance("float16")) >= S.APPEND_UNROLL
    for interleave in (False, True):  # rotate-half: 4 heads x 2 chunks; interleaved: 8 heads x 1 chunk
        assert _loads_before_first_store(S.rope_spec("bfloat16", 8), S.rope_instance("bfloat16", 8, interleave)) >= 8


def _gather8(mem: np.ndarray, base: int, n: int, a: int, count: int) -> int:
    """packbits.cu's gather8 over a byte buffer: x = mem[base:base + n], addresses are offsets into mem (its
    alignment stands for the device address's)."""
    a, count = int(a), int(count)
    sh = (base + a) & 7
    lo = base + a - sh
    v = 0
    if lo >= base and lo + (16 if sh else 8) <= base + n:
        w0 = int(mem[lo : lo + 8].view("<u8")[0])
        v = w0
        if sh:
            w1 = int(mem[lo + 8 : lo + 16].view("<u8")[0])
            v = ((w0 >> (8 * sh)) | (w1 << (64 - 8 * sh))) & ((1 << 64) - 1)
    else:
        for k in range(min(count, 8)):
            v |= int(mem[base + a + k]) << (8 * k)
    return v & ((1 << (8 * count)) - 1) if count < 8 else v


@pytest.mark.parametrize("offset", [0, 1, 3, 8, 13])
def test_packbits_kernel_paths_emulated(rng, offset):
    """The 16-byte warp path (lane L, round i -> output bytes 2(32i + L), +1) and the per-byte path with gather8, for
    inputs starting at several alignments, and segment_packbits' segment lookup."""
    src = (SRC / "packbits.cu").read_text()
    little = int(re.search(r"kBig \? 0x[0-9a-f]+ull : (0x[0-9a-f]+)ull", src).group(1), 16)
    n = 2 * 4096 + 77
    mem = np.zeros(offset + n + 64, np.uint8)
    mem[offset : offset + n] = (rng.random(n) < 0.5) * rng.integers(1, 256, n)
    x = mem[offset : offset + n] != 0
    out = np.zeros((n + 7) // 8, np.uint8)
    full = n // 4096 if offset % 16 == 0 else 0
    for c in range(full):
        for i in range(8):
            for lane in range(32):
                vec = mem[offset + c * 4096 + 16 * (32 * i + lane) :][:16].view("<u8")
                b0, b1 = (_pack8(int(w), little) for w in vec)
                out[c * 512 + 2 * (32 * i + lane) : c * 512 + 2 * (32 * i + lane) + 2] = (b0, b1)
    for j in range(full * 512, len(out)):
        out[j] = _pack8(_gather8(mem, offset, n, 8 * j, min(8, n - 8 * j)), little)
    np.testing.assert_array_equal(out, np.packbits(x, bitorder="little"))
    seg = np.array([0, 5, 9, 0, 130, 1, 2000, 64, 3, 9000, 4096, 0, 4097])
    n = offset + int(seg.sum()) + 3
    mem = np.zeros(n + 64, np.uint8)
    mem[offset:n] = (rng.random(n - offset) < 0.5) * rng.integers(1, 256, n - offset)
    x = mem[offset:n] != 0
    indptr = np.concatenate([[0], np.cumsum(seg)])
    new_indptr = np.concatenate([[0], np.cumsum((seg + 7) // 8)])
    for order in ("little", "big"):
        packed = _emulate_segment_packbits(mem, offset, n - offset, indptr, new_indptr, order)
        want, _ = cuinfer.segment_packbits(x[: indptr[-1]], indptr.astype(I32), bitorder=order)
        np.testing.assert_array_equal(packed, want)


def _emulate_segment_packbits(mem, base, n, indptr, new_indptr, order):
    """packbits.cu's segment_packbits: a warp per 512-byte work item of a segment; 16-bit masks of the aligned
    16-byte words (the address alignment is mem's: base stands for x's address), lane g's 128 bits from a funnel
    shift, the tail zeroed, big order by reversing each byte's bits."""
    chunk_ptr = PB.segment_chunks(new_indptr)
    out = np.full(new_indptr[-1], 0xAA, np.uint8)
    for w in range(int(chunk_ptr[-1])):
        s = max(i for i in range(len(chunk_ptr) - 1) if chunk_ptr[i] <= w)
        c = int(w - chunk_ptr[s])
        a = int(indptr[s]) + 4096 * c
        count = min(4096, int(indptr[s + 1]) - a)
        o = int(new_indptr[s]) + 512 * c
        sh = (base + a) % 16
        aw = base + a - sh  # address (index into mem) of the aligned word holding element a
        words = (sh + count + 15) // 16
        assert words <= 9 * 32
        masks = np.zeros(9 * 32, np.int64)
        for k in range(words):
            for e in range(16):  # the fast path reads whole words inside x; the edge path reads bytes inside x
                if base <= aw + 16 * k + e < base + n and mem[aw + 16 * k + e]:
                    masks[k] |= 1 << e
        bits = 0
        for k in range(9 * 32):
            bits |= int(masks[k]) << (16 * k)
        staged = np.zeros(512, np.uint8)
        for g in range(32):
            v = (bits >> (sh + 128 * g)) & ((1 << 128) - 1)
            left = count - 128 * g
            v &= (1 << max(0, min(128, left))) - 1
            b = np.frombuffer(v.to_bytes(16, "little"), np.uint8)
            if order == "big":  # bit k of each byte to bit 7 - k (the kernel's __brev and byte swap)
                b = np.unpackbits(b, bitorder="little").reshape(16, 8)[:, ::-1].dot(1 << np.arange(8))
            staged[16 * g : 16 * g + 16] = b
        nbytes = (count + 7) // 8
        out[o : o + nbytes] = staged[:nbytes]
    return out


def test_gpu_only_errors():
    """What only the GPU route checks: one device for every array, and rows too narrow for the widest RoPE row."""
    k = np.zeros((2, 1, 8), np.float16)
    cache = np.zeros((2, 2, 4, 1, 8), np.float16)
    idx = np.zeros(2, I32)

    def mixed(x, name):  # everything on the GPU but kv_indices
        t = as_tensor(x, name)
        return t if name == "kv_indices" else replace(t, device_type="cuda")

    with pytest.raises(
        ValueError, match="must be on one device but paged_kv_cache is on cuda:0 and kv_indices is on cpu"
    ):
        P.check_append(k, k, idx, idx, cache, idx, np.array([0, 1], I32), np.array([2], I32), "NHD", mixed)
    q = np.zeros((2, 1, 700), np.float16)[:, :, 1:601]  # 600 dims starting 2 bytes off: 1-element chunks
    a = R.check_rope(q, q, {"pos_ids": idx}, rotary_dim=None, interleave=False, freqs=(1.0, 1e4, None), tensor=cuda)
    with pytest.raises(ValueError, match="head_dim 600 with rotary_dim 600 needs 300 threads per row"):
        R.rope_launch(a, (a.q, a.k), False, sms=1)
