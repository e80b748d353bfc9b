"""Host side of the prefill kernel specs: the fast-division magic numbers, the name expressions, and (compiled with
NVRTC, no GPU) that the C++ traits agree with the Python shared-memory sizes for every tile configuration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cuinfer.prefill.specs import (
    HEAD_DIMS,
    PrefillKernelKey,
    PrefillParams,
    default_specs,
    fast_div_magic,
    prefill_spec,
)
from cuinfer.prefill.tiles import KV_TILES, QUERY_TILES, block_smem_bytes, smem_bytes, tile_config
from cuinfer.variants import lookup, render


def _fast_div(n: np.ndarray, d: int) -> np.ndarray:
    """The kernel's fast_div: (umulhi(n, mul) + n) >> shift, in 32-bit unsigned arithmetic."""
    mul, shift = fast_div_magic(d)
    hi = (n.astype(np.uint64) * np.uint64(mul)) >> np.uint64(32)
    total = hi + n.astype(np.uint64)
    assert np.all(total < 2**32), "the kernel adds in 32 bits"
    return (total >> np.uint64(shift)).astype(np.int64)


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 7, 8, 16, 28, 32, 48, 100, 1023, 4097, (1 << 20) + 7])
def test_fast_div_matches_integer_division(d, rng):
    n = np.concatenate([np.arange(0, 5000), rng.integers(0, 2**31, 20000), [2**31 - 1, 2**31 - d]])
    np.testing.assert_array_equal(_fast_div(n, d), n // d)


def test_fast_div_rejects_zero():
    with pytest.raises(ValueError, match="divisor must be in"):
        fast_div_magic(0)


def test_tile_config_rejects_unknown_tiles():
    with pytest.raises(ValueError, match="query tile must be one of"):
        tile_config(48, 64, 128)
    with pytest.raises(ValueError, match="KV tile must be one of"):
        tile_config(64, 96, 128)
    with pytest.raises(ValueError, match="multiple of 64"):
        tile_config(16, 32, 128)  # 4 warps of 16 keys need 64-key tiles


def test_name_expression_spells_every_template_argument():
    chain = render((lookup("causal"), lookup("soft_cap")))
    key = PrefillKernelKey("bfloat16", "float16", 192, 128, tile_config(64, 32, 128), True, chain)
    assert key.name_expr() == (
        "cuinfer::batch_prefill<cuinfer::PrefillTraits<__nv_bfloat16, half, 192, 128, 64, 4, 1, 2, 2, true, "
        "Variant, 1>>"
    )
    assert key.short_name() == "prefill/paged/bfloat16/d192x128/q64k32s2/causal+soft_cap"
    causal = render((lookup("causal"),))
    paired = PrefillKernelKey("bfloat16", "bfloat16", 128, 128, tile_config(128, 64, 128, 2, 2), False, causal)
    assert paired.name_expr().endswith("128, 128, 128, 4, 1, 4, 2, false, Variant, 2>>")
    assert paired.short_name() == "prefill/ragged/bfloat16/d128x128/q128k64s2g2/causal"
    assert "struct VariantParams" in prefill_spec(paired).preamble


def test_paired_blocks_hold_two_cross_item_ctas():
    """groups=2 doubles the block's threads and (128-byte aligned) shared memory; only one-warp-per-row-block tiles
    (64 rows and more) may pair."""
    cfg = tile_config(128, 64, 128, 2, 2)
    assert (cfg.threads, cfg.block_threads, cfg.groups) == (128, 256, 2)
    one = smem_bytes(cfg, 128, 128, False)
    assert block_smem_bytes(cfg, 128, 128, False) == 2 * (-(-one // 128) * 128) >= 2 * one
    assert block_smem_bytes(tile_config(128, 64, 128), 128, 128, False) == one
    for tq in (16, 32):
        with pytest.raises(ValueError, match="groups .CTAs per block. must be 1, or 2 for query tiles of 64"):
            tile_config(tq, 64, 128, 2, 2)
    with pytest.raises(ValueError, match="must be 1, or 2"):
        tile_config(128, 64, 128, 2, 3)
    with pytest.raises(ValueError, match="head_dim_vo 256; use groups=1"):
        tile_config(128, 32, 256, 2, 2)  # 8-warp CTAs: 512 threads would cap ptxas at 128 registers


def test_default_specs_have_unique_names_and_expect_tensor_core_sass():
    specs = default_specs()
    assert len({s.name for s in specs}) == len(specs)
    for s in specs:
        assert {"HMMA", "LDSM", "LDGSTS"} <= set(s.sass_expect)
        assert "LDL" in s.sass_forbid and "STL" in s.sass_forbid


def test_param_struct_is_16_byte_friendly():
    dt = PrefillParams.numpy_dtype
    assert dt.itemsize % 8 == 0
    assert dt.fields["q"][1] == 0


@pytest.mark.compile
def test_cpp_traits_agree_with_python_smem_sizes():
    """One NVRTC compile of static_asserts: PrefillTraits<...>::kSmemBytes == smem_bytes(...) for every config, and
    a paired block's threads and shared memory == block_threads / block_smem_bytes(...)."""
    from cuinfer.errors import CompileError
    from cuinfer.jit.compiler import nvrtc_options
    from cuinfer.jit.toolchain import nvrtc_module

    nvrtc = nvrtc_module()
    rope = render((lookup("rope"),))  # a transforming variant: its states take shared memory too
    alibi = render((lookup("alibi"),))  # a variant with a row state: ... and its row states
    capped = render((lookup("soft_cap"), lookup("alibi")))  # a row state after a logits piece
    # (one source defines each piece once: the capped chain's, with both chains' last lines)
    alibi_line = alibi.source.splitlines()[-1].replace("using Variant =", "using AlibiVariant =")
    lines = [PrefillParams.c_decl(), '#include "attention/prefill_sm80/traits.cuh"',
             rope.source.replace("using Variant =", "using RopeVariant ="),
             capped.source.replace("using Variant =", "using CappedVariant ="), alibi_line]  # fmt: skip
    n = 0
    combos = itertools.product(
        HEAD_DIMS, QUERY_TILES, KV_TILES, (0, 1), (2, 3), (1, 2), ("", "rope", "alibi", "capped")
    )
    for (dqk, dvo), tq, tkv, paged, stages, groups, states in combos:
        chain = {"rope": rope, "alibi": alibi, "capped": capped}.get(states)
        vname = {"rope": "RopeVariant", "alibi": "AlibiVariant", "capped": "CappedVariant"}.get(
            states, "cuinfer::variant::Identity"
        )
        try:
            cfg = tile_config(tq, tkv, dvo, stages, groups)
        except ValueError:
            continue
        t = (
            f"cuinfer::PrefillTraits<__nv_bfloat16, __nv_bfloat16, {dqk}, {dvo}, {tq}, {cfg.warps_q}, {cfg.warps_kv}, "
            f"{cfg.mma_kv}, {stages}, {'true' if paged else 'false'}, "
            f"{vname}, {groups}>"
        )
        want = smem_bytes(cfg, dqk, dvo, bool(paged), variant=chain)
        tag = f"{dqk} {dvo} {tq} {tkv} {paged} {stages} {groups}"
        lines.append(f'static_assert({t}::kSmemBytes == {want}, "smem {tag}");')
        lines.append(f'static_assert({t}::kThreads == {cfg.threads}, "threads {tag}");')
        lines.append(f'static_assert({t}::kBlockThreads == {cfg.block_threads}, "block threads {tag}");')
        block = block_smem_bytes(cfg, dqk, dvo, bool(paged), variant=chain)
        lines.append(f'static_assert({t}::kGroups * {t}::kGroupBytes == {block} || {groups} == 1, "block {tag}");')
        n += 1
    src = "\n".join(lines).encode()
    err, prog = nvrtc.nvrtcCreateProgram(src, b"prefill_traits_probe.cu", 0, [], [])
    opts = [o.encode() for o in nvrtc_options("sm_80") if "ptxas" not in o]
    (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(prog)
    if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError("prefill traits probe", log.decode(errors="replace"), [o.decode() for o in opts], "")
    assert n > 60
