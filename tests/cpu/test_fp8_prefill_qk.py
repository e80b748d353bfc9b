"""fp8 prefill with bf16 q, whole-tile conversion, plain softmax, sm_90a (PrefillTraits::kHalfQK): Q·K^T in float16.
Each warp converts its Q rows once per item to float16 times a power of two (kernel.cuh convert_q, emulated by
``cuinfer.reference.fp8.q_f16_block``), K tiles become float16 (one cvt per pair), the inverse joins the logits' scale;
the k scale array's factor is folded into that scale too, and those kernels take the max-free softmax. NVRTC, no GPU."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from cuinfer.reference import fp8


def _block(rng, spread: int, zero_rows: int = 0) -> np.ndarray:
    """A warp's 32 Q rows of head dim 128 as bfloat16 values: rows scaled by 2^U[-spread, spread]."""
    q = rng.standard_normal((32, 128)) * 2.0 ** rng.integers(-spread, spread + 1, (32, 1))
    q[:zero_rows] = 0.0
    return q.astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("spread", [0, 6, 13, 30])
def test_float16_q_gives_the_logits_within_the_bound(rng, spread):
    """The logits of the float16 q times the inverse against the exact bfloat16 ones, for e4m3 keys of every code:
    exact for every row whose elements are within 2^28 of the warp's largest |q| (and nonzero), else within
    128 x 2^-25 x inv x max|k| (a float16 subnormal's rounding of each scaled element). Nothing overflows."""
    codes = np.arange(256, dtype=np.uint8)
    k = fp8.exact(codes, "float8_e4m3fn")
    k = k[np.isfinite(k)]
    keys = rng.choice(k, (64, 128))
    q = _block(rng, spread, zero_rows=2)
    q16, inv = fp8.q_f16_block(q)
    assert np.isfinite(q16).all() and np.abs(q16).max() < 2.0**15
    got = (q16.astype(np.float64) @ keys.T) * inv
    want = q @ keys.T
    bound = 128 * 2.0**-25 * inv * np.abs(keys).max()
    np.testing.assert_array_less(np.abs(got - want), bound + 1e-300)
    amax = np.abs(q).max()
    small = np.abs(q)[:, None, :] < amax * 2.0**-28
    exact_rows = ~np.any(small & (q[:, None, :] != 0), axis=(1, 2))
    np.testing.assert_array_equal(got[exact_rows], want[exact_rows])
    if spread <= 13:  # (2^26 between the rows: most rows exact, the others hold an element below 2^-28 of the max)
        assert exact_rows.sum() >= 16


def test_all_zero_and_huge_blocks():
    """An all-zero warp block keeps a normal inverse (the floor: 2^-64 <= inv) so x_scale stays normal and masked
    -inf logits stay -inf; bfloat16 q beyond float16's range (3e38) is scaled into it."""
    q16, inv = fp8.q_f16_block(np.zeros((32, 128)))
    assert not q16.any() and 2.0**-64 <= inv <= 1.0
    q = np.full((32, 128), 3.0e38)
    q16, inv = fp8.q_f16_block(q.astype(ml_dtypes.bfloat16).astype(np.float64))
    assert np.isfinite(q16).all() and 2.0**14 <= float(q16.max()) < 2.0**15 and inv > 1e30


def _p4_spec(kv: str, arch: str):
    from cuinfer.jit import compile_spec
    from cuinfer.jit.sass import disassemble
    from cuinfer.prefill.policy import choose_tiles
    from cuinfer.prefill.specs import PrefillKernelKey, prefill_spec
    from cuinfer.variants import lookup, render

    cfg = choose_tiles(32768, 128, 128, paged=True, kv_itemsize=1 if kv else 2)
    key = PrefillKernelKey("bfloat16", "bfloat16", 128, 128, cfg, True, render((lookup("causal"),)), kv)
    mod = compile_spec(prefill_spec(key), arch)
    (sym,) = mod.lowered.values()
    return mod.resources[sym], disassemble(mod.cubin)[sym], cfg


@pytest.mark.compile
def test_p4_fp8_kernel_runs_q_k_in_float16_on_sm90():
    """The P4 kernel (paged 128 x 64, two stages, the CTA converting K / V) on sm_90a: every MMA is a float16 one (Q·K^T
    with the converted K, P·V with V in float16), K and V are converted by cvt (F2FP ... E4M3, the K tile's 32 pairs
    unrolled beside V's), the max-free softmax is in (its VOTE.ALL), no spills; on sm_80 (no staged epilogue) Q·K^T
    stays bfloat16."""
    r, sass, cfg = _p4_spec("float8_e4m3fn", "sm_90a")
    assert (cfg.tile_q, cfg.tile_kv, cfg.stages, cfg.kv_convert) == (128, 64, 2, True)
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, r
    hmma = [op for op in sass if op.startswith("HMMA")]
    assert hmma and not [op for op in hmma if "BF16" in op], sorted(set(hmma))
    assert sum(op.startswith("F2FP.F16.E4M3") for op in sass) >= 48
    assert "VOTE.ALL" in sass
    r80, sass80, _ = _p4_spec("float8_e4m3fn", "sm_80")
    assert r80.spill_stores == 0 and r80.spill_loads == 0
    assert any(op.startswith("HMMA") and "BF16" in op for op in sass80)


def test_warp_ints_hold_the_item_with_the_cta_conversion():
    """kConvert kernels keep the item index in the warp's ints (kWarpInts 12) and copy fp8 rows of head dim 128 with 4
    threads each (kKVPairRows: 2 rows a thread, so half the paged row offsets): the host's shared-memory size mirrors
    both (tiles.smem_bytes)."""
    from cuinfer.prefill.tiles import smem_bytes, tile_config

    a = tile_config(128, 64, 128, 2, kv_itemsize=1)
    b = dataclasses.replace(a, kv_convert=False)
    # (the 16-bit K and V tiles, the 4 more warp ints, and half the paged row offsets: kKVPairRows)
    diff = smem_bytes(a, 128, 128, True) - smem_bytes(b, 128, 128, True)
    assert a.kv_convert and diff == 2 * 64 * 128 * 2 + 4 * 16 - 128 * 2 * 8
