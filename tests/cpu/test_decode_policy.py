"""The decode kernel/tile policy (cuinfer.decode.policy): pure host functions, checked against the constraints the
kernel templates static_assert, so a policy change that would not compile (or not fit on an SM) fails here first."""

from __future__ import annotations

import pytest

from cuinfer.decode.policy import (
    EVICT_FIRST_MAX_L2_MULTIPLE,
    SUPPORTED_HEAD_DIMS,
    DecodeConfig,
    check_head_dim,
    ctas_per_sm,
    decode_config,
    kv_evict_first,
)
from cuinfer.decode.specs import DecodeKernelKey, DecodeParams, decode_spec, shipped_keys
from cuinfer.variants import lookup, render

H200_SMEM_PER_SM = 233472
SMEM_PER_BLOCK_OPTIN = 232448
GROUPS = (1, 2, 3, 4, 5, 7, 8, 16, 32)


@pytest.mark.parametrize(
    ("group", "tc"),
    [pytest.param(g, g >= 4, id=f"g{g}") for g in GROUPS],
)
def test_automatic_choice_uses_tensor_cores_from_group_4(group, tc):
    for d in SUPPORTED_HEAD_DIMS:
        assert decode_config(group, d).tensor_cores is tc


def test_both_kernels_stay_selectable():
    assert decode_config(8, 128, use_tensor_cores=False).tensor_cores is False
    assert decode_config(1, 128, use_tensor_cores=True).tensor_cores is True


