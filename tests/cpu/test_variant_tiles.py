"""The prefill tiles of the soft cap and ALiBi: alone or after causal they keep the plain 128 x 64 tile at d128 (one CTA
per block, 16-bit K/V) and compile without spills; other register-heavy chains keep the 32-key tiles. The policy
without a GPU, the kernels with NVRTC (sm_90a: the H200's build)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cuinfer.jit import compile_spec
from cuinfer.prefill import BatchPrefill
from cuinfer.prefill.policy import block_groups, choose_tiles, default_kv_tile
from cuinfer.prefill.specs import PrefillKernelKey, prefill_spec
from cuinfer.prefill.tiles import tile_config
from cuinfer.variants import Param, Variant, lookup, render

WIDE = [("causal", "soft_cap"), ("causal", "alibi"), ("soft_cap",), ("alibi",)]
NARROW = [
    ("causal", "alibi", "soft_cap"),  # (spilled 72 bytes paged at 128 x 64)
    ("causal", "window", "soft_cap"),  # (8 bytes paged)
    ("causal", "window", "alibi"),  # (24 bytes paged)
    ("causal", "custom_mask", "soft_cap"),
    ("causal", "sigmoid"),
]
LLAMA = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, q_dtype="bfloat16")


def _chain(names):
    return render(tuple(lookup(n) for n in names))


@pytest.mark.parametrize("names", WIDE, ids="+".join)
def test_soft_cap_and_alibi_chains_take_the_plain_tile_unpaired(names):
    chain = _chain(names)
    assert chain.register_heavy and chain.wide_logits
    for paged in (False, True):
        cfg = choose_tiles(32768, 128, 128, paged=paged, variant=True, wide_logits=True)
        assert (cfg.tile_q, cfg.tile_kv, cfg.groups) == (128, 64, 1), (paged, cfg)
    # the plain chain's tile (paired when ragged) for comparison: the same tile
    plain = choose_tiles(32768, 128, 128, paged=False)
    assert (plain.tile_q, plain.tile_kv, plain.groups) == (128, 64, 2)


@pytest.mark.parametrize("names", NARROW, ids="+".join)
def test_other_register_heavy_chains_keep_the_narrow_tiles(names):
    chain = _chain(names)
    assert chain.register_heavy and not chain.wide_logits
    cfg = choose_tiles(32768, 128, 128, paged=False, variant=True, wide_logits=chain.wide_logits)
    assert (cfg.tile_kv, cfg.groups) == (32, 1)


def test_a_user_variant_equal_to_none_of_the_builtins_is_not_wide():
    mine = Variant(name="my_cap", logits="fmath::soft_cap(x, params.c, params.m, params.k)",
                   params=(Param("c"), Param("m"), Param("k")))  # fmt: skip
    assert not render((lookup("causal"), mine)).wide_logits


def test_fp8_kv_keeps_the_variant_limit():
    cfg = choose_tiles(32768, 128, 128, paged=False, variant=True, wide_logits=True, kv_itemsize=1)
    assert cfg.tile_kv == 32


def test_forced_wide_tiles_are_accepted_only_for_wide_chains():
    cfg = choose_tiles(32768, 128, 128, paged=False, tile_q=128, tile_kv=64, variant=True, wide_logits=True)
    assert (cfg.tile_kv, cfg.groups) == (64, 1)
    with pytest.raises(ValueError, match="more than the 160"):
        choose_tiles(32768, 128, 128, paged=False, tile_q=128, tile_kv=64, variant=True)


@pytest.mark.parametrize("paged", [False, True])
def test_plan_gives_soft_cap_and_alibi_the_plain_tile(paged):
    """Through BatchPrefill.plan (the bench's call): the soft cap and ALiBi get 128 x 64 unpaired, their combination
    and a custom mask 128 x 32; plain causal 128 x 64 (paired when ragged)."""
    n_tok = 1024
    lens = np.array([0, n_tok], dtype=np.int32)
    pages = dict(page_size=16) if paged else {}

    def plan(**opts):
        w = BatchPrefill(paged=paged)
        if paged:
            n = n_tok // 16
            w.plan(lens, np.array([0, n], np.int32), np.arange(n, dtype=np.int32), np.array([16], np.int32),
                   causal=True, **pages, **LLAMA, **opts)  # fmt: skip
        else:
            w.plan(lens, lens, causal=True, **LLAMA, **opts)
        c = w._plan.config
        return c.tile_q, c.tile_kv, c.groups

    assert plan() == (128, 64, 1 if paged else 2)
    assert plan(logits_soft_cap=30.0) == (128, 64, 1)
    assert plan(pos_encoding="alibi") == (128, 64, 1)
    assert plan(pos_encoding="alibi", logits_soft_cap=30.0) == (128, 32, 1)
    if not paged:
        mask = np.tril(np.ones((n_tok, n_tok), dtype=bool)).ravel()
        assert plan(logits_soft_cap=30.0, custom_mask=mask) == (128, 32, 1)


@pytest.mark.compile
@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
@pytest.mark.parametrize("names", [("causal", "soft_cap"), ("causal", "alibi")], ids="+".join)
def test_soft_cap_and_alibi_128x64_kernels_compile_without_spills(names, paged):
    """The policy's kernel of the bench's chains (bf16, d128, 128 x 64, one CTA per block) at sm_90a: no spill stores
    or loads and no stack frame, at most 255 registers. (With the paired block, the soft cap's constants computed in
    the kernel or ALiBi's slopes held in registers, these spilled 8-148 bytes.)"""
    chain = _chain(names)
    cfg = tile_config(128, default_kv_tile(128, 128, 128, chain.register_heavy, chain.wide_logits), 128)
    cfg = dataclasses.replace(cfg, groups=block_groups(cfg, 128, 128, paged, variant=chain.register_heavy))
    assert (cfg.tile_kv, cfg.groups) == (64, 1)
    spec = prefill_spec(PrefillKernelKey("bfloat16", "bfloat16", 128, 128, cfg, paged, chain))
    mod = compile_spec(spec, "sm_90a")
    for sym, r in mod.resources.items():
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, f"{sym}: {r}"
        assert r.registers <= 255
