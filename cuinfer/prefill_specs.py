"""Kernel specs of the FA2-class prefill kernel (kernel_src/attention/prefill.cuh): parameter struct, tile configs,
name expressions, shared-memory sizes. No GPU needed (CI compiles every registered spec for sm_80 and sm_90a)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from cuinfer.jit import KernelSpec, ParamStruct

HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128))  # (qk, vo) pairs the kernel is built for
QUERY_TILES = (16, 32, 64, 128)
KV_TILES = (32, 64, 128)
CTYPES = {"float16": "half", "bfloat16": "__nv_bfloat16"}

MASK_CAUSAL, MASK_WINDOW, MASK_CUSTOM = 1, 2, 4

PrefillParams = ParamStruct(
    "PrefillParams",
    tuple(
        (n, "ptr")
        for n in (
            "q", "k", "v", "o", "lse", "partial_o", "partial_lse",
            "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "mask", "mask_indptr",
            "work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial",
            "pool_count",
        )
    )
    + tuple(
        (n, "i64")
        for n in (
            "q_stride_n", "q_stride_h", "k_stride_n", "k_stride_h", "k_stride_page", "v_stride_n", "v_stride_h",
            "o_stride_n", "o_stride_h", "lse_stride_n", "lse_stride_h",
        )
    )
    + (("group_size", "i32"), ("page_size", "i32"), ("window_left", "i32"), ("alibi_pow2", "i32"))
    + (("natural_groups", "i32"),)
    + (("group_mul", "u32"), ("group_shift", "u32"), ("page_mul", "u32"), ("page_shift", "u32"))
    + (("sm_scale", "f32"), ("sm_scale_log2", "f32"), ("soft_cap", "f32"), ("inv_soft_cap", "f32"))
)  # fmt: skip


def fast_div_magic(d: int) -> tuple[int, int]:
    """(mul, shift) with n // d == (umulhi(n, mul) + n) >> shift for 0 <= n < 2**31 (the kernels' fast_div).

    Round-up method: shift = ceil(log2 d), mul = floor(2^32 (2^shift - d) / d) + 1; d = 1 gives (1, 0).
    """
    if d < 1 or d >= 1 << 31:
        raise ValueError(f"divisor must be in [1, 2^31) but is {d}")
    shift = (d - 1).bit_length()
    mul = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return mul & 0xFFFFFFFF, shift


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


def tile_config(tile_q: int, tile_kv: int, head_dim_vo: int, stages: int = 2, groups: int = 1) -> TileConfig:
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
    return TileConfig(tile_q, tile_kv, warps_q, warps_kv, tile_kv // (16 * warps_kv), stages, groups)


TABLE_ITEMS, TABLE_FIELDS = 16, 10  # PrefillTraits::kTableItems / kTableFields (cross-item item table)


def smem_bytes(cfg: TileConfig, head_dim_qk: int, head_dim_vo: int, paged: bool, elem_bytes: int = 2) -> int:
    """Dynamic shared memory of one CTA; mirrors PrefillTraits::kSmemBytes.

    One warp per row block (``warps_kv == 1``) runs the cross-item pipeline: no epilogue staging, an item table;
    otherwise the epilogue stages every warp's state over the tile buffers.
    """
    cross = cfg.warps_kv == 1
    q = cfg.tile_q * head_dim_qk * elem_bytes
    kv = cfg.stages * cfg.tile_kv * (head_dim_qk + head_dim_vo) * elem_bytes
    rows_per_thread = cfg.tile_kv // (cfg.threads // 8)
    page = cfg.threads * rows_per_thread * 8 if paged else 0
    main = q + kv + page
    epi = 0 if cross else cfg.warps_kv * cfg.tile_q * (head_dim_vo + 8) * 4 + cfg.warps_kv * cfg.tile_q * 8
    info = (12 + 8 * cfg.warps_q * cfg.warps_kv) * 4  # kInfoInts + kWarpInts per warp
    table = TABLE_ITEMS * TABLE_FIELDS * 4 if cross else 0
    return max(main, epi) + info + table


def block_smem_bytes(cfg: TileConfig, head_dim_qk: int, head_dim_vo: int, paged: bool) -> int:
    """Dynamic shared memory of one launched block: each group's ``smem_bytes`` at a 128-byte aligned offset
    (PrefillTraits::kGroupBytes); one group's size when unpaired."""
    one = smem_bytes(cfg, head_dim_qk, head_dim_vo, paged)
    return one if cfg.groups == 1 else cfg.groups * (-(-one // 128) * 128)


@dataclass(frozen=True)
class PrefillKernelKey:
    """Everything that selects one compiled specialisation."""

    dtype: str  # q / k / v
    out_dtype: str
    head_dim_qk: int
    head_dim_vo: int
    cfg: TileConfig
    paged: bool
    mask: int  # MASK_* bits
    soft_cap: bool
    alibi: bool

    def name_expr(self) -> str:
        c = self.cfg
        return (
            f"cuinfer::batch_prefill<cuinfer::PrefillTraits<{CTYPES[self.dtype]}, {CTYPES[self.out_dtype]}, "
            f"{self.head_dim_qk}, {self.head_dim_vo}, {c.tile_q}, {c.warps_q}, {c.warps_kv}, {c.mma_kv}, {c.stages}, "
            f"{str(self.paged).lower()}, {self.mask}, {str(self.soft_cap).lower()}, {str(self.alibi).lower()}, "
            f"{c.groups}>>"
        )

    def short_name(self) -> str:
        c = self.cfg
        flags = "".join(
            f
            for f, on in (
                ("c", self.mask & MASK_CAUSAL),
                ("w", self.mask & MASK_WINDOW),
                ("m", self.mask & MASK_CUSTOM),
                ("s", self.soft_cap),
                ("a", self.alibi),
            )
            if on
        )
        return (
            f"prefill/{'paged' if self.paged else 'ragged'}/{self.dtype}/d{self.head_dim_qk}x{self.head_dim_vo}/"
            f"q{c.tile_q}k{c.tile_kv}s{c.stages}{'g2' if c.groups == 2 else ''}/{flags or 'plain'}"
        )


@functools.cache
def prefill_spec(key: PrefillKernelKey) -> KernelSpec:
    """One module per specialisation (a prefill module compiles in ~1-2 s; only the ones a batch uses are built)."""
    return KernelSpec(
        name=key.short_name(),
        source="attention/prefill.cu",
        name_exprs=(key.name_expr(),),
        preamble=PrefillParams.c_decl(),
        sass_expect=(r"HMMA", r"LDSM", r"LDGSTS"),
    )


def default_specs() -> list[KernelSpec]:
    """The specialisations CI compiles (sm_80 and sm_90a, no spills): per head-dim pair the long-prefill tiles on
    ragged and paged KV (causal) and the decode-like tiles (paged); then one of each variant flag."""
    from cuinfer.prefill_policy import block_groups, default_kv_tile, query_tile

    def key(dtype, dqk, dvo, tq, paged, mask, soft_cap=False, alibi=False):
        cfg = tile_config(tq, default_kv_tile(tq, dqk, dvo, soft_cap or alibi), dvo)
        cfg = dataclasses.replace(cfg, groups=block_groups(cfg, dqk, dvo, paged))
        return PrefillKernelKey(dtype, dtype, dqk, dvo, cfg, paged, mask, soft_cap, alibi)

    keys = []
    for dqk, dvo in HEAD_DIMS:
        long_tile = query_tile(1 << 20, dvo)
        keys.append(key("bfloat16", dqk, dvo, long_tile, False, MASK_CAUSAL))
        keys.append(key("bfloat16", dqk, dvo, long_tile, True, MASK_CAUSAL))
        keys.append(key("bfloat16", dqk, dvo, 16, True, 0))
    keys.append(key("float16", 128, 128, 64, False, 0))
    keys.append(key("bfloat16", 128, 128, 128, False, MASK_CAUSAL | MASK_WINDOW, soft_cap=True, alibi=True))
    keys.append(key("float16", 128, 128, 32, True, MASK_CAUSAL | MASK_CUSTOM))
    return [prefill_spec(k) for k in keys]
