"""Kernel specs and the parameter struct of the batch-decode kernels (kernel_src/attention/decode/kernels.cuh).

A kernel takes two by-value structs: ``DecodeParams`` (below) and the ``VariantParams`` of its attention variant
(rendered with the variant: cuinfer/variants/render.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cuinfer.decode.policy import DecodeConfig, decode_config
from cuinfer.jit import KernelSpec, ParamStruct
from cuinfer.variants import Rendered, lookup, render

CTYPES = {
    "float16": "half", "bfloat16": "__nv_bfloat16", "float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2",
}  # fmt: skip

DecodeParams = ParamStruct(
    "DecodeParams",
    tuple(
        (n, "ptr")
        for n in (
            "q", "k", "v", "o", "lse", "partial_o", "partial_lse",
            "page_indptr", "page_indices", "kv_lens",
            "work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial",
            "item_merge", "item_pieces", "merge_count", "plan_words", "k_scales", "v_scales",
        )
    )
    + tuple(
        (n, "i64")
        for n in (
            "q_stride_b", "q_stride_h",
            "k_stride_page", "k_stride_slot", "k_stride_head",
            "v_stride_page", "v_stride_slot", "v_stride_head",
            "o_stride_b", "o_stride_h", "lse_stride_b", "lse_stride_h",
        )
    )
    + (("page_size", "i32"), ("kv_evict_first", "i32"), ("plan_bytes", "i32"))
    # fp8 scale arrays (float32, null when none): value kv_head * stride (stride 0: one for every head)
    + (("k_scales_stride", "i32"), ("v_scales_stride", "i32"))
    # sm_scale (k_scale folded in) for the variant's natural logits; logits_scale = sm_scale·log2(e) otherwise
    + (("sm_scale", "f32"), ("logits_scale", "f32"), ("v_scale", "f32")),
)  # fmt: skip


@dataclass(frozen=True)
class DecodeKernelKey:
    """Everything that selects one compiled decode kernel."""

    config: DecodeConfig
    q_dtype: str
    kv_dtype: str
    o_dtype: str
    variant: Rendered = render(())
    lse: bool = False

    def name_expr(self) -> str:
        c = self.config
        q, kv, o = CTYPES[self.q_dtype], CTYPES[self.kv_dtype], CTYPES[self.o_dtype]
        flags = f"Variant, {_b(self.lse)}"  # (Variant: the preamble's chain)
        if c.tensor_cores:
            return (
                f"cuinfer::decode::batch_decode_tensor_core<{q}, {kv}, {o}, {c.head_dim}, {c.group}, {c.warps_kv}, "
                f"{c.warps_d}, {c.warp_tokens}, {c.stages}, {c.min_blocks}, {flags}>"
            )
        return (
            f"cuinfer::decode::batch_decode_cuda_core<{q}, {kv}, {o}, {c.head_dim}, {c.group}, {c.tile_kv}, "
            f"{c.stages}, {c.threads}, {c.min_blocks}, {flags}>"
        )

    def spec_name(self) -> str:
        c = self.config
        kind = "tc" if c.tensor_cores else "cc"
        opts = [self.variant.name] if self.variant.pieces else []
        opts += ["lse"] * self.lse
        same = self.q_dtype == self.kv_dtype == self.o_dtype
        dt = self.q_dtype if same else f"{self.q_dtype}-{self.kv_dtype}-{self.o_dtype}"
        return f"decode/{kind}/{dt}/d{c.head_dim}/g{c.group}" + "".join(f"/{x}" for x in opts)


def _b(x: bool) -> str:
    return "true" if x else "false"


def fp8_sass_expect(kv_dtype: str, convert_to: str) -> list[str]:
    """What the in-register fp8 conversion of common/fp8.cuh leaves in the SASS of a kernel converting ``kv_dtype``
    elements to ``convert_to`` (float16: one F2FP per pair on sm_90a, with no byte permute where the pair is a
    register's 16-bit half (fp8::quad, prefill's whole-tile conversion); on sm_80 the byte permutes and, for e4m3, the
    bit path's HFMA2; bfloat16: the bit path's byte permutes and HFMA2.BF16 multiplies on both; "f16s": the decode
    tensor-core kernel's float16 fragments scaled by a power of two, no multiply, and float16 mma whatever q's type:
    e4m3 K by one F2FP per pair on sm_90a, e4m3 V by a byte permute and one F2FP per pair there, byte permutes and
    masks elsewhere)."""
    if not kv_dtype.startswith("float8"):
        return []
    if convert_to == "f16s":  # the tensor-core kernel's fragments (fp8::v_pairs, fp8::k_pairs): float16 mma
        return [r"PRMT", r"HMMA\.16816\.F32$", *([r"sm_90a:F2FP\.F16\.E4M3"] if "e4m3" in kv_dtype else [])]
    if convert_to == "float16":
        return [r"sm_90a:F2FP\.F16\.E[45]M[23]", r"sm_80:PRMT", *([r"sm_80:HFMA2|HMUL2"] if "e4m3" in kv_dtype else [])]
    return [r"PRMT", r"HFMA2.*BF16|HMUL2.*BF16"]


@functools.cache
def decode_spec(key: DecodeKernelKey) -> KernelSpec:
    """One NVRTC module per specialisation (a decode kernel compiles in ~1-2 s)."""
    # cp.async pipeline, 16-byte q loads and o stores, 16-byte (or ldmatrix) shared reads, exp2 on the MUFU
    expect = [r"LDGSTS.*128", r"LDG\.E.*128", r"STG\.E\.128", r"LDS.*128|LDSM", r"MUFU\.EX2"]
    if key.config.tensor_cores:
        expect += [r"HMMA", r"LDSM"]
    expect += fp8_sass_expect(key.kv_dtype, "f16s" if key.config.tensor_cores else "float16")
    forbid = [r"LDL", r"STL"]
    if key.config.tensor_cores and key.kv_dtype.startswith("float8"):
        # no multiply per fp8 pair; the only fp8 cvts are e4m3 K's and V's on sm_90a (fp8::k_pairs, fp8::v_pairs),
        # e5m2 is byte permutes
        forbid += [r"HMUL2", r"F2FP\.F16\.E5M2", *([r"sm_80:F2FP\.F16\.E4M3"] if "e4m3" in key.kv_dtype else [])]
    return KernelSpec(
        name=key.spec_name(),
        source="attention/decode.cu",
        name_exprs=(key.name_expr(),),
        preamble=DecodeParams.c_decl() + key.variant.preamble(),
        sass_expect=tuple(expect),
        sass_forbid=tuple(forbid),
    )


def shipped_keys() -> list[DecodeKernelKey]:
    """The specialisations CI compiles (sm_80 and sm_90a): both kernels for every dtype and head dim at the standard
    groups, plus each option on the Llama shape."""
    keys = []
    for dt in ("float16", "bfloat16"):
        for d in (64, 128, 256):
            for g, tc in ((1, False), (4, True), (8, True)):
                keys.append(DecodeKernelKey(decode_config(g, d, use_tensor_cores=tc), dt, dt, dt, lse=True))
    # fp8 K/V: both formats, every head dim, both kernels, with bf16 q (e4m3) and fp16 q (e5m2); the D10 kernel (bf16
    # q, e4m3, no lse) is among the bench cases' specs
    for q, kv in (("bfloat16", "float8_e4m3fn"), ("float16", "float8_e5m2")):
        for d in (64, 128, 256):
            for g, tc in ((1, False), (4, True), (8, True)):
                cfg = decode_config(g, d, use_tensor_cores=tc, kv_itemsize=1)
                keys.append(DecodeKernelKey(cfg, q, kv, q, lse=True))
    for tc in (False, True):
        cfg = decode_config(4, 128, use_tensor_cores=tc)
        for name in ("rope", "alibi", "custom_mask", "sinks", "sigmoid", "rope_llama31"):
            keys.append(DecodeKernelKey(cfg, "bfloat16", "bfloat16", "bfloat16", render((lookup(name),))))
        chain = render((lookup("window"), lookup("soft_cap")))
        keys.append(DecodeKernelKey(cfg, "bfloat16", "bfloat16", "bfloat16", chain, lse=True))
        cfg8 = decode_config(4, 128, use_tensor_cores=tc, kv_itemsize=1)
        keys.append(DecodeKernelKey(cfg8, "bfloat16", "float8_e4m3fn", "bfloat16", chain, lse=True))
        keys.append(DecodeKernelKey(cfg8, "float16", "float8_e4m3fn", "float16", render((lookup("alibi"),))))
        for name in ("sinks", "sigmoid"):  # (the fp8 kernels take every variant but the key / value transforms)
            keys.append(DecodeKernelKey(cfg8, "bfloat16", "float8_e4m3fn", "bfloat16", render((lookup(name),))))
    return keys


def all_specs() -> list[KernelSpec]:
    return [decode_spec(k) for k in shipped_keys()]
