"""The fp8 -> 16-bit conversions of the kernels (kernel_src/common/fp8.cuh), pinned without a GPU.

``cuinfer.reference.fp8`` emulates each device path bit by bit, with the shifts and scale patterns read from the
header itself; here that emulation is checked against ml_dtypes for all 256 codes of both formats, into both 16-bit
types, on both arch paths (sm_89+: the cvt instruction for float16; below: the bit path). The GPU test
(tests/gpu/test_fp8_gpu.py) runs the device code on the same codes and compares it with the emulation. The probe
kernel it runs is compiled here, and its SASS shows the conversion instructions of each path.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cuinfer.reference import fp8

CODES = np.arange(256, dtype=np.uint8)
PATHS = [pytest.param(f, t, a, id=f"{f}-{t}-sm{a}") for f in fp8.FORMATS for t in fp8.TARGETS for a in (80, 90)]


@pytest.mark.parametrize(("fmt", "target", "arch"), PATHS)
def test_every_finite_code_converts_exactly(fmt, target, arch):
    got = fp8.convert(CODES, fmt, target, arch)
    assert got.dtype == (ml_dtypes.bfloat16 if target == "bfloat16" else np.float16)
    want = fp8.exact(CODES, fmt)
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got.astype(np.float64)[fin], want[fin])
    # signed zeros keep their sign (the multiplies add -0, which leaves a product's sign)
    zero = fin & (want == 0)
    np.testing.assert_array_equal(np.signbit(got.astype(np.float64)[zero]), np.signbit(want[zero]))
    # and the 16-bit patterns are the unique encodings of those values
    t = np.dtype(ml_dtypes.bfloat16) if target == "bfloat16" else np.dtype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16)[fin], want[fin].astype(t).view(np.uint16))


@pytest.mark.parametrize(("fmt", "target", "arch"), PATHS)
def test_non_finite_codes_map_as_documented(fmt, target, arch):
    """What common/fp8.cuh's header comment promises for the codes that are no numbers: the cvt path (float16 on
    sm_89+; e5m2 -> float16 everywhere, a byte permute) keeps NaN and inf; the bit paths give e4m3fn NaN -> +-480,
    e5m2 inf -> +-65536 and e5m2 NaN -> +-65536 x (1.25, 1.5, 1.75)."""
    bad = fp8.non_finite_codes(fmt)
    assert len(bad) == (2 if fmt == "float8_e4m3fn" else 8)
    got = fp8.convert(bad, fmt, target, arch).astype(np.float64)
    sign = np.where(bad & 0x80, -1.0, 1.0)
    keeps = target == "float16" and (arch >= 89 or fmt == "float8_e5m2")
    if keeps:
        want = fp8.exact(bad, fmt)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    elif fmt == "float8_e4m3fn":
        np.testing.assert_array_equal(got, 480.0 * sign)
    else:
        mant = (bad & 0x3).astype(np.float64)
        np.testing.assert_array_equal(got, 65536.0 * (1 + mant / 4) * sign)


def test_the_emulation_reads_the_header():
    """The constants come from common/fp8.cuh, and they are the powers of two the formats' biases call for."""
    c = fp8.header_constants()
    as_f16 = lambda bits: float(np.array([bits], np.uint16).view(np.float16)[0])  # noqa: E731
    as_bf16 = lambda bits: float(np.array([bits], np.uint16).view(ml_dtypes.bfloat16)[0])  # noqa: E731
    # the shift is the difference of the exponent widths (e4m3 4, e5m2 5, float16 5, bfloat16 8 bits), the scale
    # 2^(difference of the biases) (e4m3 7, e5m2 15, float16 15, bfloat16 127)
    assert (c["kShiftE4m3Half"], as_f16(c["kScaleE4m3Half"])) == (5 - 4, 2.0 ** (15 - 7))
    assert (c["kShiftE4m3Bf16"], as_bf16(c["kScaleE4m3Bf16"])) == (8 - 4, 2.0 ** (127 - 7))
    assert (c["kShiftE5m2Bf16"], as_bf16(c["kScaleE5m2Bf16"])) == (8 - 5, 2.0 ** (127 - 15))
    assert c["kSignMask"] == 0x80008000 and c["kMagMask"] == 0x7F007F00 and c["kNegZero2"] == 0x80008000


