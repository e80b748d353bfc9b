"""Which decode kernel, with which tiles: a pure function of the GQA group, the head dim and the KV element size.

Decode is memory bound: every KV byte is read once and the target is the copy roofline (~4.2 TB/s on an H200, i.e.
~32 GB/s per SM). By Little's law an SM needs ~32 KB of loads in flight to cover ~1 µs of loaded DRAM latency, so a
configuration is judged by stage bytes x stages in flight x CTAs per SM, and by how much math each KV byte costs.

* CUDA cores (query tile 1 per head): D/8 lanes per head reduce q·k with shuffles; every query head of the group
  re-reads the K/V tile from shared memory, so shared-memory traffic is g x the DRAM bytes. Cheap for g <= 2, the
  bottleneck from g ~ 4 on.
* Tensor cores (head-group fusion): the g heads are rows of one 16-row mma tile, so the K/V tile is read from shared
  memory once (ldmatrix) whatever g is; rows beyond g are padding that costs tensor-core time, which is idle anyway.

Worked example, Llama-3.1-8B decode (32 query / 8 KV heads, g = 4, head dim 128, bf16):
  g = 4 >= 4 -> tensor cores; 4 warps along the tokens, a tile is 16 x 4 = 64 tokens = 64 x 128 x 2 B x (K+V)
  = 32 KB per stage; 3 stages = 96 KB + ~10 KB of tile descriptors, item list, query tile and merge flags = 107 KB,
  so 2 CTAs fit per SM (228 KB): up to 2 CTAs x 2 stages x 32 KB = 128 KB in flight per SM, 4x what latency needs,
  which leaves room for the bubbles at item boundaries. The grid is then 2 x 132 = 264 persistent CTAs.
Same model with MHA (32:32, g = 1): CUDA cores, 16 lanes per head x 8 token slices = 128 threads, 32-token tiles
  (16 KB), 4 stages = 64 KB + ~7 KB -> 3 CTAs per SM, 3 x 3 x 16 KB = 144 KB in flight per SM.

fp8 K/V (1-byte elements): the same bytes per stage hold twice the tokens, so the stage bytes, the stages in flight
and the CTAs per SM above stay as they are and every number of tokens doubles (``FP8_TILE_FACTOR``):
  Llama-3.1-8B with an e4m3 cache (D10): tensor cores, each of the 4 warps owns 32 tokens (``FP8_WARP_TOKENS``: one
  ldmatrix of 32 keys per k-step) -> 128-token tiles = 128 x 128 x 1 B x 2 = 32 KB per stage, 3 stages, 2 CTAs per
  SM; the merge of the 4 warps' 16 x 128 fp32 states (32 KB) still fits in one stage. MHA: CUDA cores, 64-token tiles.
  Each KV byte now carries one element, so the math per byte doubles and the conversions come on top. The tensor-core
  kernel runs the fp8 products in float16 for either q type (common/fp8.cuh: e4m3 K by k_pairs, one cvt per 2 bytes
  on sm_89+, e4m3 V by v_pairs, a byte permute and one cvt per 2 bytes there; e5m2 by byte permutes and masks; no
  multiply) with a lazy softmax max, so its whole hot loop costs ~0.067 instructions per KV byte (D10: 549 per warp
  and 128-token tile on the tiles whose max does not move; D6's bf16 loop: 622, ~0.076), where f16s_pairs for K and
  V cost ~0.125 (1023) and for V alone ~0.096 (784).
  Bytes in flight per SM (stage bytes x (stages - 1) x CTAs per SM, the copies pending while the CTAs compute):
  128 KB for D10 as for bf16 D6; at head dim 64 the 128-token tiles' 16-byte descriptors cost fp8 its 4th stage
  (96 KB in flight where 16-bit has 144 KB).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SUPPORTED_HEAD_DIMS = (64, 128, 256)
# The tensor-core kernel pays off once the group re-reads of the CUDA-core kernel cost more than the padded mma rows.
TENSOR_CORE_MIN_GROUP = 4
MAX_THREADS = 512  # CUDA-core blocks beyond this leave < 128 registers per thread
ITEM_CHUNK = 64  # kItemChunk in decode.cuh
ITEM_INFO_BYTES = 40  # sizeof(ItemInfo)
REFERENCE_SMEM_PER_SM = 233472  # Hopper (H100 / H200): 228 KB of shared memory per SM
# K/V copies are marked L2 evict-first when a step streams at most this many L2 sizes of K/V (see kv_evict_first).
EVICT_FIRST_MAX_L2_MULTIPLE = 4
# fp8 K/V: tokens per tile relative to 16-bit K/V (the stage bytes stay), and tokens each tensor-core warp owns per tile
# (a multiple of 32: one ldmatrix x4 covers 32 fp8 keys of a k-step; at most threads / warps_kv so that one thread
# resolves each token of a tile).
FP8_TILE_FACTOR = 2
FP8_WARP_TOKENS = 32


@dataclass(frozen=True)
class DecodeConfig:
    """Template parameters of one decode kernel and the facts the host derives from them.

    ``rows_per_tile`` is the planner's query tile (packed rows per work item): the whole group for the CUDA-core
    kernel, 16 for the tensor-core kernel (a group above 16 heads is several tiles).
    """

    tensor_cores: bool
    head_dim: int
    group: int
    threads: int
    tile_kv: int  # tokens per pipeline stage
    stages: int
    warps_kv: int = 0  # tensor cores: warps along the tile's tokens (tile_kv = warp_tokens * warps_kv)
    warps_d: int = 0  # tensor cores: warps along the output dims
    kv_itemsize: int = 2  # 2: float16 / bfloat16 K/V, 1: fp8
    warp_tokens: int = 16  # tensor cores: tokens of a tile each warp owns (16 for 16-bit K/V, FP8_WARP_TOKENS for fp8)

    @property
    def rows_per_tile(self) -> int:
        return 16 if self.tensor_cores else self.group

    @property
    def min_blocks(self) -> int:
        """CTAs per SM the kernel is compiled for (``__launch_bounds__``) and the persistent grid is sized for: what
        shared memory allows on a 228 KB SM, but never below 128 registers per thread (large CUDA-core blocks of
        big groups would spill otherwise), so the register file never lowers the occupancy the plan assumed."""
        by_regs = max(1, 65536 // (self.threads * 128))
        return min(ctas_per_sm(self, smem_per_sm=REFERENCE_SMEM_PER_SM), by_regs)

    @property
    def stage_bytes(self) -> int:
        return 2 * self.tile_kv * self.head_dim * self.kv_itemsize

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory of the kernel; mirrors Pipeline<> and the kernels' own areas in decode.cuh."""
        # tile slots (TileSlot): 16 bytes of K / V addresses per token and 40 of item facts, 16-byte aligned where the
        # kernel's pipeline takes address pairs (kPairs: fp8, CUDA-core, key transforms); the 16-bit tensor-core
        # kernels' other slots are 8 bytes smaller, and the 32 bytes they leave change no configuration's CTAs per SM
        ring = (self.stages + 1) * (16 * self.tile_kv + 48)
        pipe = self.stages * self.stage_bytes + ring + ITEM_CHUNK * ITEM_INFO_BYTES
        pipe = -(-pipe // 128) * 128
        if self.tensor_cores:
            # the query tile, the warps' (m, d) per row and the waiting split piece's flag and unit (kernels.cuh
            # PendingPiece)
            return pipe + 16 * self.head_dim * 2 + 16 * self.warps_kv * 2 * 4 + 32
        bdz = self.threads // (self.head_dim // 8 * self.group)
        return pipe + bdz * self.group * 2 * 4


def check_head_dim(head_dim: int) -> None:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head_dim must be one of {', '.join(map(str, SUPPORTED_HEAD_DIMS))} for decode but is {head_dim}; "
            "pad the heads to a supported size"
        )


