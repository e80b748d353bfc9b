"""append_paged_kv_cache into fp8 caches without a GPU: the integer float -> fp8 path of kernel_src/utility/append.cu
(sm_80) emulated bit by bit against ml_dtypes (every float16 and bfloat16 value, the fp8 values and the ties between
them, random float32 bit patterns), the NumPy route against hand-written codes, the planned launches run by the
emulator of tests/cpu/test_utilities_launch.py with the quantising store, and the compiled kernels' SASS (no spills;
sm_90a converts with F2FP.SATFINITE, sm_80 with the integer path)."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import cuinfer
from cuinfer.reference.paged import quantize_fp8
from cuinfer.utils import paged as P
from cuinfer.utils import specs as S
from tests.cpu.test_utilities_launch import Memory, _append_case, cuda, emulate_append

SRC = Path(__file__).resolve().parents[2] / "kernel_src" / "utility" / "append.cu"
I32 = np.int32
BF16 = ml_dtypes.bfloat16
FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
CUDA_NAMES = {"e4m3": "__nv_fp8_e4m3", "e5m2": "__nv_fp8_e5m2"}


def _constants(fmt: str) -> tuple[int, int, int]:
    """kMant, kBias, kMaxCode of Fp8Format<F8> in append.cu."""
    m = re.search(
        rf"struct Fp8Format<{CUDA_NAMES[fmt]}> {{\s*static constexpr int kMant = (\d+), kBias = (\d+);\s*"
        r"static constexpr u32 kMaxCode = (0x[0-9a-f]+);",
        SRC.read_text(),
    )
    assert m, f"Fp8Format<{CUDA_NAMES[fmt]}> not found in {SRC}"
    return int(m[1]), int(m[2]), int(m[3], 16)


def to_fp8_bits(f: np.ndarray, fmt: str) -> np.ndarray:
    """append.cu's to_fp8_bits<F8> over float32 values, in int64 (the kernel's u32 never wraps on these paths)."""
    mant, bias, max_code = _constants(fmt)
    bits = np.asarray(f, np.float32).view(np.uint32).astype(np.int64)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    e = mag >> 23
    shift = 23 - mant
    r = mag - ((127 - bias) << 23)
    normal = np.minimum((r + ((1 << (shift - 1)) - 1) + ((r >> shift) & 1)) >> shift, max_code)
    m = np.where(e > 0, (mag & 0x7FFFFF) | 0x800000, 0)
    s = np.maximum(np.minimum(151 - bias - mant - e, 31), 1)  # (>= 24 - mant where the subnormal branch is taken)
    sub = (m + ((1 << (s - 1)) - 1) + ((m >> s) & 1)) >> s
    code = np.where(mag > 0x7F800000, 0x7F, np.where(e >= 128 - bias, normal, sub))
    return (sign | code).astype(np.uint8)


def _values(fmt: str, rng) -> np.ndarray:
    """float32 values covering the conversion: every float16 and bfloat16 value, every fp8 value, the midpoints
    between neighbouring fp8 values (ties) and one float32 ulp either side, and random float32 bit patterns."""
    f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    bf16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    codes = np.arange(256, dtype=np.uint8).view(FORMATS[fmt]).astype(np.float32)
    finite = np.unique(codes[np.isfinite(codes)])
    mid = (finite[:-1].astype(np.float64) + finite[1:]) / 2  # exact in float32 (fp8 values have <= 4 bits)
    top = float(ml_dtypes.finfo(FORMATS[fmt]).max)
    top_ulp = top * 2.0 ** -(3 if fmt == "e4m3" else 2)  # the next value the format would have (its 'inf' / NaN)
    mid = np.concatenate([mid, [top + top_ulp / 2], -mid]).astype(np.float32)
    near = np.concatenate([np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))])
    rand = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([f16, bf16, finite, mid, near, rand, np.float32([np.inf, -np.inf, 0.0, -0.0])])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_integer_path_matches_ml_dtypes(fmt, rng):
    x = _values(fmt, rng)
    got = to_fp8_bits(x, fmt)
    want = quantize_fp8(x, FORMATS[fmt]).view(np.uint8)
    nan = np.isnan(x)
    assert (got[nan] & 0x7F == 0x7F).all()  # NaN stays NaN (the code of cvt's canonical NaN)
    assert np.isnan(want[nan].view(FORMATS[fmt]).astype(np.float32)).all()
    bad = np.flatnonzero(got[~nan] != want[~nan])
    assert not bad.size, f"{x[~nan][bad[0]]!r}: kernel 0x{got[~nan][bad[0]]:02x}, ml_dtypes 0x{want[~nan][bad[0]]:02x}"
    # saturation: beyond the max finite (infinities included) gives the max finite, never inf / NaN
    top = float(ml_dtypes.finfo(FORMATS[fmt]).max)
    over = np.isfinite(x) & (np.abs(x) > top) | np.isinf(x)
    assert (got[over] & 0x7F == _constants(fmt)[2]).all()


def test_quantize_fp8_rounds_once():
    """float32 -> fp8 directly: a float16 step would round 1.0625 + 2^-20 to the tie 1.0625 and then to even 1.0."""
    x = np.float32(1.0625 + 2.0**-20)
    assert float(quantize_fp8(x, ml_dtypes.float8_e4m3fn).astype(np.float32)) == 1.125
    assert int(to_fp8_bits(np.float32([x]), "e4m3")[0]) == 0x39  # 1.125


# x (float16), scale -> stored code: hand-written from the formats' definitions
HAND = {
    "e4m3": [
        (1.0, 0.5, 0x40),  # 2.0 = 1.0 x 2^1: exponent 1 + 7 = 8, mantissa 0
        (-3.0, 2.0, 0xBC),  # -1.5: sign, exponent 7, mantissa 100
        (300.0, 0.5, 0x7E),  # 600 > 448: saturated
        (-1000.0, 1.0, 0xFE),  # -448
        (460.0, 1.0, 0x7E),  # between 448 and 480 (no such finite value): 448
        (1.0625, 1.0, 0x38),  # tie between 1.0 (000) and 1.125 (001): even, 1.0
        (1.1875, 1.0, 0x3A),  # tie between 1.125 (001) and 1.25 (010): even, 1.25
        (2.0**-10, 1.0, 0x00),  # half the smallest subnormal 2^-9: tie, even 0
        (3 * 2.0**-10, 1.0, 0x02),  # 1.5 x 2^-9: tie between codes 1 and 2: 2
        (2.0**-6, 4.0, 0x02),  # 2^-8 = 2 x 2^-9: subnormal code 2
        (0.875 * 2.0**-6, 1.0, 0x07),  # largest subnormal 7 x 2^-9
        (float("inf"), 1.0, 0x7E),  # infinity saturates
        (-0.0, 3.0, 0x80),
    ],
    "e5m2": [
        (1.0, 0.5, 0x40),  # 2.0: exponent 1 + 15 = 16, mantissa 00
        (60000.0, 1.0, 0x7B),  # beyond 57344 (61440 would round to inf): 57344
        (-20000.0, 0.25, 0xFB),  # -80000: -57344
        (1.125, 1.0, 0x3C),  # tie between 1.0 (00) and 1.25 (01): even, 1.0
        (1.375, 1.0, 0x3E),  # tie between 1.25 (01) and 1.5 (10): 1.5
        (2.0**-17, 1.0, 0x00),  # half the smallest subnormal 2^-16: 0
        (3 * 2.0**-17, 1.0, 0x02),  # tie between codes 1 and 2: 2
        (2.0**-10, 64.0, 0x01),  # 2^-16: the smallest subnormal
    ],
}


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("as_uint8", [False, True], ids=["fp8", "uint8-kv_dtype"])
def test_numpy_route_stores_hand_written_codes(fmt, as_uint8):
    f8 = FORMATS[fmt]
    for x, scale, code in HAND[fmt]:
        k = np.full((1, 1, 8), x, np.float16)
        cache = np.zeros((2, 2, 1, 1, 8), f8)
        target = cache.view(np.uint8) if as_uint8 else cache
        kw = {"kv_dtype": f8} if as_uint8 else {}
        cuinfer.append_paged_kv_cache(k, -k, np.array([0], I32), np.array([0], I32), target, np.array([1], I32),
                                      np.array([0, 1], I32), np.array([1], I32), k_scale=scale, v_scale=scale,
                                      **kw)  # fmt: skip
        got = cache.view(np.uint8)[1, :, 0, 0]
        assert (got[0] == code).all(), f"{fmt} {x} / {scale}: 0x{got[0, 0]:02x}, want 0x{code:02x}"
        assert (got[1] == code ^ 0x80).all()  # v = -k: the sign bit alone
        assert not cache.view(np.uint8)[0].any()  # page 0 untouched
        assert int(to_fp8_bits(np.float32([np.float32(np.float16(x)) / np.float32(scale)]), fmt)[0]) == code


def fp8_store(mem: Memory, in_dtype, fmt: str):
    """CacheStoreFp8 for emulate_append: 8 values of 16 bits in, each to_fp8_bits(float32(x) / scale), 8 bytes out."""

    def store(dst, src, side):
        scale = np.float32(side["scale"])
        for d, s in zip(dst, src, strict=True):
            out = to_fp8_bits(mem.read(s, 16).view(in_dtype).astype(np.float32) / scale, fmt)
            mem.check(d, 8)
            ctypes.memmove(int(d), out.ctypes.data, 8)

    return store


@pytest.mark.parametrize(
    ("page_size", "layout", "as_tuple", "dtype", "fmt"),
    [
        pytest.param(1, "NHD", False, np.float16, "e4m3", id="page1-nhd-fp16-e4m3"),
        pytest.param(16, "HND", False, BF16, "e5m2", id="page16-hnd-bf16-e5m2"),
        pytest.param(5, "NHD", True, BF16, "e4m3", id="page5-nhd-tuple-bf16-e4m3"),
        pytest.param(16, "NHD", True, np.float16, "e5m2", id="page16-nhd-tuple-fp16-e5m2"),
    ],
)
def test_fp8_launch_emulated(rng, page_size, layout, as_tuple, dtype, fmt):
    k, v, bidx, pos, cache, indices, indptr, last, qkv = _append_case(rng, page_size, layout, as_tuple, dtype)
    f8 = FORMATS[fmt]
    top = float(ml_dtypes.finfo(f8).max)
    qkv[...] = (qkv.astype(np.float32) * np.float32(top / 8)).astype(dtype)  # some values beyond max finite x scale
    ks, vs = 0.37, 2.5
    k[0, 0, 0] = 2 * top * ks  # (one K value surely past saturation: the last assertion's premise, whatever the seed)
    cache = tuple(c.astype(f8) for c in cache) if as_tuple else cache.astype(f8)
    want = tuple(c.copy() for c in cache) if as_tuple else cache.copy()
    cuinfer.append_paged_kv_cache(k, v, bidx, pos, want, indices, indptr, last, kv_layout=layout, k_scale=ks,
                                  v_scale=vs)  # fmt: skip
    a = P.check_append(k, v, bidx, pos, cache, indices, indptr, last, layout, cuda)
    a = P.replace(a, k_scale=float(np.float32(ks)), v_scale=float(np.float32(vs)))
    launches = P.append_launches(a, sms=3)
    fmt_name = "float8_e4m3fn" if fmt == "e4m3" else "float8_e5m2"
    assert {x.name_expr for x in launches} == {S.append_instance(np.dtype(dtype).name, fmt_name)}
    mem = Memory(qkv, bidx, pos, indices, indptr, last, *(cache if as_tuple else (cache,)))
    for launch in launches:
        emulate_append(launch, mem, 2, fp8_store(mem, dtype, fmt))
    for got, exp in zip(cache if as_tuple else (cache,), want if as_tuple else (want,), strict=True):
        np.testing.assert_array_equal(got.view(np.uint8), exp.view(np.uint8))
    # saturated somewhere: the largest magnitude (the byte without its sign) is the max finite code
    assert ((want[0] if as_tuple else want).view(np.uint8) & 0x7F).max() == _constants(fmt)[2]


@pytest.mark.compile
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_append_kernels_compile_without_spills(dtype, fmt):
    from cuinfer.jit import get_compiled
    from cuinfer.jit.sass import disassemble, find_cuobjdump

    spec, expr = S.append_spec(dtype, fmt), S.append_instance(dtype, fmt)
    for arch in ("sm_80", "sm_90a"):
        mod = get_compiled(spec, arch)
        for name, res in mod.resources.items():
            assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, (arch, name, res)
        if find_cuobjdump() is None:
            continue
        ops = disassemble(mod.cubin)[mod.lowered[expr]]
        f2fp = [op for op in ops if op.startswith("F2FP") and "SATFINITE" in op]
        if arch == "sm_90a":
            tag = "E4M3" if "e4m3" in fmt else "E5M2"
            assert len(f2fp) == 2 * 4 * S.APPEND_UNROLL and all(tag in op for op in f2fp), (
                f2fp
            )  # (K, V) x 4 pairs x rows
        else:
            assert not f2fp  # no fp8 cvt on sm_80: the integer path
        first_store = next(i for i, op in enumerate(ops) if op.startswith("STG.E.64"))
        loads = sum(op.startswith("LDG.E") and "128" in op for op in ops[:first_store])
        assert loads >= 2 * S.APPEND_UNROLL, loads  # every 16-byte load in flight before the first store