def test_the_emulated_bit_path_is_what_the_code_does_for_a_code():
    """One code by hand: e4m3 0x3A = +1.25 (exponent 7, mantissa 2): in the upper byte 0x3A00; magnitude >> 4 ->
    0x03A0, the bfloat16 1.25 x 2^-120; times 2^120 -> 1.25."""
    placed = (0x3A00 & 0x7F00) >> fp8.header_constants()["kShiftE4m3Bf16"]
    assert placed == 0x03A0
    v = float(np.array([placed], np.uint16).view(ml_dtypes.bfloat16)[0])
    assert v == 1.25 * 2.0**-120
    assert float(fp8.convert(np.array([0x3A], np.uint8), "float8_e4m3fn", "bfloat16")[0]) == 1.25


# ---- the probe kernel the GPU test runs -----------------------------------------------------------------------------


def _probe_specs():
    from cuinfer.jit import KernelSpec

    out = []
    for target, ct in (("float16", "half"), ("bfloat16", "__nv_bfloat16")):
        for fmt, f8 in (("float8_e4m3fn", "__nv_fp8_e4m3"), ("float8_e5m2", "__nv_fp8_e5m2")):
            expr = f"cuinfer::fp8_probe<{ct}, {f8}>"
            out.append((target, fmt, KernelSpec(f"test/fp8_probe/{target}/{fmt}", "debug/fp8_probe.cu", (expr,))))
    return out


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_probe_compiles_with_the_conversion_instructions(arch):
    """On sm_90a the float16 path is one F2FP.F16.E4M3 / E5M2 per pair (cvt.rn.f16x2.e4m3x2); the bfloat16 path (and
    float16 e4m3 on sm_80) is byte permutes, logic ops and one half-precision multiply per pair, with no conversion
    through float (no F2F, no F2FP from fp32); e5m2 -> float16 on sm_80 is byte permutes alone. No local memory."""
    from cuinfer.jit import get_compiled
    from cuinfer.jit.sass import check_sass, disassemble, find_cuobjdump

    if find_cuobjdump() is None:
        pytest.skip("cuobjdump wheel not installed")
    for target, fmt, spec in _probe_specs():
        mod = get_compiled(spec, arch)
        (sym,) = mod.lowered.values()
        r = mod.resources[sym]
        assert r.spill_stores == r.spill_loads == r.stack_frame == 0
        ops = disassemble(mod.cubin)[sym]
        fmt_tag = "E4M3" if "e4m3" in fmt else "E5M2"
        if target == "float16" and arch == "sm_90a":
            expect = (rf"F2FP\.F16\.{fmt_tag}",)
        elif target == "float16" and fmt_tag == "E5M2":
            expect = (r"PRMT",)
        elif target == "float16":
            expect = (r"PRMT", r"HMUL2|HFMA2")
        else:
            expect = (r"PRMT", r"HMUL2\.BF16|HFMA2\.BF16")
        forbid = (r"LDL", r"STL", r"F2F\.", r"F2FP\.(BF16|F16)\.F32")
        assert not check_sass(ops, arch, expect, forbid), (target, fmt, check_sass(ops, arch, expect, forbid))
        n_conv = sum(1 for op in ops if op.startswith("F2FP") and fmt_tag in op)
        if target == "float16" and arch == "sm_90a":
            assert n_conv == 4, f"{n_conv} F2FP for the 4 pairs of a thread (one per pair)"


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(
    ("probe", "e4m3_ops"),
    [("kpairs", (r"F2FP\.F16\.E4M3",)), ("vpairs", (r"F2FP\.F16\.E4M3", r"PRMT"))],
)
def test_pair_probes_compile_to_one_cvt_per_e4m3_pair(arch, probe, e4m3_ops):
    """fp8::k_pairs / fp8::v_pairs: e4m3 on sm_90a is one F2FP.F16.E4M3 per pair on the register's halves (2 per
    register, no multiply, no integer op; v_pairs first puts its pairs in the halves with one byte permute); e4m3 on
    sm_80 the integer path (byte permutes, no cvt, no multiply); e5m2 byte permutes (and, for V, a mask) alone."""
    from cuinfer.jit import KernelSpec, get_compiled
    from cuinfer.jit.sass import check_sass, disassemble, find_cuobjdump

    if find_cuobjdump() is None:
        pytest.skip("cuobjdump wheel not installed")
    for fmt, f8 in (("float8_e4m3fn", "__nv_fp8_e4m3"), ("float8_e5m2", "__nv_fp8_e5m2")):
        expr = f"cuinfer::fp8_probe_{probe}<{f8}>"
        mod = get_compiled(KernelSpec(f"test/fp8_probe_{probe}/{fmt}", "debug/fp8_probe.cu", (expr,)), arch)
        (sym,) = mod.lowered.values()
        ops = disassemble(mod.cubin)[sym]
        n_cvt = sum(1 for op in ops if op.startswith("F2FP.F16.E"))
        forbid = (r"LDL", r"STL", r"F2F\.", r"HMUL2", r"HFMA2")
        if fmt == "float8_e4m3fn" and arch == "sm_90a":
            assert n_cvt == 2, f"{n_cvt} F2FP for the 2 pairs of a register"
            assert not check_sass(ops, arch, e4m3_ops, forbid)
        else:
            assert n_cvt == 0
            assert not check_sass(ops, arch, (r"PRMT",), forbid)


