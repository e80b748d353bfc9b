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
