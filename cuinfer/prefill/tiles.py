"""Tile configurations of the FA2-class prefill kernel (kernel_src/attention/prefill.cuh): the query and KV tiles it
is built for, how warps cover a tile, and the shared memory a CTA and a launched block need. The tile policy
(``cuinfer.prefill.policy``) and the kernel specs (``cuinfer.prefill.specs``) both build on these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cuinfer.variants.render import Rendered

QUERY_TILES = (16, 32, 64, 128)
KV_TILES = (32, 64, 128)


@dataclass(frozen=True)
class TileConfig:
    """How one CTA covers a (query tile x KV tile) block: warps and mma tiles per warp."""

    tile_q: int
    tile_kv: int
    warps_q: int
    warps_kv: int
    mma_kv: int  # 16-key slices per warp per KV tile
    stages: int = 2
    groups: int = 1  # CTAs of the plan per block: 2 = paired blocks (prefill.cuh, GROUPS)
    kv_itemsize: int = 2  # bytes of a K/V element: 2 (float16, bfloat16) or 1 (fp8)
    # fp8: True, the CTA converts each K / V tile once into a 16-bit tile (PrefillTraits CONVERT); False, each warp
    # converts the fragments it reads
    kv_convert: bool = False

    @property
    def threads(self) -> int:
        """Threads of one CTA of the plan (one group)."""
        return 32 * self.warps_q * self.warps_kv

    @property
    def block_threads(self) -> int:
        """Threads of one launched block: ``groups`` CTAs side by side."""
        return self.groups * self.threads

    @property
    def mma_q(self) -> int:
        return self.tile_q // (16 * self.warps_q)


# fp8 K/V: which tiles have the CTA convert each K / V tile once (kv_convert) rather than each warp its fragments. With
# one warp per row block (64- and 128-row tiles) every warp reads every key of a tile, so per-warp conversion converts
# each element 4 (8) times; the small tiles split the keys over the warps, each converting only its own.
FP8_CONVERT_CROSS_ITEM = True


def tile_config(
    tile_q: int, tile_kv: int, head_dim_vo: int, stages: int = 2, groups: int = 1, kv_itemsize: int = 2,
    kv_convert: bool | None = None,
) -> TileConfig:  # fmt: skip
    """Warp layout for a (query tile, KV tile) pair; ``groups=2`` pairs two 4-warp CTAs in one block (one warp per
    row block only: query tiles of 64 rows and more; 128 rows only up to head dim 128).

    4 warps per CTA. Query tiles of 64 and 128 rows split rows over 4 warps (16 or 32 rows each, so a K fragment
    serves two m16 blocks at 128); small query tiles split the KV tile instead (16 rows: 1 x 4 warps, 32 rows: 2 x 2)
    and merge the warps' softmax states in the epilogue. A 128-row tile with head_dim_vo 256 would need 256 fp32
    accumulators per thread, so it uses 8 warps of 16 rows.
    """
    if tile_q not in QUERY_TILES:
        raise ValueError(f"query tile must be one of {QUERY_TILES} but is {tile_q}")
    if tile_kv not in KV_TILES:
        raise ValueError(f"KV tile must be one of {KV_TILES} but is {tile_kv}")
    if tile_q == 16:
        warps_q, warps_kv = 1, 4
    elif tile_q == 32:
        warps_q, warps_kv = 2, 2
    elif tile_q == 128 and head_dim_vo > 128:
        warps_q, warps_kv = 8, 1
    else:
        warps_q, warps_kv = 4, 1
    if tile_kv % (16 * warps_kv):
        raise ValueError(
            f"query tile {tile_q} splits the KV tile over {warps_kv} warps of 16 keys: KV tile must be a multiple "
            f"of {16 * warps_kv} but is {tile_kv}"
        )
    # (a pair of 4-warp CTAs: 256 threads keep the 255 registers a thread of the long-prefill tiles needs)
    if groups not in (1, 2) or (groups == 2 and (warps_kv != 1 or warps_q != 4)):
        raise ValueError(
            f"groups (CTAs per block) must be 1, or 2 for query tiles of 64 rows and more (128 at head dim 128 or "
            f"less), but is {groups} at query tile {tile_q}, head_dim_vo {head_dim_vo}; use groups=1"
        )
    if kv_convert is None:  # the policy's: see FP8_CONVERT_CROSS_ITEM
        kv_convert = kv_itemsize == 1 and warps_kv == 1 and FP8_CONVERT_CROSS_ITEM
    if kv_convert and kv_itemsize != 1:
        raise ValueError("kv_convert (the CTA converting fp8 K/V tiles to 16-bit ones) applies to fp8 K/V only")
    mma_kv = tile_kv // (16 * warps_kv)
    return TileConfig(tile_q, tile_kv, warps_q, warps_kv, mma_kv, stages, groups, kv_itemsize, bool(kv_convert))


TABLE_ITEMS, TABLE_FIELDS = 16, 10  # PrefillTraits::kTableItems / kTableFields (cross-item item table)


DIM_STATE_BYTES = 8  # PrefillTraits::kDimStateBytes: a variant's per-dimension state (RoPE frequencies)
ROW_STATE_BYTES = 16  # PrefillTraits::kRowStateBytes: a variant's per-row state (ALiBi slopes), per row and thread


def smem_bytes(cfg: TileConfig, head_dim_qk: int, head_dim_vo: int, paged: bool, elem_bytes: int = 2,
               variant: Rendered | None = None) -> int:  # fmt: skip
    """Dynamic shared memory of one CTA; mirrors PrefillTraits::kSmemBytes.

    One warp per row block (``warps_kv == 1``) runs the cross-item pipeline: no epilogue staging, an item table;
    otherwise the epilogue stages every warp's state over the tile buffers. ``variant`` (the rendered chain; None:
    plain attention) may take more, per thread: the states of 8 dimension pairs when it transforms q / k (RoPE) and a
    row state per row (ALiBi, ``ROW_STATE_BYTES``). ``elem_bytes``: q's element, ``cfg.kv_itemsize`` K/V's (fp8 rows
    of 64 bytes are copied by 4 threads each, so a thread copies twice the rows).
    """
    cross = cfg.warps_kv == 1
    q = cfg.tile_q * head_dim_qk * elem_bytes
    kv = cfg.stages * cfg.tile_kv * (head_dim_qk + head_dim_vo) * cfg.kv_itemsize
    kv += cfg.tile_kv * (head_dim_qk + head_dim_vo) * elem_bytes if cfg.kv_convert else 0  # the 16-bit K and V tiles
    chunks = head_dim_qk * cfg.kv_itemsize // 16
    # (PrefillTraits::kKVThreadsPerRow: 4 for fp8 rows of 4 chunks, and of 8 when the CTA converts: kKVPairRows)
    threads_per_row = 4 if cfg.kv_itemsize == 1 and chunks == 8 and cfg.kv_convert else min(8, chunks)
    rows_per_thread = cfg.tile_kv // (cfg.threads // threads_per_row)
    page = cfg.threads * rows_per_thread * 8 if paged else 0
    main = q + kv + page
    epi = 0 if cross else cfg.warps_kv * cfg.tile_q * (head_dim_vo + 8) * 4 + cfg.warps_kv * cfg.tile_q * 8
    warp_ints = 12 if cfg.kv_convert else 8  # PrefillTraits::kWarpInts (kv_convert: + the item index, kWItem)
    info = (12 + warp_ints * cfg.warps_q * cfg.warps_kv) * 4  # kInfoInts + kWarpInts per warp
    table = TABLE_ITEMS * TABLE_FIELDS * 4 if cross else 0
    states = cfg.threads * 8 * DIM_STATE_BYTES if variant is not None and variant.transforms else 0
    rows = cfg.threads * cfg.mma_q * 2 * ROW_STATE_BYTES if variant is not None and variant.row_state else 0
    return max(main, epi) + info + table + states + rows


def block_smem_bytes(cfg: TileConfig, head_dim_qk: int, head_dim_vo: int, paged: bool,
                     variant: Rendered | None = None) -> int:  # fmt: skip
    """Dynamic shared memory of one launched block: each group's ``smem_bytes`` at a 128-byte aligned offset
    (PrefillTraits::kGroupBytes); one group's size when unpaired."""
    one = smem_bytes(cfg, head_dim_qk, head_dim_vo, paged, variant=variant)
    return one if cfg.groups == 1 else cfg.groups * (-(-one // 128) * 128)
