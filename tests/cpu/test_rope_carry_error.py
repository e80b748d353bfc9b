"""The decode tensor-core kernel's carried RoPE sin / cos (variant::FragStates at head dim 128): a float32 model of the
recurrence the kernel runs (kernel_src/variants/apply.cuh; pos_advance of cuinfer/variants/builtins/rope.py), with
the number of tile steps between exact seeds read from the kernel source, against float64 sin / cos.

Each key's sin / cos is an exact seed advanced by up to kReseed - 1 steps of the 64-key tile and one step of 8 keys;
the seed and both steps come from ``fmath::rope_sincos`` (MUFU sin / cos on an exactly reduced angle, off by up to
~3.6e-7), modelled here as every angle off by that much in the same direction, so the errors add up. The bound the
docs give (docs/variants.md, "Accuracy": ~7e-6) must hold, far below a rotated key's 16-bit rounding (fp16: 2^-12)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

APPLY = Path(__file__).resolve().parents[2] / "kernel_src" / "variants" / "apply.cuh"
MUFU_ERR = 3.6e-7  # |error| of MUFU sin / cos on [-pi, pi] (2^-21.4)


def _reseed() -> int:
    m = re.search(r"static constexpr int kReseed = (\d+);", APPLY.read_text())
    assert m, "kReseed not found in kernel_src/variants/apply.cuh"
    return int(m.group(1))


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fmaf: one rounding of a·b + c (exact in float64 for float32 inputs but the last bits of the sum)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _state(angle: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.sin(angle + MUFU_ERR).astype(np.float32), np.cos(angle + MUFU_ERR).astype(np.float32)


def _advance(sn: np.ndarray, cs: np.ndarray, ssn: np.ndarray, scs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pos_advance of the RoPE built-in, in float32 as compiled (fmaf of a product)."""
    new_sn = _fma(sn, scs, (cs * ssn).astype(np.float32))
    new_cs = _fma(cs, scs, (-sn * ssn).astype(np.float32))
    return new_sn, new_cs


def test_carried_rope_sin_cos_stay_within_the_documented_bound():
    reseed = _reseed()
    head_dim, theta = 128, 500000.0
    freq = theta ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    worst = 0.0
    for seed_pos in np.random.default_rng(0).integers(0, 131072, 40) // 64 * 64:
        sn, cs = _state(seed_pos * freq)
        tsn, tcs = _state(64 * freq)
        ssn, scs = _state(8 * freq)
        for k in range(reseed):
            if k:
                sn, cs = _advance(sn, cs, tsn, tcs)
            s8, c8 = _advance(sn, cs, ssn, scs)  # key gid + 8 of the tile
            exact = (seed_pos + 64 * k + 8) * freq
            worst = max(worst, np.abs(s8 - np.sin(exact)).max(), np.abs(c8 - np.cos(exact)).max())
    print(f"kReseed {reseed}: worst |error| of sin / cos {worst:.2e}")
    assert worst < 7.5e-6
    assert worst < 2.0**-12 / 30  # far below a rotated fp16 key's rounding
