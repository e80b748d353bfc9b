"""The prefill tile policy (cuinfer/prefill/policy.py): the paper's query-tile rule, the occupancy-driven KV tile,
forced tiles and their limits. Pure functions, no GPU."""

from __future__ import annotations

import pytest

from cuinfer.prefill.policy import (
    MAX_ACCUMULATORS,
    DeviceLimits,
    accumulators,
    block_groups,
    check_head_dims,
    choose_tiles,
    ctas_per_sm,
    estimated_registers,
    kv_tile,
    query_tile,
)
from cuinfer.prefill.tiles import QUERY_TILES, block_smem_bytes, smem_bytes, tile_config

A100 = DeviceLimits(smem_per_sm=167936, smem_per_block_optin=166912)
SMALL_SMEM = DeviceLimits(smem_per_sm=102400, smem_per_block_optin=101376)  # sm_86/89 class


@pytest.mark.parametrize(
    ("avg", "dvo", "want"),
    [
        pytest.param(1, 128, 16, id="decode"),
        pytest.param(4, 128, 16, id="decode-gqa4"),
        pytest.param(16, 128, 16, id="exactly-16"),
        pytest.param(16.5, 128, 32, id="just-above-16"),
        pytest.param(33, 128, 64, id="33"),
        pytest.param(64, 128, 64, id="exactly-64"),
        pytest.param(65, 128, 128, id="65"),
        pytest.param(32768, 128, 128, id="p1"),
        pytest.param(32768, 256, 64, id="d256-capped"),
        pytest.param(20, 256, 32, id="d256-short"),
    ],
)
def test_query_tile_is_smallest_tile_covering_the_average(avg, dvo, want):
    assert query_tile(avg, dvo) == want


def test_p1_worked_example_picks_128_by_64():
    """The module docstring's example: Bc 32 and 64 both reach 8 warps per SM, 128 would spill; ties -> 64."""
    c32, c64, c128 = (tile_config(128, t, 128) for t in (32, 64, 128))
    lim = DeviceLimits()
    assert ctas_per_sm(c32, 128, 128, False, lim) == 2
    assert ctas_per_sm(c64, 128, 128, False, lim) == 2
    assert accumulators(c128, 128) > MAX_ACCUMULATORS
    cfg = choose_tiles(8192 * 4, 128, 128, paged=False)
    assert (cfg.tile_q, cfg.tile_kv, cfg.warps_q, cfg.warps_kv, cfg.mma_q, cfg.mma_kv) == (128, 64, 4, 1, 2, 4)


def test_paired_blocks_only_for_the_measured_ragged_tiles():
    """block_groups pairs the ragged 128 x 64 tiles at head dim 128 (measured faster on the H200) and nothing else:
    paged, other tiles / head dims, devices where two CTAs do not fit one block, forced choices honoured."""
    lim = DeviceLimits()
    p1 = choose_tiles(8192 * 4, 128, 128, paged=False)
    assert (p1.tile_q, p1.tile_kv, p1.groups, p1.block_threads) == (128, 64, 2, 256)
    assert block_smem_bytes(p1, 128, 128, False) <= lim.smem_per_block_optin
    assert choose_tiles(8192 * 4, 128, 128, paged=True).groups == 1
    assert choose_tiles(8192 * 4, 128, 128, paged=False, variant=True).groups == 1  # 128 x 32
    assert choose_tiles(8192 * 4, 64, 64, paged=False).groups == 1
    assert choose_tiles(8192 * 4, 192, 128, paged=False).groups == 1
    assert choose_tiles(40, 128, 128, paged=False).groups == 1  # 64-row tiles
    assert choose_tiles(8192 * 4, 128, 128, paged=False, limits=A100).groups == 1  # 2 x 99 KB > 163 KB
    assert block_groups(tile_config(128, 64, 128), 128, 128, False, SMALL_SMEM) == 1
    assert choose_tiles(8192 * 4, 128, 128, paged=False, groups=1).groups == 1
    assert choose_tiles(8192 * 4, 128, 128, paged=True, groups=2).groups == 2
    assert choose_tiles(40, 128, 128, paged=False, groups=2).groups == 2
    with pytest.raises(ValueError, match="must be 1, or 2 for query tiles of 64 rows"):
        choose_tiles(4, 128, 128, paged=True, groups=2)  # 16-row tiles split the keys over warps
    with pytest.raises(ValueError, match="2 CTAs per block of tiles .128, 64. need .* use groups=1"):
        choose_tiles(8192 * 4, 128, 128, paged=False, groups=2, tile_kv=64, limits=A100)


