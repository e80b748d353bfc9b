"""Kernel specs of the FA2-class prefill kernel (kernel_src/attention/prefill.cuh): parameter struct, name
expressions, the specialisations CI compiles (tile configs and shared-memory sizes: ``cuinfer.prefill.tiles``). No GPU
needed (CI compiles every registered spec for sm_80 and sm_90a)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from cuinfer.decode.specs import fp8_sass_expect
from cuinfer.jit import KernelSpec, ParamStruct
from cuinfer.prefill.tiles import TileConfig, tile_config
from cuinfer.variants import Rendered, lookup, render

HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128))  # (qk, vo) pairs the kernel is built for
CTYPES = {
    "float16": "half", "bfloat16": "__nv_bfloat16", "float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2",
}  # fmt: skip

PrefillParams = ParamStruct(
    "PrefillParams",
    tuple(
        (n, "ptr")
        for n in (
            "q", "k", "v", "o", "lse", "partial_o", "partial_lse",
            "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len",
            "work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial",
            "pool_count", "k_scales", "v_scales",
        )
    )
    + tuple(
        (n, "i64")
        for n in (
            "q_stride_n", "q_stride_h", "k_stride_n", "k_stride_h", "k_stride_page", "v_stride_n", "v_stride_h",
            "o_stride_n", "o_stride_h", "lse_stride_n", "lse_stride_h",
        )
    )
    + (("group_size", "i32"), ("page_size", "i32"), ("natural_groups", "i32"))
    # fp8 scale arrays (float32, null when none): value kv_head * stride (stride 0: one for every head)
    + (("k_scales_stride", "i32"), ("v_scales_stride", "i32"))
    + (("group_mul", "u32"), ("group_shift", "u32"), ("page_mul", "u32"), ("page_shift", "u32"))
    + (("sm_scale", "f32"), ("sm_scale_log2", "f32"), ("v_scale", "f32"))  # (k_scale folded into sm_scale; fp8)
    # split items' merge units (planner/units.py): a chain with a sink folds it into the first piece of each split
    + (("item_merge", "ptr"),)
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
class PrefillKernelKey:
    """Everything that selects one compiled specialisation."""

    dtype: str  # q (and k / v unless kv_dtype says otherwise)
    out_dtype: str
    head_dim_qk: int
    head_dim_vo: int
    cfg: TileConfig
    paged: bool
    variant: Rendered  # the chain of attention variants (cuinfer/variants)
    kv_dtype: str = ""  # k / v when not q's: "float8_e4m3fn" / "float8_e5m2"

    def name_expr(self) -> str:
        c = self.cfg
        kv = self.kv_dtype or self.dtype
        q = f", {CTYPES[self.dtype]}, {str(c.kv_convert).lower()}" if kv != self.dtype else ""
        return (
            f"cuinfer::batch_prefill<cuinfer::PrefillTraits<{CTYPES[kv]}, {CTYPES[self.out_dtype]}, "
            f"{self.head_dim_qk}, {self.head_dim_vo}, {c.tile_q}, {c.warps_q}, {c.warps_kv}, {c.mma_kv}, {c.stages}, "
            f"{str(self.paged).lower()}, Variant, {c.groups}{q}>>"
        )

    def short_name(self) -> str:
        c = self.cfg
        dt = self.dtype if self.kv_dtype in ("", self.dtype) else f"{self.dtype}-{self.kv_dtype}"
        return (
            f"prefill/{'paged' if self.paged else 'ragged'}/{dt}/d{self.head_dim_qk}x{self.head_dim_vo}/"
            f"q{c.tile_q}k{c.tile_kv}s{c.stages}{'g2' if c.groups == 2 else ''}{'cv' if c.kv_convert else ''}/"
            f"{self.variant.name}"
        )


@functools.cache
def prefill_spec(key: PrefillKernelKey) -> KernelSpec:
    """One module per specialisation (a prefill module compiles in ~1-2 s; only the ones a batch uses are built)."""
    return KernelSpec(
        name=key.short_name(),
        source="attention/prefill.cu",
        name_exprs=(key.name_expr(),),
        preamble=PrefillParams.c_decl() + key.variant.preamble(),
        sass_expect=(r"HMMA", r"LDSM", r"LDGSTS", *fp8_sass_expect(key.kv_dtype, key.dtype)),
    )


def default_specs() -> list[KernelSpec]:
    """The specialisations CI compiles (sm_80 and sm_90a, no spills): per head-dim pair the long-prefill tiles on
    ragged and paged KV (causal) and the decode-like tiles (paged); then the built-in variants."""
    from cuinfer.prefill.policy import block_groups, choose_tiles, default_kv_tile, query_tile

    def key(dtype, dqk, dvo, tq, paged, *names, kv="", convert=None):
        chain = render(tuple(lookup(n) for n in names))
        if kv:  # fp8 K/V: the policy's tile, stages and conversion mode for the layout (or the given mode)
            cfg = choose_tiles(1.0, dqk, dvo, paged=paged, tile_q=tq, variant=chain.register_heavy, kv_itemsize=1,
                               kv_convert=convert, wide_logits=chain.wide_logits)  # fmt: skip
            cfg = dataclasses.replace(cfg, groups=block_groups(cfg, dqk, dvo, paged, variant=chain.register_heavy))
            return PrefillKernelKey(dtype, dtype, dqk, dvo, cfg, paged, chain, kv)
        cfg = tile_config(tq, default_kv_tile(tq, dqk, dvo, chain.register_heavy, chain.wide_logits), dvo)
        cfg = dataclasses.replace(cfg, groups=block_groups(cfg, dqk, dvo, paged, variant=chain.register_heavy))
        return PrefillKernelKey(dtype, dtype, dqk, dvo, cfg, paged, chain)

    keys = []
    for dqk, dvo in HEAD_DIMS:
        long_tile = query_tile(1 << 20, dvo)
        keys.append(key("bfloat16", dqk, dvo, long_tile, False, "causal"))
        keys.append(key("bfloat16", dqk, dvo, long_tile, True, "causal"))
        keys.append(key("bfloat16", dqk, dvo, 16, True))
    keys.append(key("float16", 128, 128, 64, False))
    keys.append(key("bfloat16", 128, 128, 128, False, "causal", "window", "alibi", "soft_cap"))
    keys.append(key("float16", 128, 128, 32, True, "causal", "custom_mask"))
    keys.append(key("bfloat16", 128, 128, 128, False, "causal", "rope"))
    keys.append(key("bfloat16", 128, 128, 16, True, "rope"))
    keys.append(key("bfloat16", 128, 128, 128, False, "causal", "sinks"))
    keys.append(key("bfloat16", 128, 128, 16, True, "sinks"))
    keys.append(key("bfloat16", 128, 128, 128, True, "causal", "sigmoid"))
    keys.append(key("bfloat16", 128, 128, 128, True, "causal", "rope_llama31"))
    # fp8 K/V: every head dim, long-prefill tiles ragged and paged (e4m3, bf16 q) and decode-like paged tiles (e5m2,
    # fp16 q); the 32-row tiles (two warps per row block) and the variants on the Llama shape (sinks and sigmoid
    # included: the fp8 paths take every variant but the key / value transforms)
    for d in (64, 128, 256):
        long_tile = query_tile(1 << 20, d)
        keys.append(key("bfloat16", d, d, long_tile, False, "causal", kv="float8_e4m3fn"))
        keys.append(key("bfloat16", d, d, long_tile, True, "causal", kv="float8_e4m3fn"))
        keys.append(key("float16", d, d, 16, True, kv="float8_e5m2"))
    keys.append(key("bfloat16", 128, 128, 32, True, "causal", "custom_mask", kv="float8_e5m2"))
    keys.append(key("bfloat16", 128, 128, 128, False, "causal", "window", "alibi", "soft_cap", kv="float8_e4m3fn"))
    keys.append(key("bfloat16", 128, 128, 128, False, "causal", "sinks", kv="float8_e4m3fn"))
    keys.append(key("bfloat16", 128, 128, 16, True, "sinks", kv="float8_e5m2"))
    keys.append(key("bfloat16", 128, 128, 128, True, "causal", "sigmoid", kv="float8_e4m3fn"))
    # the conversion mode the policy does not pick for these tiles (tile_sizes=(..., convert) selects it)
    keys.append(key("bfloat16", 128, 128, 128, True, "causal", kv="float8_e4m3fn", convert=False))
    keys.append(key("float16", 64, 64, 16, True, kv="float8_e5m2", convert=True))
    return [prefill_spec(k) for k in keys]
