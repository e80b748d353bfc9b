"""Kernel specs and parameter structs of the attention-state merge kernels (kernel_src/attention/merge.cu)."""

from __future__ import annotations

import functools

from cuinfer.jit import KernelSpec, ParamStruct

MERGE_HEAD_DIMS = (64, 128, 256)
MERGE_DTYPES = {"float16": "half", "bfloat16": "__nv_bfloat16", "float32": "float"}
THREADS = 256
# Measured on the H200 (bench/lab/tune_merge.py, M1 shape, fp16): unroll 4 at 4 blocks/SM (64 registers) 4070 GB/s;
# unroll 8 at 2 blocks/SM (93 registers) 3505 GB/s, at 3 blocks/SM 4011 GB/s; unroll 2 at 4 blocks/SM 3766 GB/s.
UNROLL = 4  # state slices loaded before use: 4 x 16 bytes in flight per thread (kept packed until used)
# merge_partials reads fp32 partials, two 16-byte loads per source for 16-bit outputs: unroll 4 spilled on sm_90a
# (64 registers, 8-byte stack frame), 2 does not, and plans rarely split a row more than a few ways.
UNROLL_PARTIALS = 2
MIN_BLOCKS = 4  # merge_states: launch bounds (256 threads, 4 blocks/SM) -> <= 64 registers, 1024 threads per SM

MergeTwoParams = ParamStruct(
    "MergeTwoParams",
    tuple((n, "ptr") for n in ("o_a", "lse_a", "o_b", "lse_b", "o", "lse", "mask"))
    + (("num_rows", "i32"), ("num_heads", "i32"))
    + tuple(
        (n, "i64")
        for n in (
            "o_a_s0", "o_a_s1", "o_b_s0", "o_b_s1", "o_s0", "o_s1",
            "lse_a_s0", "lse_a_s1", "lse_b_s0", "lse_b_s1", "lse_s0", "lse_s1",
        )
    ),
)  # fmt: skip

MergeStatesParams = ParamStruct(
    "MergeStatesParams",
    tuple((n, "ptr") for n in ("o_in", "lse_in", "o", "lse"))
    + (("num_rows", "i32"), ("num_heads", "i32"), ("num_states", "i32"))
    + tuple(
        (n, "i64")
        for n in (
            "o_in_s0",
            "o_in_s1",
            "o_in_s2",
            "lse_in_s0",
            "lse_in_s1",
            "lse_in_s2",
            "o_s0",
            "o_s1",
            "lse_s0",
            "lse_s1",
        )
    ),
)

MergePartialsParams = ParamStruct(
    "MergePartialsParams",
    tuple(
        (n, "ptr")
        for n in (
            "num_targets", "merge_indptr", "merge_src", "merge_dst_token", "merge_dst_head",
            "partial_o", "partial_lse", "o", "lse",
        )
    )
    + tuple((n, "i64") for n in ("o_s0", "o_s1", "lse_s0", "lse_s1")),
)  # fmt: skip

_PREAMBLE = "".join(s.c_decl() for s in (MergeTwoParams, MergeStatesParams, MergePartialsParams))


def instance(kernel: str, dtype: str, head_dim: int) -> str:
    ctype = MERGE_DTYPES[dtype]
    if kernel == "merge_two":
        return f"cuinfer::merge_two<{ctype}, {head_dim}, {THREADS}>"
    if kernel == "merge_states":
        return f"cuinfer::merge_states<{ctype}, {head_dim}, {THREADS}, {UNROLL}, {MIN_BLOCKS}>"
    return f"cuinfer::{kernel}<{ctype}, {head_dim}, {THREADS}, {UNROLL_PARTIALS}>"


@functools.cache
def merge_spec(dtype: str, head_dim: int) -> KernelSpec:
    """One module per (value dtype, head dim) holding the three merge kernels."""
    exprs = tuple(instance(k, dtype, head_dim) for k in ("merge_two", "merge_states", "merge_partials"))
    return KernelSpec(
        name=f"merge/{dtype}/d{head_dim}",
        source="attention/merge.cu",
        name_exprs=exprs,
        preamble=_PREAMBLE,
        sass_expect=(r"LDG\.E\..*128", r"STG\.E\.128", r"MUFU\.EX2"),  # 16-byte loads and stores; exp2 on the MUFU
    )


def all_specs() -> list[KernelSpec]:
    return [merge_spec(dt, d) for dt in MERGE_DTYPES for d in MERGE_HEAD_DIMS]