def test_decode_worked_example_picks_16_by_64():
    cfg = choose_tiles(4, 128, 128, paged=True)
    assert (cfg.tile_q, cfg.tile_kv, cfg.warps_q, cfg.warps_kv) == (16, 64, 1, 4)
    assert ctas_per_sm(cfg, 128, 128, True, DeviceLimits()) == 3


@pytest.mark.parametrize("limits", [pytest.param(DeviceLimits(), id="h200"), pytest.param(A100, id="a100"),
                                    pytest.param(SMALL_SMEM, id="100kb-smem")])  # fmt: skip
@pytest.mark.parametrize("dims", [pytest.param(d, id=f"{d[0]}x{d[1]}") for d in ((64, 64), (128, 128), (256, 256),
                                                                                  (192, 128))])  # fmt: skip
@pytest.mark.parametrize("paged", [False, True], ids=["ragged", "paged"])
def test_kv_tile_fits_the_device_and_maximises_warps(limits, dims, paged):
    for tq in QUERY_TILES:
        if tq == 128 and dims[1] == 256:
            continue
        try:
            best = kv_tile(tq, *dims, paged=paged, limits=limits)
        except ValueError:
            assert limits is SMALL_SMEM and tq == 16 and dims[1] == 256  # see the next-tile fallback test
            continue
        cfg = tile_config(tq, best, dims[1])
        assert smem_bytes(cfg, *dims, paged) <= limits.smem_per_block_optin
        assert accumulators(cfg, dims[1]) <= MAX_ACCUMULATORS
        warps = ctas_per_sm(cfg, *dims, paged, limits) * cfg.threads // 32
        for other in (32, 64, 128):
            try:
                o = tile_config(tq, other, dims[1])
            except ValueError:
                continue
            if accumulators(o, dims[1]) > MAX_ACCUMULATORS:
                continue
            assert ctas_per_sm(o, *dims, paged, limits) * o.threads // 32 <= warps, (tq, other)


def test_smaller_shared_memory_moves_to_smaller_kv_tiles():
    # A100 (164 KB): 64-key tiles (98 KB) fit once per SM, 32-key tiles (70 KB) twice -> 32
    assert kv_tile(128, 128, 128, paged=False, limits=A100) == 32
    assert kv_tile(128, 128, 128, paged=False) == 64


def test_a_device_too_small_for_the_rules_query_tile_gets_the_nearest_that_fits():
    # 100 KB of smem: the 16-row layout needs 64-key tiles (128 KB at head dim 256) -> 32 rows x 32 keys
    cfg = choose_tiles(1, 256, 256, paged=True, limits=SMALL_SMEM)
    assert (cfg.tile_q, cfg.tile_kv) == (32, 32)
    assert smem_bytes(cfg, 256, 256, True) <= SMALL_SMEM.smem_per_block_optin


def test_register_estimate_tracks_ptxas():
    # measured with NVRTC 12.9 on sm_90a: 254 (P1 tiles), 164 (64 x 64), 126 (16 x 64)
    assert estimated_registers(tile_config(128, 64, 128), 128) == 255
    assert abs(estimated_registers(tile_config(64, 64, 128), 128) - 164) <= 16
    assert abs(estimated_registers(tile_config(16, 64, 128), 128) - 126) <= 16


def test_forced_tiles_are_honoured_and_checked():
    cfg = choose_tiles(1, 128, 128, paged=False, tile_q=128, tile_kv=32)
    assert (cfg.tile_q, cfg.tile_kv) == (128, 32)
    assert choose_tiles(32768, 128, 128, paged=False, tile_q=16).tile_q == 16
    with pytest.raises(ValueError, match="fp32 accumulators per thread"):
        choose_tiles(1, 128, 128, paged=False, tile_q=128, tile_kv=128)
    with pytest.raises(ValueError, match="bytes of shared memory"):
        choose_tiles(1, 256, 256, paged=False, tile_q=64, tile_kv=128, stages=3)
    with pytest.raises(ValueError, match="query tile must be one of"):
        choose_tiles(1, 128, 128, paged=False, tile_q=48)
    with pytest.raises(ValueError, match="stages >= 2"):
        choose_tiles(1, 128, 128, paged=False, stages=1)


def test_variant_logits_keep_register_headroom():
    assert choose_tiles(32768, 128, 128, paged=False, variant=True).tile_kv == 32
    with pytest.raises(ValueError, match="more than the 160"):
        choose_tiles(32768, 128, 128, paged=False, tile_kv=64, variant=True, tile_q=128)


@pytest.mark.parametrize("dims", [(96, 96), (128, 64), (256, 128), (80, 80), (512, 512)])
def test_unsupported_head_dims_raise_naming_the_supported_ones(dims):
    with pytest.raises(ValueError, match=r"supported head dims are 64, 128, 256, \(192, 128\)"):
        check_head_dims(*dims)
