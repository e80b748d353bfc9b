"""The kernels' fp8 -> 16-bit conversions (kernel_src/common/fp8.cuh), emulated bit by bit in NumPy.

The CPU tests pin the device algorithm with this emulation against ml_dtypes for all 256 codes of both formats (the
shifts and scale patterns are read from the header itself, so the emulation follows the device code); the GPU test
runs the device code on the same codes and compares with it.

Paths (``convert`` below; ``arch`` as an integer, 80 for sm_80, 90 for sm_90a):

* float16 on sm_89+: ``cvt.rn.f16x2.{e4m3x2,e5m2x2}``, the exact conversion (NaN -> NaN, inf -> inf);
* float16 below sm_89 and bfloat16 everywhere: the byte in the upper half of a 16-bit lane, its 7 magnitude bits
  shifted right into the exponent / mantissa fields, the sign kept, then one multiply by a power of two (exact).
"""

from __future__ import annotations

import functools
import os
import re

import ml_dtypes
import numpy as np

FORMATS = ("float8_e4m3fn", "float8_e5m2")
TARGETS = ("float16", "bfloat16")
_CONST = re.compile(r"constexpr\s+(?:u32|int)\s+(k\w+)\s*=\s*(0x[0-9A-Fa-f]+|\d+)u?\s*;")


@functools.cache
def header_constants() -> dict[str, int]:
    """The named constants of kernel_src/common/fp8.cuh (``kShiftE4m3Bf16``, ``kScaleE4m3Bf16``, ...)."""
    from cuinfer.jit.spec import kernel_src_dir

    with open(os.path.join(kernel_src_dir(), "common", "fp8.cuh"), encoding="utf-8") as fh:
        return {m.group(1): int(m.group(2), 0) for m in _CONST.finditer(fh.read())}


def bit_path(fmt: str, target: str) -> tuple[int, int] | None:
    """(shift, scale bits) of the bit path for ``fmt`` -> ``target``; None where the byte is the result as it stands
    (e5m2 -> float16: e5m2 is the upper byte of a float16)."""
    c = header_constants()
    if target == "float16":
        return (c["kShiftE4m3Half"], c["kScaleE4m3Half"]) if fmt == "float8_e4m3fn" else None
    if fmt == "float8_e4m3fn":
        return c["kShiftE4m3Bf16"], c["kScaleE4m3Bf16"]
    return c["kShiftE5m2Bf16"], c["kScaleE5m2Bf16"]


def convert(codes: np.ndarray, fmt: str, target: str, arch: int = 90) -> np.ndarray:
    """The 16-bit results (as ``target`` values, ml_dtypes for bfloat16) the device gives for fp8 ``codes`` (uint8)."""
    codes = np.asarray(codes, dtype=np.uint8)
    t = np.dtype(ml_dtypes.bfloat16) if target == "bfloat16" else np.dtype(np.float16)
    if target == "float16" and arch >= 89:  # the cvt instruction: the exact conversion
        return codes.view(getattr(ml_dtypes, fmt)).astype(np.float16)
    y = codes.astype(np.uint16) << 8  # the byte in the upper half of its 16-bit lane
    path = bit_path(fmt, target)
    if path is None:
        return y.view(t)
    shift, scale_bits = path
    placed = (y & 0x8000) | ((y & 0x7F00) >> shift)
    scale = np.array([scale_bits], dtype=np.uint16).view(t).astype(np.float64)[0]
    # x * scale + (-0) in 16-bit arithmetic: the product is exact (a power of two, in range), so rounding it to the
    # target changes nothing, and -0 as the addend keeps the sign of a zero product
    return (placed.view(t).astype(np.float64) * scale).astype(t)


def exact(codes: np.ndarray, fmt: str) -> np.ndarray:
    """The values of fp8 ``codes`` (float64, NaN for NaN codes), as ml_dtypes defines the formats."""
    return np.asarray(codes, dtype=np.uint8).view(getattr(ml_dtypes, fmt)).astype(np.float64)