# ---- the decode tensor-core kernel's float16 fragments --------------------------------------------------------------

WORDS = CODES.astype(np.uint32) * 0x01010101  # every code in all four bytes
# byte b of word j carries code j - b (mod 256): the 4 bytes of a word differ, which catches a wrong byte
MIXED = (
    CODES.astype(np.uint32)
    | (np.roll(CODES, 1).astype(np.uint32) << 8)
    | (np.roll(CODES, 2).astype(np.uint32) << 16)
    | (np.roll(CODES, 3).astype(np.uint32) << 24)
)


def _check_bytes(got: list, k: int, fmt: str, nan_as_480: bool) -> None:
    """got[b]: the converted byte b of every MIXED word, times 2^-k: each finite code exact (signed zeros too); the
    non-finite codes +-480 (the e4m3 integer path's NaN, +-1.875 times 2^8) or as ml_dtypes has them."""
    for b in range(4):
        codes_b = np.roll(CODES, b)
        with np.errstate(invalid="ignore"):  # (NaN codes)
            w, g = fp8.exact(codes_b, fmt), got[b] * 2.0**k
        f = np.isfinite(w)
        np.testing.assert_array_equal(g[f], w[f])
        np.testing.assert_array_equal(np.signbit(g[f & (w == 0)]), np.signbit(w[f & (w == 0)]))
        bad = ~f
        if nan_as_480:
            np.testing.assert_array_equal(g[bad], 480.0 * np.where(codes_b[bad] & 0x80, -1.0, 1.0))
        else:
            np.testing.assert_array_equal(np.isnan(g[bad]), np.isnan(w[bad]))
            np.testing.assert_array_equal(g[bad & ~np.isnan(w)], w[bad & ~np.isnan(w)])


@pytest.mark.parametrize("fmt", fp8.FORMATS)
def test_f16s_pairs_are_the_codes_times_a_power_of_two(fmt):
    """fp8::f16s_pairs: bytes (0, 2) and (1, 3) as float16 values times 2^-kPow (e4m3 8, e5m2 0), exact for every
    finite code (subnormals included); non-finite: e4m3fn NaN -> +-1.875 (480 after 2^8), e5m2 keeps inf and NaN."""
    k = fp8.f16s_pow(fmt)
    want = fp8.exact(CODES, fmt)
    fin = np.isfinite(want)
    p02, p13 = fp8.f16s_pairs(MIXED, fmt)
    got = [fp8.halves(p02)[:, 0], fp8.halves(p13)[:, 0], fp8.halves(p02)[:, 1], fp8.halves(p13)[:, 1]]
    _check_bytes(got, k, fmt, nan_as_480=fmt == "float8_e4m3fn")
    assert fin.sum() == 256 - len(fp8.non_finite_codes(fmt))
    # the identical-bytes words give both halves the same value
    p02, p13 = fp8.f16s_pairs(WORDS, fmt)
    np.testing.assert_array_equal(p02, p13)


@pytest.mark.parametrize("arch", (80, 90))
@pytest.mark.parametrize("fmt", fp8.FORMATS)
def test_k_pairs_are_the_codes_times_a_power_of_two(fmt, arch):
    """fp8::k_pairs (the decode tensor-core kernel's K): bytes (0, 1) and (2, 3) as float16 values times 2^-kPow
    (e4m3: 0 on sm_89+, the cvt; 8 on sm_80, the integer path; e5m2: 0), exact for every finite code; non-finite: the
    cvt and e5m2 keep NaN and inf, sm_80's e4m3fn NaN -> +-1.875 (480 after 2^8)."""
    k = fp8.k_pairs_pow(fmt, arch)
    assert k == (8 if fmt == "float8_e4m3fn" and arch == 80 else 0)
    p01, p23 = fp8.k_pairs(MIXED, fmt, arch)
    got = [fp8.halves(p01)[:, 0], fp8.halves(p01)[:, 1], fp8.halves(p23)[:, 0], fp8.halves(p23)[:, 1]]
    _check_bytes(got, k, fmt, nan_as_480=fmt == "float8_e4m3fn" and arch == 80)


