"""The host side of one decode plan: the facts plan()'s arguments fix (``DecodeStatic``, memoised per wrapper) and the
plan itself (``DecodePlan``: those facts, the page table read from the caller's index arrays, the work plan). No GPU
needed; ``cuinfer.decode.wrapper`` builds the wrapper on top of it (as ``cuinfer.prefill.plan`` does for prefill)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.decode.policy import DecodeConfig, decode_config
from cuinfer.decode.specs import DecodeKernelKey
from cuinfer.formats.mask import custom_mask_bytes
from cuinfer.formats.paged import read_page_table
from cuinfer.interop.dtypes import DType
from cuinfer.runtime.fp8 import kv_dtype_of
from cuinfer.runtime.options import AttentionOptions, check_int, check_options, check_window_left, half_dtype
from cuinfer.runtime.wrapper import PlanState
from cuinfer.variants import Rendered
from cuinfer.variants.select import chain_for, user_variants

# plan()'s arguments that do not depend on the page table, in order (memoised per wrapper).
STATIC_ARGS = (
    "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "q_dtype", "kv_dtype", "o_dtype", "sm_scale",
    "logits_soft_cap", "window_left", "pos_encoding", "rope_scale", "rope_theta", "variant",
)  # fmt: skip


# ---- the facts of one plan --------------------------------------------------------------------------------------


@dataclass
class DecodePlan(PlanState):
    batch: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: DType
    kv_dtype: DType
    o_dtype: DType
    options: AttentionOptions
    config: DecodeConfig
    variant: Rendered  # the chain of variants the kernel runs (built-ins from the options, then the user's)
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    kv_last_page_len: np.ndarray
    kv_lens: np.ndarray
    max_page: int  # largest page index the plan reads, -1 when it reads none
    kv_range: tuple[int, int] = (0, 0)  # (min, max) of kv_lens
    nnz: int = 0  # page indices the plan reads (kv_indptr[-1])
    variant_values: dict | None = None  # parameters of the user's variants (variant_params=), checked
    mask_bytes: np.ndarray | None = None  # custom mask: each request's [1, kv_len] bits, packed little-endian
    mask_indptr: np.ndarray | None = None  # byte offset of each request's bits

    @classmethod
    def from_fields(cls, fields: dict) -> DecodePlan:
        """A plan from a dict holding every field (which the plan then owns): plan() builds one per step from the
        fields its static arguments fix (``DecodeStatic.fields``), cheaper than the 24-argument ``__init__``."""
        plan = object.__new__(cls)
        plan.__dict__ = fields
        return plan

    def key(self, lse: bool) -> DecodeKernelKey:
        return DecodeKernelKey(self.config, self.q_dtype.value, self.kv_dtype.value, self.o_dtype.value, self.variant,
                               lse=lse)  # fmt: skip


@dataclass(frozen=True, eq=False)
class DecodeStatic:
    """What plan()'s arguments other than the page table fix, checked once per distinct set (a serving loop plans
    every step with the same heads, dtypes and options): the plan fields they fix (heads, dtypes, options, kernel
    configuration; every other field at its default), copied by each plan, and what ``host_plan`` reads itself."""

    fields: dict
    page_size: int
    num_qo_heads: int
    head_dim: int
    chain_masked: Rendered  # the variant chain with a custom mask (fields["variant"]: without)


def check_decode_options(
    *, sm_scale: Any, logits_soft_cap: Any, window_left: Any, pos_encoding: Any, rope_scale: Any, rope_theta: Any,
    variant: Any, head_dim: int,
) -> AttentionOptions:  # fmt: skip
    return check_options(
        what="decode", causal=False, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
        pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, variant=variant, head_dim=head_dim,
        builtin_hint="sm_scale, logits_soft_cap, window_left, pos_encoding",
    )  # fmt: skip


def decode_half_dtype(name: str, x: Any) -> DType:
    return half_dtype(name, x, what="the decode kernels")


def refuse_fp8_transforms(kv_dtype: DType, chain: Rendered) -> None:
    """q / k transforms (RoPE in the kernel) rotate each K tile in shared memory, and value transforms rewrite each V
    tile there, which for an fp8 cache would round the transformed keys / values back to fp8: refused."""
    if not kv_dtype.is_float8:
        return
    if chain.transforms:
        raise NotImplementedError(
            f"in-kernel q / k transforms ({chain.name}: pos_encoding='rope_llama' or a variant with a key transform) "
            f"are not supported with an fp8 cache (kv_dtype={kv_dtype.value}): rotate the keys before quantising them "
            "(cuinfer.apply_rope / apply_rope_pos_ids) or use a 16-bit cache"
        )
    values = [p.name for p in chain.pieces if p.value_transform]
    if values:
        raise NotImplementedError(
            f"value transforms (variant {values[0]!r}) are not supported with an fp8 cache (kv_dtype="
            f"{kv_dtype.value}): the kernels would round the transformed values back to fp8; transform the values "
            "before quantising them, or use a 16-bit cache"
        )


_PLAN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DecodePlan) if f.default is not dataclasses.MISSING}
_PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(DecodePlan))


def static_facts(
    use_tensor_cores: bool | None, *, num_qo_heads: Any, num_kv_heads: Any, head_dim: Any, page_size: Any,
    q_dtype: Any, kv_dtype: Any, o_dtype: Any, sm_scale: Any, logits_soft_cap: Any, window_left: Any,
    pos_encoding: Any, rope_scale: Any, rope_theta: Any, variant: Any,
) -> DecodeStatic:  # fmt: skip
    """Check plan()'s arguments other than the page table and gather what they fix."""
    num_qo_heads, num_kv_heads = check_int("num_qo_heads", num_qo_heads), check_int("num_kv_heads", num_kv_heads)
    head_dim, page_size = check_int("head_dim", head_dim), check_int("page_size", page_size)
    if num_qo_heads % num_kv_heads:
        raise ValueError(
            f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) for grouped-query "
            f"attention; query head h reads kv head h // (num_qo_heads // num_kv_heads)"
        )
    group = num_qo_heads // num_kv_heads
    qd = decode_half_dtype("q_dtype", q_dtype)
    kvd = qd if kv_dtype is None else kv_dtype_of(kv_dtype)
    od = decode_half_dtype("o_dtype", qd if o_dtype is None else o_dtype)
    opts = check_decode_options(
        sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left, pos_encoding=pos_encoding,
        rope_scale=rope_scale, rope_theta=rope_theta, variant=variant, head_dim=head_dim,
    )  # fmt: skip
    tc = use_tensor_cores
    mixed = kvd is not qd and not kvd.is_float8  # (fp8 K/V are converted to q's type for the mma)
    if tc is None and mixed:
        tc = False  # the tensor-core kernel multiplies q and KV of one type
    if tc and mixed:
        raise ValueError(
            f"use_tensor_cores=True needs q_dtype == kv_dtype (mma takes one 16-bit type) but got q_dtype="
            f"{qd.value}, kv_dtype={kvd.value}; use use_tensor_cores=False or None"
        )
    config = decode_config(group, head_dim, use_tensor_cores=tc, kv_itemsize=kvd.itemsize)
    users = user_variants(variant)
    chain = chain_for(opts, decode=True, user=users)
    refuse_fp8_transforms(kvd, chain)
    # every field present (the defaults: work, words, ..., kv_range, nnz): no dict resize as a plan's go in
    fields = {name: _PLAN_DEFAULTS.get(name) for name in _PLAN_FIELDS}
    fields.update(
        num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size, q_dtype=qd,
        kv_dtype=kvd, o_dtype=od, options=opts, config=config, variant=chain, partial_dim=head_dim,
    )  # fmt: skip
    return DecodeStatic(fields, page_size, num_qo_heads, head_dim,
                        chain_for(opts, decode=True, custom_mask_given=True, user=users))  # fmt: skip