def non_finite_codes(fmt: str) -> np.ndarray:
    """The codes of ``fmt`` that are not finite numbers (e4m3fn: the two NaNs; e5m2: +-inf and six NaNs)."""
    return np.flatnonzero(~np.isfinite(exact(np.arange(256), fmt))).astype(np.uint8)


# ---- the decode tensor-core kernel's float16 fragments (fp8::f16s_pairs, fp8::q_f16_scale) ---------------------------


def f16s_pow(fmt: str) -> int:
    """fp8::F16s<F8>::kPow: the fragments of ``fmt`` hold the values times 2^-kPow (e4m3 8, e5m2 0)."""
    return 15 - 7 if fmt == "float8_e4m3fn" else 0


def f16s_pairs(words: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """fp8::f16s_pairs on 32-bit words (4 fp8 bytes each, byte 0 lowest): the float16x2 words of bytes (0, 2) and
    (1, 3), in the device's integer operations (masks and shifts from the header)."""
    c = header_constants()
    x = np.asarray(words, dtype=np.uint32)
    if fmt == "float8_e5m2":
        p02 = ((x & 0xFF) << 8) | ((x & 0xFF0000) << 8)  # __byte_perm(x, 0, 0x2404): [0, byte 0, 0, byte 2]
        return p02.astype(np.uint32), (x & 0xFF00FF00).astype(np.uint32)
    sh, mask = c["kShiftE4m3F16s"], c["kF16sMask"]
    p02 = (prmt(x, c["kF16sSel02"]) << sh) & mask
    p13 = (prmt(x, c["kF16sSel13"]) << sh) & mask
    return p02.astype(np.uint32), p13.astype(np.uint32)


def k_pairs_pow(fmt: str, arch: int = 90) -> int:
    """fp8::F16sK<F8>::kPow: the decode tensor-core kernel's K fragments hold the values times 2^-kPow (e4m3: 0 on
    sm_89+, where cvt converts, 8 below, the bit path of f16s_pairs; e5m2: 0)."""
    return f16s_pow(fmt) if fmt == "float8_e4m3fn" and arch < 89 else 0


def k_pairs(words: np.ndarray, fmt: str, arch: int = 90) -> tuple[np.ndarray, np.ndarray]:
    """fp8::k_pairs on 32-bit words: the float16x2 words of bytes (0, 1) and (2, 3) (byte 0 / 2 in the low half), times
    2^-k_pairs_pow: e4m3 on sm_89+ the cvt (the exact conversion, NaN kept), below it f16s_pairs' integer path with
    the header's kF16sSel01 / kF16sSel23; e5m2 the bytes as float16 upper bytes (byte permutes)."""
    c = header_constants()
    x = np.ascontiguousarray(words, dtype=np.uint32)
    if fmt == "float8_e5m2":
        p01 = ((x & 0xFF) << 8) | ((x & 0xFF00) << 16)  # __byte_perm(x, 0, 0x1404): [0, byte 0, 0, byte 1]
        p23 = ((x & 0xFF0000) >> 8) | (x & 0xFF000000)  # __byte_perm(x, 0, 0x3424): [0, byte 2, 0, byte 3]
        return p01.astype(np.uint32), p23.astype(np.uint32)
    if arch >= 89:
        b = x.view(np.uint8).reshape(-1, 4)  # (little-endian: byte 0 first)
        h = convert(b.reshape(-1), fmt, "float16", arch).view(np.uint16).reshape(-1, 4).astype(np.uint32)
        return (h[:, 0] | (h[:, 1] << 16)).reshape(x.shape), (h[:, 2] | (h[:, 3] << 16)).reshape(x.shape)
    sh, mask = c["kShiftE4m3F16s"], c["kF16sMask"]
    p01 = (prmt(x, c["kF16sSel01"]) << sh) & mask
    p23 = (prmt(x, c["kF16sSel23"]) << sh) & mask
    return p01.astype(np.uint32), p23.astype(np.uint32)


def v_pairs_pow(fmt: str, arch: int = 90) -> int:
    """fp8::F16sV<F8>::kPow: the decode tensor-core kernel's V fragments hold the values times 2^-kPow (e4m3: 0 on
    sm_89+, where cvt converts, 8 below, the bit path of f16s_pairs; e5m2: 0)."""
    return f16s_pow(fmt) if fmt == "float8_e4m3fn" and arch < 89 else 0


def v_pairs(words: np.ndarray, fmt: str, arch: int = 90) -> tuple[np.ndarray, np.ndarray]:
    """fp8::v_pairs on 32-bit words: the float16x2 words of bytes (0, 2) and (1, 3) (byte 0 / 1 in the low half),
    times 2^-v_pairs_pow: e4m3 on sm_89+ the header's kVPairsSel byte permute ([b0, b2, b1, b3]) and the cvt of each
    16-bit half (k_pairs' conversion), elsewhere f16s_pairs."""
    if fmt == "float8_e5m2" or arch < 89:
        return f16s_pairs(words, fmt)
    return k_pairs(prmt(np.asarray(words, dtype=np.uint32), header_constants()["kVPairsSel"]), fmt, arch)


def prmt(x: np.ndarray, sel: int) -> np.ndarray:
    """PTX prmt.b32 d, x, 0, sel (default mode): result byte n is byte (sel_n & 7) of (x, 0), or that byte's sign bit
    replicated when sel_n & 8."""
    x = np.asarray(x, dtype=np.uint64)
    out = np.zeros_like(x)
    for n in range(4):
        s = (sel >> (4 * n)) & 0xF
        byte = (x >> np.uint64(8 * (s & 7))) & np.uint64(0xFF) if (s & 7) < 4 else np.zeros_like(x)
        if s & 8:
            byte = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        out |= byte << np.uint64(8 * n)
    return out.astype(np.uint32)


def halves(words: np.ndarray) -> np.ndarray:
    """float16x2 words -> [.., 2] float64 values (low half first)."""
    w = np.asarray(words, dtype=np.uint32)
    lo = (w & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    hi = (w >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
    return np.stack([lo, hi], axis=-1)


def q_f16_scale(amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp8::q_f16_scale: the power of two putting a q row with max |q| = ``amax`` (float32) into [2^14, 2^15) in
    float16, and its inverse, as float32 arrays (from the exponent bits, clamped as the device does)."""
    top = header_constants()["kQF16TopExp"]
    e = (np.asarray(amax, dtype=np.float32).view(np.uint32) >> 23) & 0xFF
    se = np.clip(127 + top - (e.astype(np.int64) - 127), 1, 253)
    sc = (se.astype(np.uint32) << 23).view(np.float32)
    inv = ((254 - se).astype(np.uint32) << 23).view(np.float32)
    return sc, inv


# ---- prefill, float16 Q·K^T with fp8 K (kernel.cuh convert_q, PrefillTraits::kHalfQK) -----------------------------


def q_f16_block(q: np.ndarray) -> tuple[np.ndarray, float]:
    """The prefill kernel's float16 Q of one warp (kernel.cuh ``convert_q``): the warp's bfloat16 q rows (any float
    array of bfloat16 values) times the power of two ``q_f16_scale`` gives their largest |q| (floored at
    2^-kQF16AmaxFloorExp, so the inverse stays >= 2^-64 and an all-zero block keeps a normal logits' scale), rounded to
    float16 (the float32 product is exact; cvt.rn rounds to nearest even). Returns the float16 values and the inverse
    the kernel folds into the logits' scale."""
    floor = np.float32(2.0 ** -header_constants()["kQF16AmaxFloorExp"])
    amax = max(np.float32(np.abs(np.asarray(q, dtype=np.float64)).max()), floor)
    sc, inv = q_f16_scale(np.float32([amax]))
    return (np.asarray(q, dtype=np.float64) * float(sc[0])).astype(np.float16), float(inv[0])