def test_llama_worked_example():
    """The docstring's example: 32/8 heads, d128 -> tensor cores, 64-token tiles, 3 stages, 2 CTAs per SM."""
    c = decode_config(4, 128)
    assert (c.tensor_cores, c.threads, c.tile_kv, c.stages, c.warps_kv, c.warps_d) == (True, 128, 64, 3, 4, 1)
    assert c.stage_bytes == 32 * 1024
    assert ctas_per_sm(c, smem_per_sm=H200_SMEM_PER_SM) == 2
    mha = decode_config(1, 128)
    assert (mha.tensor_cores, mha.threads, mha.tile_kv, mha.stages) == (False, 128, 32, 4)
    assert ctas_per_sm(mha, smem_per_sm=H200_SMEM_PER_SM) == 3


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"g{g}")
def test_cuda_core_config_meets_the_template_constraints(group, head_dim):
    bdx = head_dim // 8
    if bdx * group > 512:
        with pytest.raises(ValueError, match="use use_tensor_cores=True"):
            decode_config(group, head_dim, use_tensor_cores=False)
        return
    c = decode_config(group, head_dim, use_tensor_cores=False)
    assert c.threads % (bdx * group) == 0
    bdz = c.threads // (bdx * group)
    assert bdz & (bdz - 1) == 0, "token slices are a power of two"
    assert c.tile_kv % bdz == 0
    tz = c.tile_kv // bdz
    assert bdz == 1 or group <= tz, "the merge of the slices must fit in one KV stage"
    assert c.tile_kv <= c.threads, "one thread resolves each token of a tile"
    assert c.threads % (head_dim // 16) == 0, "rope: threads cover whole half rows"
    assert c.threads <= 512
    assert c.threads * 128 * c.min_blocks <= 65536, "at least 128 registers per thread"
    assert c.rows_per_tile == group
    assert c.smem_bytes <= SMEM_PER_BLOCK_OPTIN


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS, ids=lambda d: f"d{d}")
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"g{g}")
def test_tensor_core_config_meets_the_template_constraints(group, head_dim):
    c = decode_config(group, head_dim, use_tensor_cores=True)
    assert c.tile_kv == 16 * c.warps_kv
    assert c.threads == 32 * c.warps_kv * c.warps_d
    assert (head_dim // c.warps_d) % 16 == 0
    assert c.stage_bytes == 16 * c.warps_kv * head_dim * 4, "the merge scratch is exactly one KV stage"
    assert c.rows_per_tile == 16
    # at least 2 CTAs per SM and ~64 KB of KV loads in flight per SM (2 stages ahead per CTA)
    per_sm = ctas_per_sm(c, smem_per_sm=H200_SMEM_PER_SM)
    assert per_sm >= 2
    assert per_sm * (c.stages - 1) * c.stage_bytes >= 64 * 1024


def test_smem_matches_the_kernel_layout():
    """smem_bytes mirrors Pipeline<> in decode.cuh: S stages + (S+1) tile slots + 64 items, rounded to 128, + own
    (tensor cores: the query tile, the warps' (m, d) rows and 32 bytes of the waiting split piece)."""
    c = decode_config(4, 128)
    pipe = 3 * 32768 + 4 * (16 * 64 + 40) + 64 * 40
    assert c.smem_bytes == -(-pipe // 128) * 128 + 16 * 128 * 2 + 16 * 4 * 2 * 4 + 32
    m = decode_config(2, 64)  # CUDA cores: 8 lanes x 2 heads x 8 slices
    pipe = 4 * (2 * 64 * 64 * 2) + 5 * (16 * 64 + 40) + 64 * 40
    assert m.smem_bytes == -(-pipe // 128) * 128 + 8 * 2 * 2 * 4
    # fp8 tiles: each slot 16-byte aligned (its K / V address pairs are read 16 bytes at a time), 48 bytes of facts
    f = decode_config(4, 64, kv_itemsize=1)  # 128-token tiles, 3 stages
    pipe = 3 * (2 * 128 * 64) + 4 * (16 * 128 + 48) + 64 * 40
    assert f.smem_bytes == -(-pipe // 128) * 128 + 16 * 64 * 2 + 16 * 4 * 2 * 4 + 32


def test_unsupported_head_dim_names_the_choices():
    with pytest.raises(ValueError, match=r"^head_dim must be one of 64, 128, 256 for decode but is 96; pad"):
        check_head_dim(96)
    with pytest.raises(ValueError, match="head_dim must be one of"):
        decode_config(4, 80)


def test_bad_group_and_fp8_and_oversized_cuda_core_block():
    with pytest.raises(ValueError, match=r"GQA group .* must be >= 1 but is 0"):
        decode_config(0, 128)
    with pytest.raises(ValueError, match="16-bit or fp8 K/V"):
        decode_config(4, 128, kv_itemsize=4)
    with pytest.raises(ValueError, match=r"needs head_dim/8 x group = 1024 threads .* more than 512; use use_tensor"):
        decode_config(32, 256, use_tensor_cores=False)


def test_ctas_per_sm_is_limited_by_smem_and_threads():
    c = DecodeConfig(False, 128, 16, 1024, 32, 4)
    assert ctas_per_sm(c, smem_per_sm=H200_SMEM_PER_SM) == 2  # 2048 threads per SM
    assert c.min_blocks == 1  # 1024 threads x 128 registers fill the register file
    big = decode_config(4, 256)
    assert ctas_per_sm(big, smem_per_sm=100 * 1024) == 1


def test_shipped_specialisations_are_distinct_and_named():
    keys = shipped_keys()
    names = [k.spec_name() for k in keys]
    assert len(set(names)) == len(names)
    # (a variant is the preamble's `Variant`: a specialisation is its name expression and its preamble)
    exprs = [(k.name_expr(), decode_spec(k).preamble) for k in keys]
    assert len(set(exprs)) == len(exprs)
    assert any(k.config.tensor_cores for k in keys) and any(not k.config.tensor_cores for k in keys)


def test_name_expressions_spell_the_template_arguments():
    alibi = render((lookup("alibi"),))
    tc = DecodeKernelKey(decode_config(4, 128), "bfloat16", "bfloat16", "float16", alibi, lse=True)
    assert tc.name_expr() == (
        "cuinfer::decode::batch_decode_tensor_core<__nv_bfloat16, __nv_bfloat16, half, 128, 4, 4, 1, 16, 3, 2, "
        "Variant, true>"
    )
    assert tc.spec_name() == "decode/tc/bfloat16-bfloat16-float16/d128/g4/alibi/lse"
    chain = render((lookup("window"), lookup("soft_cap")))
    cc = DecodeKernelKey(decode_config(1, 64), "float16", "float16", "float16", chain)
    assert (
        cc.name_expr()
        == "cuinfer::decode::batch_decode_cuda_core<half, half, half, 64, 1, 64, 4, 128, 3, Variant, false>"
    )
    assert cc.spec_name() == "decode/cc/float16/d64/g1/window+soft_cap"
    assert "struct window_params" in decode_spec(cc).preamble


def test_kv_evict_first_only_for_short_streams():
    l2 = 60 << 20  # an H200's L2
    d1 = 16 * 1024 * 8 * 128 * 2 * 2  # D1: 16 x 1024 tokens, 8 KV heads, d128, K and V, bf16 (64 MiB)
    d4 = 32768 * 8 * 128 * 2 * 2  # D4: 128 MiB
    d5 = 64 * 4096 * 8 * 128 * 2 * 2  # D5: 1 GiB
    d8 = (127 * 1024 + 32 * 1024) * 8 * 128 * 2 * 2  # D8: one long request among 127 short ones
    assert kv_evict_first(d1, l2) and kv_evict_first(d4, l2)
    assert not kv_evict_first(d5, l2) and not kv_evict_first(d8, l2)
    # the boundary is EVICT_FIRST_MAX_L2_MULTIPLE L2 sizes, inclusive, and scales with the L2
    assert kv_evict_first(EVICT_FIRST_MAX_L2_MULTIPLE * l2, l2)
    assert not kv_evict_first(EVICT_FIRST_MAX_L2_MULTIPLE * l2 + 1, l2)
    assert kv_evict_first(d5, 300 << 20) and not kv_evict_first(d4, 16 << 20)


def test_decode_params_carry_the_l2_policy_flag():
    # The kernel reads p.kv_evict_first (decode_pipeline.cuh); the struct must carry it as an int field.
    names = [name for name, _ in DecodeParams.fields]
    assert "kv_evict_first" in names
    assert dict(DecodeParams.fields)["kv_evict_first"] == "i32"


def _bytes_in_flight_per_sm(c: DecodeConfig) -> int:
    """K/V bytes a full SM has in flight while its CTAs compute: S - 1 stages per CTA (Pipeline::wait leaves
    kStages - 2 copy groups pending and advance() issues the next), times the CTAs per SM."""
    return c.stage_bytes * (c.stages - 1) * c.min_blocks


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("tc", [False, True])
def test_fp8_keeps_the_16_bit_bytes_in_flight(group, head_dim, tc):
    """fp8 K/V halves the bytes per token, so a stage of the 16-bit bytes holds twice the tokens: the same stage bytes,
    stages and CTAs per SM, hence at least the 16-bit kernel's bytes in flight per SM (Little's law: the loads in
    flight, not the tokens, cover the DRAM latency). D10 / D5-e4m3 / D9-e4m3 (g4, d128, tensor cores): 128-token
    tiles of 32 KB, 3 stages, 2 CTAs per SM = 128 KB in flight per SM, as bf16 D6."""
    b = decode_config(group, head_dim, use_tensor_cores=tc)
    f = decode_config(group, head_dim, use_tensor_cores=tc, kv_itemsize=1)
    assert f.kv_itemsize == 1 and f.tile_kv == 2 * b.tile_kv and f.stage_bytes == b.stage_bytes
    assert f.min_blocks == b.min_blocks
    assert ctas_per_sm(f, smem_per_sm=H200_SMEM_PER_SM) >= f.min_blocks
    assert _bytes_in_flight_per_sm(f) >= _bytes_in_flight_per_sm(b)
    if (group, head_dim, tc) == (4, 128, True):
        assert (f.tile_kv, f.stages, f.min_blocks, _bytes_in_flight_per_sm(f)) == (128, 3, 2, 128 * 1024)


def test_fp8_head_dim_64_has_fewer_bytes_in_flight():
    """The known exception (cuinfer/decode/policy.py): at head dim 64 the 128-token fp8 tile's descriptors (16 B per
    token, 1/8 of its K+V bytes) leave 3 stages where 16-bit has 4 at 3 CTAs per SM: 96 KB in flight per SM, not 144."""
    for tc in (False, True):
        b = decode_config(4, 64, use_tensor_cores=tc)
        f = decode_config(4, 64, use_tensor_cores=tc, kv_itemsize=1)
        assert (b.stages, f.stages, b.min_blocks, f.min_blocks) == (4, 3, 3, 3)
        assert (_bytes_in_flight_per_sm(b), _bytes_in_flight_per_sm(f)) == (144 * 1024, 96 * 1024)