def check_counts(static: tuple) -> None:
    """The counts among ``static`` (``STATIC_ARGS``) are integers (NumPy integers too), never floats or bools."""
    for i in (0, 1, 2, 3):
        check_int(STATIC_ARGS[i], static[i])
    check_window_left(static[9])


def host_plan(
    static: tuple, memo: dict, use_tensor_cores: bool | None, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any,
    max_batch_size: int | None, custom_mask: Any = None, packed_custom_mask: Any = None,
) -> DecodePlan:  # fmt: skip
    """Validate and resolve the arguments of plan() (``static``: the values named in ``STATIC_ARGS``); what does not
    depend on the page table is memoised in ``memo`` (a wrapper's). ``max_batch_size`` (CUDA-graph mode) bounds the
    batch."""
    # (8.0 == 8 and True == 1 hash alike: the memo would take them for the ints it was made for)
    if not type(static[0]) is type(static[1]) is type(static[2]) is type(static[3]) is type(static[9]) is int:
        check_counts(static)
    try:
        facts, keep = memo.get(static), True
    except TypeError:  # an unhashable argument: no memo
        facts, keep = None, False
    if facts is None:
        facts = static_facts(use_tensor_cores, **dict(zip(STATIC_ARGS, static, strict=True)))
        if keep:
            memo[static] = facts
    fields = facts.fields.copy()
    read_page_table(fields, kv_indptr, kv_indices, kv_last_page_len, facts.page_size)
    batch = fields["kv_indptr"].shape[0] - 1
    if max_batch_size is not None and batch > max_batch_size:
        raise ValueError(
            f"the plan has {batch} requests but the wrapper was built with max_batch_size="
            f"{max_batch_size} for CUDA graphs; build it with a larger max_batch_size"
        )
    fields["batch"] = batch
    fields["out_shape"] = (batch, facts.num_qo_heads, facts.head_dim)
    if custom_mask is not None or packed_custom_mask is not None:
        # a decode query is one row: each request's mask is its [1, kv_len] block
        ones = np.ones(batch, dtype=np.int64)
        fields["mask_bytes"], fields["mask_indptr"] = custom_mask_bytes(
            custom_mask, packed_custom_mask, ones, fields["kv_lens"]
        )
        fields["variant"] = facts.chain_masked
    return DecodePlan.from_fields(fields)