def decode_config(
    group: int, head_dim: int, *, use_tensor_cores: bool | None = None, kv_itemsize: int = 2
) -> DecodeConfig:
    """The kernel and tiles for a GQA group size and head dim (``use_tensor_cores`` None = automatic).

    >>> c = decode_config(4, 128)
    >>> c.tensor_cores, c.threads, c.tile_kv, c.stages, c.warps_kv, c.warps_d
    (True, 128, 64, 3, 4, 1)
    >>> decode_config(1, 128).threads, decode_config(1, 128).tile_kv
    (128, 32)
    >>> c = decode_config(4, 128, kv_itemsize=1)  # fp8 K/V: twice the tokens, the same stage bytes
    >>> c.tile_kv, c.warp_tokens, c.stages, c.stage_bytes
    (128, 32, 3, 32768)
    """
    check_head_dim(head_dim)
    if kv_itemsize == 1:
        return _fp8_config(group, head_dim, use_tensor_cores)
    if group < 1:
        raise ValueError(f"the GQA group (num_qo_heads // num_kv_heads) must be >= 1 but is {group}")
    if kv_itemsize not in (1, 2):
        raise ValueError(f"decode kernels take 16-bit or fp8 K/V (itemsize 2 or 1), not an itemsize of {kv_itemsize}")
    tensor_cores = group >= TENSOR_CORE_MIN_GROUP if use_tensor_cores is None else bool(use_tensor_cores)
    if tensor_cores:
        # 16 tokens per warp; 64-token tiles (2 warps x 2 along the dims at 256, which keeps the fp32 output
        # accumulators at 64 registers per thread). Stages keep ~64-96 KB of KV per CTA -> 2-3 CTAs per SM.
        warps_kv, warps_d = (2, 2) if head_dim == 256 else (4, 1)
        tile = 16 * warps_kv
        stages = 4 if head_dim == 64 else 3
        return DecodeConfig(True, head_dim, group, 32 * warps_kv * warps_d, tile, stages, warps_kv, warps_d)
    bdx = head_dim // 8  # lanes per head, 8 dims (one 16-byte vector) each
    per_slice = bdx * group
    if per_slice > MAX_THREADS:
        raise ValueError(
            f"the CUDA-core decode kernel needs head_dim/8 x group = {per_slice} threads for group {group} at head dim "
            f"{head_dim}, more than {MAX_THREADS}; use use_tensor_cores=True (or None) for this group"
        )
    bdz = 1
    while per_slice * bdz * 2 <= 128:  # at least ~128 threads: token slices of a power of two
        bdz *= 2
    tile = 4096 // head_dim  # 16 KB of K+V per stage
    return DecodeConfig(False, head_dim, group, per_slice * bdz, tile, 4, 0, 0)