@pytest.mark.parametrize("arch", (80, 90))
@pytest.mark.parametrize("fmt", fp8.FORMATS)
def test_v_pairs_are_the_codes_times_a_power_of_two(fmt, arch):
    """fp8::v_pairs (the decode tensor-core kernel's V): bytes (0, 2) and (1, 3) as float16 values times 2^-kPow
    (e4m3: 0 on sm_89+, a byte permute and the cvt; 8 on sm_80, f16s_pairs' integer path; e5m2: 0), exact for every
    finite code; non-finite: the cvt and e5m2 keep NaN and inf, sm_80's e4m3fn NaN -> +-1.875 (480 after 2^8)."""
    k = fp8.v_pairs_pow(fmt, arch)
    assert k == (8 if fmt == "float8_e4m3fn" and arch == 80 else 0)
    p02, p13 = fp8.v_pairs(MIXED, fmt, arch)
    got = [fp8.halves(p02)[:, 0], fp8.halves(p13)[:, 0], fp8.halves(p02)[:, 1], fp8.halves(p13)[:, 1]]
    _check_bytes(got, k, fmt, nan_as_480=fmt == "float8_e4m3fn" and arch == 80)
    if arch == 80 or fmt == "float8_e5m2":  # (f16s_pairs itself there)
        for a, b in zip(fp8.v_pairs(MIXED, fmt, arch), fp8.f16s_pairs(MIXED, fmt), strict=True):
            np.testing.assert_array_equal(a, b)


def test_f16s_constants():
    c = fp8.header_constants()
    assert c["kShiftE4m3F16s"] == 7 and c["kF16sMask"] == 0xBF80BF80 and c["kQF16TopExp"] == 14
    assert fp8.f16s_pow("float8_e4m3fn") == 15 - 7 and fp8.f16s_pow("float8_e5m2") == 0
    # prmt as PTX defines it: 0x3A (+1.25) in byte 1, 0xBA (-1.25) in byte 3 -> [0x3A, 0x00, 0xBA, 0xFF] for 0xB391
    assert fp8.prmt(np.array([0xBA003A00], np.uint32), c["kF16sSel13"])[0] == 0xFFBA003A
    # k_pairs' sm_80 selectors: [byte 0, sign, byte 1, sign] and [byte 2, sign, byte 3, sign]
    assert fp8.prmt(np.array([0x3ABA0000], np.uint32), c["kF16sSel23"])[0] == 0x003AFFBA
    assert fp8.prmt(np.array([0x00003ABA], np.uint32), c["kF16sSel01"])[0] == 0x003AFFBA
    # v_pairs' selector on sm_89+: [byte 0, byte 2, byte 1, byte 3]
    assert fp8.prmt(np.array([0x44332211], np.uint32), c["kVPairsSel"])[0] == 0x44223311


def test_q_f16_scale_puts_each_row_max_in_the_top_binade():
    """fp8::q_f16_scale: amax x sc in [2^14, 2^15) (so every bfloat16 / float16 q within 2^28 of the row max is exact in
    float16 and nothing overflows), inv = 1 / sc exactly; an all-zero row stays zero."""
    amax = np.concatenate([2.0 ** np.arange(-100, 100, 0.37), [3.0e38, 65504.0, 1e-30]]).astype(np.float32)
    sc, inv = fp8.q_f16_scale(amax)
    y = amax.astype(np.float64) * sc.astype(np.float64)
    assert np.all((y >= 2.0**14) & (y < 2.0**15))
    np.testing.assert_array_equal(sc.astype(np.float64) * inv.astype(np.float64), 1.0)
    sc0, inv0 = fp8.q_f16_scale(np.float32([0.0]))
    assert np.isfinite(sc0).all() and inv0[0] > 0
    # bfloat16 q values of a row: exact in float16 after the scale down to 2^-28 of the max
    rng = np.random.default_rng(0)
    q = (rng.standard_normal(4096) * 2.0 ** rng.integers(-20, 20, 4096)).astype(ml_dtypes.bfloat16).astype(np.float64)
    s, _ = fp8.q_f16_scale(np.float32([np.abs(q).max()]))
    qs = q * float(s[0])
    keep = np.abs(qs) >= 2.0**-14
    np.testing.assert_array_equal(qs.astype(np.float16).astype(np.float64)[keep], qs[keep])
