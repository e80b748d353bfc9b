"""Tile sizes of the FA2-class prefill kernel: a pure function of the batch shape and the device limits.

The paper's heuristic (FlashInfer §3.3):

1. **Query tile** ``Br``: the smallest of {16, 32, 64, 128} that is >= the *average packed query length* of the batch
   (query tokens x GQA group, since the group's heads are fused into the rows of a tile), 128 when none is. Short
   queries (decode, speculative verification) waste less padding in a small tile; long prefill wants the largest,
   whose K/V fragments serve the most rows. Head dim 256 stops at 64: a 128-row tile would need 8 warps of 16 rows
   (the fp32 output alone fills 128 registers a thread) and gains nothing over two 64-row CTAs.
2. **KV tile** ``Bc``: among {32, 64, 128} (those the warp layout of ``Br`` allows), the one that maximises warps
   resident per SM under the register and shared-memory limits read from the device; ties go to the larger tile
   (fewer barriers and softmax rescales per key). A tile whose fp32 accumulators (output + scores) exceed 192 per
   thread (160 with a logits or value transform, except the soft cap or ALiBi alone or after causal at 16-bit K/V:
   ``accumulator_limit``) would spill and is never chosen.
3. **CTAs per block** (``block_groups``): the ragged 128 x 64 tiles at head dim 128 run two CTAs of the plan in one
   block (measured 2-4 % faster on the H200) unless the chain is register-heavy; everything else one.

Worked example (H200: 228 KB smem/SM, 227 KB per block, 64 K registers/SM; Llama-3.1-8B: 32/8 heads, d 128, bf16):

* P1, one 8192-token prefill: packed length 8192 x 4 = 32768 -> Br = 128 (4 warps x 32 rows).
  Bc = 32: accumulators 2 x (64 + 16) = 160, ~236 registers -> 2 CTAs (regs); smem 32 KB Q + 2 x 16 KB K/V = 70 KB
  -> 3 CTAs; resident 2 x 4 = 8 warps.  Bc = 64: accumulators 192, ~255 registers -> 2 CTAs; smem 98 KB -> 2 CTAs;
  8 warps.  Bc = 128: 256 accumulators -> would spill.  Tie at 8 warps -> Bc = 64.  Ragged: the two CTAs of an SM
  run as one paired block of 256 threads and 194 KB.
* Decode-like batch (1 token per request): packed length 4 -> Br = 16 (1 x 4 warps, each warp one 16-key slice of
  every KV tile). Bc = 64: ~140 registers, 74 KB -> 3 CTAs (smem), 12 warps. Bc = 128: 143 KB -> 1 CTA, 4 warps.
  -> Bc = 64.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from cuinfer.prefill.tiles import KV_TILES, QUERY_TILES, TileConfig, block_smem_bytes, smem_bytes, tile_config

SUPPORTED_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128))
MAX_ACCUMULATORS = 192  # fp32 accumulators per thread above which ptxas spills (measured: 256 spills ~500 bytes)
# ALiBi / soft cap add per-element work and registers to the score loop: 192 spilled 12 bytes on sm_80 (NVRTC 12.9).
# Since the soft cap's constants come from the constant bank, ALiBi's row states from shared memory and its key
# distances from one FADD per logit, the soft cap or ALiBi alone (after causal at most: Rendered.wide_logits) fit the
# plain limit at 16-bit K/V when the block runs one CTA (block_groups): 128 x 64 at d128, spill-free.
MAX_ACCUMULATORS_VARIANT = 160

SMEM_RESERVED_PER_CTA = 1024  # the driver reserves 1 KB of shared memory per resident CTA
DEFAULT_STAGES = 2
# fp8 K/V: a stage holds half the bytes, so the same shared memory holds more of them. The KV tile and the stage count
# are chosen together among these (most resident warps; ties: the larger tile, then more stages in flight). 16-bit
# K/V keep DEFAULT_STAGES. Re-tune on the GPU: python -m bench prefill --cases P4,P4-e4m3,P5,P5-e4m3,P6,P6-e4m3
# with plan(tile_sizes=(128, kv_tile, stages)) or bench/lab/tune_prefill.py
FP8_STAGE_CHOICES = (2, 3)
FP8_HEAD_DIMS = ((64, 64), (128, 128), (256, 256))  # one head dim for K and V (fp8 rows of 4 or 8k chunks)


def accumulator_limit(variant: bool, wide_logits: bool = False, kv_itemsize: int = 2) -> int:
    """fp32 accumulators per thread a tile may need: MAX_ACCUMULATORS_VARIANT for register-heavy chains
    (``variant``) but the ``wide_logits`` ones at 16-bit K/V, MAX_ACCUMULATORS otherwise.

    >>> [accumulator_limit(*a) for a in [(False,), (True,), (True, True), (True, True, 1)]]
    [192, 160, 192, 160]
    """
    return MAX_ACCUMULATORS_VARIANT if variant and not (wide_logits and kv_itemsize == 2) else MAX_ACCUMULATORS


@dataclass(frozen=True)
class DeviceLimits:
    """What the policy reads from the device (``cuinfer.runtime.device.DeviceInfo`` has these fields)."""

    smem_per_sm: int = 233472  # H200: 228 KB
    smem_per_block_optin: int = 232448  # 227 KB
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32


def check_head_dims(head_dim_qk: int, head_dim_vo: int, kv_itemsize: int = 2) -> None:
    if (head_dim_qk, head_dim_vo) not in SUPPORTED_HEAD_DIMS:
        pairs = ", ".join(f"{a}" if a == b else f"({a}, {b})" for a, b in SUPPORTED_HEAD_DIMS)
        raise ValueError(
            f"head_dim={head_dim_qk}, head_dim_vo={head_dim_vo} is not supported by the prefill kernel; supported "
            f"head dims are {pairs} (qk, vo); pad the heads to a supported size"
        )
    if kv_itemsize == 1 and (head_dim_qk, head_dim_vo) not in FP8_HEAD_DIMS:
        raise ValueError(
            f"head_dim={head_dim_qk}, head_dim_vo={head_dim_vo} is not supported with an fp8 cache: fp8 K/V take one "
            "head dim of 64, 128 or 256"
        )


def query_tile(avg_packed_qo_len: float, head_dim_vo: int) -> int:
    """Smallest query tile >= the average packed query length (128 when none is; 64 at most for head dim 256).

    >>> query_tile(1, 128), query_tile(17, 128), query_tile(64, 128), query_tile(65, 128), query_tile(32768, 256)
    (16, 32, 64, 128, 64)
    """
    cap = 64 if head_dim_vo >= 256 else 128
    for t in QUERY_TILES:
        if t >= avg_packed_qo_len or t == cap:
            return t
    return cap


def accumulators(cfg: TileConfig, head_dim_vo: int) -> int:
    """fp32 accumulator registers per thread: output rows (d/2 per m16 block) plus scores (8 per 16 keys)."""
    return cfg.mma_q * (head_dim_vo // 2 + 8 * cfg.mma_kv)


def estimated_registers(cfg: TileConfig, head_dim_vo: int) -> int:
    """Registers per thread, fitted to ptxas (NVRTC 12.9, sm_80/sm_90a): ~1.25 x accumulators + 40, 8-aligned
    (within ~15 of the measured 79-255 over the configurations CI compiles).

    Only used to rank KV tiles by occupancy; the grid itself is sized from the compiled kernel's real occupancy.
    """
    est = int(1.25 * accumulators(cfg, head_dim_vo)) + 40
    return min(255, -(-est // 8) * 8)


def ctas_per_sm(cfg: TileConfig, head_dim_qk: int, head_dim_vo: int, paged: bool, limits: DeviceLimits) -> int:
    """Resident CTAs per SM by shared memory, registers and threads (0 when one CTA does not fit)."""
    smem = smem_bytes(cfg, head_dim_qk, head_dim_vo, paged)
    if smem > limits.smem_per_block_optin:
        return 0
    by_smem = limits.smem_per_sm // (smem + SMEM_RESERVED_PER_CTA)
    regs = estimated_registers(cfg, head_dim_vo)
    # registers are allocated per warp in units of 256 (8 per thread)
    by_regs = limits.regs_per_sm // (cfg.threads * regs)
    by_threads = limits.max_threads_per_sm // cfg.threads
    return max(0, min(by_smem, by_regs, by_threads, limits.max_blocks_per_sm))


@functools.lru_cache(maxsize=256)
def kv_tile(
    tile_q: int,
    head_dim_qk: int,
    head_dim_vo: int,
    *,
    paged: bool,
    limits: DeviceLimits = DeviceLimits(),
    variant: bool = False,
    kv_itemsize: int = 2,
    wide_logits: bool = False,
) -> int:
    """The KV tile maximising resident warps per SM for this query tile (ties: the larger tile). ``variant``: the
    chain is register-heavy (Rendered.register_heavy), ``wide_logits``: one that keeps the plain tiles anyway.

    >>> kv_tile(128, 128, 128, paged=False), kv_tile(16, 128, 128, paged=True)
    (64, 64)
    >>> kv_tile(128, 128, 128, paged=False, variant=True), kv_tile(128, 128, 128, paged=False, variant=True,
    ...     wide_logits=True)
    (32, 64)
    """
    return _kv_tile_and_stages(tile_q, head_dim_qk, head_dim_vo, paged, limits, variant, kv_itemsize, wide_logits)[0]


@functools.lru_cache(maxsize=256)
def _kv_tile_and_stages(
    tile_q: int, head_dim_qk: int, head_dim_vo: int, paged: bool, limits: DeviceLimits, variant: bool, kv_itemsize: int,
    wide_logits: bool = False,
) -> tuple[int, int]:  # fmt: skip
    """(KV tile, stages): the most resident warps per SM; ties go to the larger tile, then (fp8) to more stages.

    >>> _kv_tile_and_stages(128, 128, 128, False, DeviceLimits(), False, 1)  # P1 shape, fp8 K/V
    (64, 3)
    """
    best, best_key = None, None
    for tkv in KV_TILES:
        for stages in FP8_STAGE_CHOICES if kv_itemsize == 1 else (DEFAULT_STAGES,):
            try:
                cfg = tile_config(tile_q, tkv, head_dim_vo, stages, kv_itemsize=kv_itemsize)
            except ValueError:
                continue  # not a multiple of the warps' 16-key slices
            if accumulators(cfg, head_dim_vo) > accumulator_limit(variant, wide_logits, kv_itemsize):
                continue
            warps = ctas_per_sm(cfg, head_dim_qk, head_dim_vo, paged, limits) * cfg.threads // 32
            if warps == 0:
                continue
            key = (warps, tkv, stages)
            if best_key is None or key > best_key:
                best, best_key = (tkv, stages), key
    if best is None:
        raise ValueError(
            f"no KV tile fits query tile {tile_q} at head dims ({head_dim_qk}, {head_dim_vo}) in "
            f"{limits.smem_per_block_optin} bytes of shared memory per block; use a smaller query tile"
        )
    return best


def default_kv_tile(tile_q: int, head_dim_qk: int, head_dim_vo: int, variant: bool = False,
                    wide_logits: bool = False) -> int:  # fmt: skip
    """The KV tile on the reference device (H200 limits), ragged layout: what CI compiles."""
    return kv_tile(tile_q, head_dim_qk, head_dim_vo, paged=False, variant=variant, wide_logits=wide_logits)


def block_groups(cfg: TileConfig, head_dim_qk: int, head_dim_vo: int, paged: bool,
                 limits: DeviceLimits = DeviceLimits(), variant: bool = False) -> int:  # fmt: skip
    """CTAs of the plan per launched block: 2 (paired blocks, kernel_src/attention/prefill.cuh) for the ragged
    128 x 64 tiles at head dim 128 when two of them fit in one block and the SM holds exactly two CTAs either way;
    else 1. Register-heavy chains (``variant``: Rendered.register_heavy) run one CTA per block: the paired kernel
    holds a few more registers (the group's offsets and barrier), which spilled the soft-capped and ALiBi 128 x 64
    tiles (8-24 bytes) that one CTA per block runs spill-free.

    Measured on the H200 (bench/lab/tune_prefill.py, same call, outputs bit-identical): paired blocks ran the ragged
    P1-P3 3.6 / 3.1 / 2.1 % faster than two CTAs per SM, and the paged P4-P6 8-9 % slower, so paged tiles stay
    unpaired. Other head dims and tiles were not measured and stay unpaired.

    >>> block_groups(tile_config(128, 64, 128), 128, 128, paged=False), block_groups(tile_config(128, 64, 128), 128,
    ...     128, paged=True), block_groups(tile_config(128, 64, 128), 128, 128, paged=False, variant=True)
    (2, 1, 1)
    """
    if variant or paged or cfg.warps_kv != 1:
        return 1
    if (cfg.tile_q, cfg.tile_kv) != (128, 64) or (head_dim_qk, head_dim_vo) != (128, 128):
        return 1
    pair = dataclasses.replace(cfg, groups=2)
    smem = block_smem_bytes(pair, head_dim_qk, head_dim_vo, paged)
    fits = (
        smem <= limits.smem_per_block_optin
        and smem + SMEM_RESERVED_PER_CTA <= limits.smem_per_sm
        and pair.block_threads * estimated_registers(cfg, head_dim_vo) <= limits.regs_per_sm
    )
    return 2 if fits and ctas_per_sm(cfg, head_dim_qk, head_dim_vo, paged, limits) == 2 else 1


def choose_tiles(
    avg_packed_qo_len: float,
    head_dim_qk: int,
    head_dim_vo: int,
    *,
    paged: bool,
    limits: DeviceLimits = DeviceLimits(),
    tile_q: int | None = None,
    tile_kv: int | None = None,
    stages: int | None = None,
    variant: bool = False,
    groups: int | None = None,
    kv_itemsize: int = 2,
    kv_convert: bool | None = None,
    wide_logits: bool = False,
) -> TileConfig:
    """The full tile configuration of a batch; ``tile_q`` / ``tile_kv`` / ``stages`` / ``groups`` force either choice
    (tests, tuning; stages None: DEFAULT_STAGES, or for fp8 K/V chosen with the KV tile); ``variant``: the logits carry
    ALiBi or a soft cap (fewer registers to spare: Rendered.register_heavy; one CTA per block), ``wide_logits``: a
    chain of those that keeps the plain tiles (Rendered.wide_logits); ``kv_itemsize``: 1 for fp8 K/V; ``kv_convert``
    forces fp8's conversion mode (``TileConfig.kv_convert``; None: tiles.FP8_CONVERT_CROSS_ITEM's rule).

    >>> c = choose_tiles(32768, 128, 128, paged=False)
    >>> (c.tile_q, c.tile_kv, c.warps_q, c.warps_kv, c.mma_kv)
    (128, 64, 4, 1, 4)
    >>> c = choose_tiles(4, 128, 128, paged=True)
    >>> (c.tile_q, c.tile_kv, c.warps_q, c.warps_kv, c.mma_kv)
    (16, 64, 1, 4, 1)
    """
    cfg = _tiles(
        avg_packed_qo_len, head_dim_qk, head_dim_vo, paged, limits, tile_q, tile_kv, stages, variant, kv_itemsize,
        wide_logits,
    )  # fmt: skip
    if kv_convert is not None and kv_convert != cfg.kv_convert:
        cfg = tile_config(cfg.tile_q, cfg.tile_kv, head_dim_vo, cfg.stages, cfg.groups, kv_itemsize, kv_convert)
        need = smem_bytes(cfg, head_dim_qk, head_dim_vo, paged)
        if need > limits.smem_per_block_optin:
            raise ValueError(
                f"tiles ({cfg.tile_q}, {cfg.tile_kv}) with {cfg.stages} stages and kv_convert={kv_convert} need {need} "
                f"bytes of shared memory but a block may use {limits.smem_per_block_optin}; use fewer stages"
            )
    if groups is None:
        return dataclasses.replace(cfg, groups=block_groups(cfg, head_dim_qk, head_dim_vo, paged, limits, variant))
    cfg = tile_config(cfg.tile_q, cfg.tile_kv, head_dim_vo, cfg.stages, int(groups), kv_itemsize, cfg.kv_convert)
    need = block_smem_bytes(cfg, head_dim_qk, head_dim_vo, paged)
    if need > limits.smem_per_block_optin:
        raise ValueError(
            f"{groups} CTAs per block of tiles ({cfg.tile_q}, {cfg.tile_kv}) need {need} bytes of shared memory but "
            f"a block may use {limits.smem_per_block_optin}; use groups=1"
        )
    return cfg


def _tiles(
    avg_packed_qo_len, head_dim_qk, head_dim_vo, paged, limits, tile_q, tile_kv, stages, variant, kv_itemsize=2,
    wide_logits=False,
) -> TileConfig:  # fmt: skip
    """``choose_tiles`` before the block pairing. ``stages`` is taken as given; None: fp8 K/V choose it with the KV tile
    (``_kv_tile_and_stages``; the given KV tile's own best otherwise), 16-bit K/V take DEFAULT_STAGES."""
    check_head_dims(head_dim_qk, head_dim_vo, kv_itemsize)
    auto_stages = kv_itemsize == 1 and stages is None
    given_stages = stages is not None
    stages = DEFAULT_STAGES if stages is None else stages
    if stages < 2:
        raise ValueError(
            f"the prefill pipeline needs stages >= 2 (it refills the previous tile's buffer) but got {stages}"
        )
    if tile_q is None and tile_kv is None:
        # The rule's query tile, or (on a device too small for it: 100 KB of smem and head dim 256 cannot hold the
        # 64-key tiles of the 16-row layout) the nearest query tile that fits.
        first = query_tile(avg_packed_qo_len, head_dim_vo)
        order = sorted(QUERY_TILES, key=lambda t: (abs(QUERY_TILES.index(t) - QUERY_TILES.index(first)), t))
        for tq in order:
            if tq == 128 and head_dim_vo >= 256:
                continue
            try:
                tkv, st = _kv_tile_and_stages(
                    tq, head_dim_qk, head_dim_vo, paged, limits, variant, kv_itemsize, wide_logits
                )
            except ValueError:
                continue
            return tile_config(tq, tkv, head_dim_vo, st if auto_stages else stages, kv_itemsize=kv_itemsize)
        raise ValueError(
            f"no prefill tiles fit head dims ({head_dim_qk}, {head_dim_vo}) in {limits.smem_per_block_optin} bytes "
            "of shared memory per block"
        )
    tq = query_tile(avg_packed_qo_len, head_dim_vo) if tile_q is None else int(tile_q)
    if tq not in QUERY_TILES:
        raise ValueError(f"query tile must be one of {QUERY_TILES} but is {tile_q}")
    if tile_kv is None:
        tkv, st = _kv_tile_and_stages(tq, head_dim_qk, head_dim_vo, paged, limits, variant, kv_itemsize, wide_logits)
        stages = st if auto_stages else stages
    else:
        tkv = int(tile_kv)
    cfg = tile_config(tq, tkv, head_dim_vo, stages, kv_itemsize=kv_itemsize)
    if tile_q is not None or tile_kv is not None or given_stages:
        limit = accumulator_limit(variant, wide_logits, kv_itemsize)
        if accumulators(cfg, head_dim_vo) > limit:
            raise ValueError(
                f"tiles ({tq}, {tkv}) need {accumulators(cfg, head_dim_vo)} fp32 accumulators per thread at head dim "
                f"{head_dim_vo}, more than the {limit} that fit in registers; use a smaller KV tile"
            )
        need = smem_bytes(cfg, head_dim_qk, head_dim_vo, paged)
        if need > limits.smem_per_block_optin:
            raise ValueError(
                f"tiles ({tq}, {tkv}) with {stages} stages need {need} bytes of shared memory at head dims "
                f"({head_dim_qk}, {head_dim_vo}) but a block may use {limits.smem_per_block_optin}; use smaller tiles"
            )
    return cfg