def _fp8_config(group: int, head_dim: int, use_tensor_cores: bool | None) -> DecodeConfig:
    """fp8 K/V: the 16-bit configuration with FP8_TILE_FACTOR times the tokens per tile in the same stage bytes, and
    as many of its stages as keep its CTAs per SM (the tile descriptors grow with the tokens: 16 B each, which at head
    dim 64 is 1/8 of a token's K+V bytes, so 4 stages of 128 tokens leave 2 CTAs per SM where 16-bit had 3).

    >>> c = decode_config(1, 64, kv_itemsize=1)  # MHA, head dim 64: 128-token tiles, 3 stages, 3 CTAs per SM
    >>> c.tile_kv, c.stages, c.min_blocks, decode_config(1, 64).min_blocks
    (128, 3, 3, 3)
    """
    base = decode_config(group, head_dim, use_tensor_cores=use_tensor_cores)
    if base.tensor_cores:
        cfg = dataclasses.replace(
            base, tile_kv=FP8_WARP_TOKENS * base.warps_kv, kv_itemsize=1, warp_tokens=FP8_WARP_TOKENS
        )
    else:
        cfg = dataclasses.replace(base, tile_kv=FP8_TILE_FACTOR * base.tile_kv, kv_itemsize=1)
    want = ctas_per_sm(base, smem_per_sm=REFERENCE_SMEM_PER_SM)
    while cfg.stages > 2 and ctas_per_sm(cfg, smem_per_sm=REFERENCE_SMEM_PER_SM) < want:
        cfg = dataclasses.replace(cfg, stages=cfg.stages - 1)
    return cfg


def kv_evict_first(kv_bytes: int, l2_bytes: int) -> bool:
    """Whether a decode step streaming ``kv_bytes`` of K/V marks its copies evict-first in an L2 of ``l2_bytes``.

    Measured on the H200 (60 MB L2; ``python -m bench.lab.tune_sched evict``, both policies in one call) with the L2
    full of dirty lines, as after docs/benchmarks.md's flush (a 512 MB write) or after kernels that wrote a lot:

    * evict-normal displaces the dirty lines and pays their write-back inside the kernel, a fixed cost of ~6-9 µs;
    * evict-first keeps them (the stream replaces its own lines) but streams ~10 % slower over the whole kernel.

    D1 (67 MB) 29.1 µs evict-first against 32.0 normal, D4 (134 MB) 49.7 against 53.0; D8 (671 MB) 178 against 171,
    D5 (1.07 GB) 276 against 260. With a clean L2 the two policies are within 1.5 % of each other on D1-D9. The
    crossover (10 % of the kernel time = the fixed write-back) is near 85 µs, ~350 MB or ~6 L2 sizes; 4 keeps a margin
    on both sides.

    >>> kv_evict_first(134 << 20, 60 << 20), kv_evict_first(671 << 20, 60 << 20)
    (True, False)
    """
    return kv_bytes <= EVICT_FIRST_MAX_L2_MULTIPLE * l2_bytes


def ctas_per_sm(config: DecodeConfig, *, smem_per_sm: int, max_threads_per_sm: int = 2048) -> int:
    """CTAs of ``config`` that fit on one SM by shared memory and threads (1 KB per block is reserved by CUDA).

    Registers are bounded by ``__launch_bounds__(threads, min_blocks)``; the grid uses
    ``min(ctas_per_sm(...device...), config.min_blocks)`` so every CTA is resident at once.
    """
    by_smem = smem_per_sm // (config.smem_bytes + 1024)
    by_threads = max_threads_per_sm // config.threads
    return max(1, min(by_smem, by_threads, 32))
