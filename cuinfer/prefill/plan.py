"""The host side of one prefill plan: what plan()'s arguments fix (``PrefillStatic``, checked once per distinct set and
memoised per wrapper) and the plan itself (``PrefillPlan``: those facts, the index arrays, the tiles of this batch, the
work plan). No GPU needed; ``cuinfer.prefill.wrapper`` builds the wrapper on top of it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.formats.mask import custom_mask_bytes
from cuinfer.interop.dtypes import DType
from cuinfer.prefill.index import read_index_arrays
from cuinfer.prefill.policy import DeviceLimits, check_head_dims, choose_tiles, query_tile
from cuinfer.prefill.specs import PrefillKernelKey
from cuinfer.prefill.tiles import TileConfig
from cuinfer.runtime.fp8 import kv_dtype_of
from cuinfer.runtime.options import AttentionOptions, check_int, check_options, check_window_left, half_dtype
from cuinfer.runtime.wrapper import PlanState
from cuinfer.variants import Rendered
from cuinfer.variants.select import chain_for, user_variants

# plan()'s arguments other than the index arrays and masks, in the order of the memo key BatchPrefill.plan builds
STATIC_ARGS = (
    "paged", "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "causal", "head_dim_vo", "q_dtype", "kv_dtype",
    "o_dtype", "sm_scale", "logits_soft_cap", "window_left", "pos_encoding", "rope_scale", "rope_theta", "variant",
    "tile_sizes", "limits",
)  # fmt: skip


def prefill_half_dtype(name: str, x: Any) -> DType:
    return half_dtype(name, x, what="the prefill kernel")


# ---- the facts of one plan --------------------------------------------------------------------------------------


@dataclass
class PrefillPlan(PlanState):
    batch: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_vo: int
    page_size: int
    q_dtype: DType
    kv_dtype: DType
    o_dtype: DType
    options: AttentionOptions
    config: TileConfig
    qo_indptr: np.ndarray
    kv_indptr: np.ndarray  # ragged: token offsets; paged: page offsets
    kv_indices: np.ndarray | None  # paged only
    kv_last_page_len: np.ndarray | None  # paged only
    kv_lens: np.ndarray
    max_page: int
    mask_bytes: np.ndarray | None  # packed custom mask (little-endian bits per request segment)
    mask_indptr: np.ndarray | None  # byte offset of each request's segment
    qo_lens: np.ndarray | None = None  # qo_indptr[b+1] - qo_indptr[b]
    qo_range: tuple[int, int] = (0, 0)  # (min, max) of qo_lens
    kv_range: tuple[int, int] = (0, 0)  # (min, max) of kv_lens
    static: PrefillStatic | None = None  # the memoised facts of plan()'s arguments this plan was made from
    n_pages: int = 0  # page-table entries in use (kv_indptr[-1]); 0 for ragged K/V
    compact_groups: int = 0  # G when the plan buffer holds the compact form (planner.compact.pack_compact), else 0
    variant_values: dict | None = None  # parameters of the user's variants (variant_params=), checked
    backend: str = "fa2"  # the kernel that runs it: "fa2" or "sm90" (BatchPrefill's backend, "auto" resolved per plan)

    @property
    def nnz_qo(self) -> int:
        return int(self.qo_indptr[-1])

    @property
    def variant(self) -> Rendered:
        """The chain of variants the kernel runs: the built-ins of the options (a custom mask when one was given),
        then the user's."""
        static = self.static
        return static.chain_masked if self.mask_bytes is not None else static.chain

    def key(self, paged: bool) -> PrefillKernelKey:
        kv = self.kv_dtype.value if self.kv_dtype.is_float8 else ""
        return PrefillKernelKey(
            self.q_dtype.value,
            self.o_dtype.value,
            self.head_dim,
            self.head_dim_vo,
            self.config,
            paged,
            self.variant,
            kv,
        )


@dataclass(frozen=True, eq=False)
class TileRequest:
    """``tile_sizes=(query_tile[, kv_tile[, stages[, groups]]])`` of plan(); None leaves a choice to the policy."""

    tile_q: int | None = None
    tile_kv: int | None = None
    stages: int | None = None  # None: the policy's (2; fp8 K/V: 2 or 3)
    groups: int | None = None  # CTAs per block, 2 = paired blocks
    convert: bool | None = None  # fp8 K/V: the CTA converts whole tiles (TileConfig.kv_convert); None: the policy's


@dataclass(frozen=True, eq=False)
class PrefillStatic:
    """What plan()'s arguments other than the index arrays and masks fix, checked once per distinct set (a serving
    loop plans every batch with the same heads, dtypes and options)."""

    paged: bool
    limits: DeviceLimits
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_vo: int
    page_size: int  # 1 for ragged K/V
    options: AttentionOptions
    tiles: TileRequest
    max_query_tile: int  # query_tile() of any average at or past it
    configs: dict  # tile configurations by query tile (``tiles_for``'s memo)
    chain: Rendered  # the variants of a plan without a custom mask
    chain_masked: Rendered  # ... and with one
    fields: dict  # the PrefillPlan fields these fix, every other field present at its default (copied by each plan)


def check_prefill_options(
    *, causal: Any, sm_scale: Any, logits_soft_cap: Any, window_left: Any, pos_encoding: Any, rope_scale: Any,
    rope_theta: Any, variant: Any, head_dim: int,
) -> AttentionOptions:  # fmt: skip
    o = check_options(
        what="prefill", causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
        pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, variant=variant, head_dim=head_dim,
        builtin_hint="causal, custom_mask, sm_scale, logits_soft_cap, window_left, pos_encoding='alibi'",
    )  # fmt: skip
    return o


def refuse_transforms(kv_dtype: DType, chain: Rendered) -> Rendered:
    from cuinfer.decode.plan import refuse_fp8_transforms

    refuse_fp8_transforms(kv_dtype, chain)
    return chain


def positive(name: str, v: Any) -> int:
    return check_int(name, v)


def check_counts(static: tuple) -> None:
    """The counts among ``static`` (``STATIC_ARGS``) are integers (NumPy integers too), never floats or bools."""
    for i in (1, 2, 3, 4):
        check_int(STATIC_ARGS[i], static[i])
    if static[6] is not None:
        check_int("head_dim_vo", static[6])
    check_window_left(static[12])


def parse_tile_sizes(tile_sizes: Any) -> TileRequest:
    """``None`` (policy) or ``(query_tile[, kv_tile[, stages[, groups[, convert]]]])``; a None entry leaves that choice
    to the policy (``groups``: CTAs per block, 2 = paired blocks; ``convert``: fp8 K/V converted by the CTA a tile at a
    time, True, or by each warp a fragment at a time, False)."""
    if tile_sizes is None:
        return TileRequest()
    t = tuple(tile_sizes)
    if not 1 <= len(t) <= 5:
        raise ValueError(
            f"tile_sizes must be (query_tile, kv_tile[, stages[, groups[, convert]]]) but is {tile_sizes!r}"
        )
    t = t + (None,) * (5 - len(t))
    names = ("query_tile", "kv_tile", "stages", "groups")
    n = tuple(None if x is None else check_int(f"tile_sizes ({k})", x) for k, x in zip(names, t[:4], strict=True))
    if t[4] is not None and not isinstance(t[4], (bool, np.bool_)):
        raise ValueError(
            f"tile_sizes must be (query_tile, kv_tile[, stages[, groups[, convert]]]) with convert True or False "
            f"(fp8 K/V) but is {tile_sizes!r}"
        )
    return TileRequest(n[0], n[1], n[2], n[3], None if t[4] is None else bool(t[4]))


def host_plan(
    paged: bool, qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, *, num_qo_heads: Any,
    num_kv_heads: Any, head_dim: Any, page_size: Any, causal: Any, custom_mask: Any, packed_custom_mask: Any,
    head_dim_vo: Any, q_dtype: Any, kv_dtype: Any, o_dtype: Any, sm_scale: Any, logits_soft_cap: Any,
    window_left: Any, pos_encoding: Any, rope_scale: Any, rope_theta: Any, variant: Any, tile_sizes: Any,
    limits: DeviceLimits, max_batch_size: int | None = None, fixed_config: TileConfig | None = None,
    memo: dict | None = None,
) -> PrefillPlan:  # fmt: skip
    """Validate everything ``plan()`` receives and gather the facts of one plan (no GPU needed).

    ``max_batch_size`` (CUDA-graph mode) bounds the batch; ``fixed_config`` (CUDA-graph mode after the first plan)
    replaces the tile policy. ``memo`` (a wrapper's dict) keeps what depends on the arguments other than the index
    arrays and masks (plan() runs every batch with the same heads, dtypes and options).
    """
    static = (
        paged, num_qo_heads, num_kv_heads, head_dim, page_size, causal, head_dim_vo, q_dtype, kv_dtype, o_dtype,
        sm_scale, logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant, tile_sizes, limits,
    )  # fmt: skip
    return plan_of(static, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, custom_mask, packed_custom_mask,
                   max_batch_size, fixed_config, memo)  # fmt: skip


def plan_of(
    static: tuple, qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, custom_mask: Any = None,
    packed_custom_mask: Any = None, max_batch_size: int | None = None, fixed_config: TileConfig | None = None,
    memo: dict | None = None,
) -> PrefillPlan:  # fmt: skip
    """``host_plan`` with the arguments other than index arrays and masks already in one tuple, the values named in
    ``STATIC_ARGS`` (``BatchPrefill.plan`` builds it directly: a call with two dozen keywords costs microseconds)."""
    if not type(static[1]) is type(static[2]) is type(static[3]) is type(static[4]) is type(static[12]) is int or (
        static[6] is not None and type(static[6]) is not int
    ):  # (8.0 == 8 and True == 1 hash alike: the memo would take them for the ints it was made for)
        check_counts(static)
    facts = static_facts_of(static, memo)
    # The dataclass __init__ with its 27 fields costs microseconds: the fields are set in a copy of the dict the
    # other arguments fix (all fields in: no resize while the rest go in).
    fields = facts.fields.copy()
    read_index_arrays(fields, facts.paged, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, facts.page_size)
    qo = fields["qo_indptr"]
    batch = len(qo) - 1
    if custom_mask is not None or packed_custom_mask is not None:  # (else the defaults, None)
        fields["mask_bytes"], fields["mask_indptr"] = custom_mask_bytes(
            custom_mask, packed_custom_mask, fields["qo_lens"], fields["kv_lens"]
        )
    if max_batch_size is not None and batch > max_batch_size:
        raise ValueError(
            f"the plan has {batch} requests but the wrapper was built with max_batch_size={max_batch_size} "
            "for CUDA graphs; build it with a larger max_batch_size"
        )
    nnz_qo = qo.item(-1)
    if fixed_config is not None:
        config = fixed_config
    else:
        avg = nnz_qo * (facts.num_qo_heads // facts.num_kv_heads) / max(batch, 1)
        config = tiles_for(facts, avg, memo is not None, fields["mask_bytes"] is not None)
    fields["batch"], fields["config"] = batch, config
    fields["out_shape"] = (nnz_qo, facts.num_qo_heads, facts.head_dim_vo)
    plan = object.__new__(PrefillPlan)
    plan.__dict__ = fields
    return plan


_PLAN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PrefillPlan) if f.default is not dataclasses.MISSING}
_LAST = "last"  # memo key of the last (arguments, facts) pair: an identity-fast tuple comparison, no hashing


def static_facts_of(static: tuple, memo: dict | None) -> PrefillStatic:
    """``static_facts(*static)``, through the wrapper's memo when the arguments are hashable."""
    if memo is None:
        return static_facts(*static)
    last = memo.get(_LAST)
    if last is not None:
        try:
            if last[0] == static:  # (the same objects as last time: compared by identity)
                return last[1]
        except ValueError:  # an array among the arguments: its truth value is ambiguous
            pass
    try:
        facts = memo.get(static)
    except TypeError:  # an unhashable argument (a list of tile sizes, say): no memo
        return static_facts(*static)
    if facts is None:
        facts = memo[static] = static_facts(*static)
    memo[_LAST] = (static, facts)
    return facts


def static_facts(
    paged: bool, num_qo_heads: Any, num_kv_heads: Any, head_dim: Any, page_size: Any, causal: Any, head_dim_vo: Any,
    q_dtype: Any, kv_dtype: Any, o_dtype: Any, sm_scale: Any, logits_soft_cap: Any, window_left: Any,
    pos_encoding: Any, rope_scale: Any, rope_theta: Any, variant: Any, tile_sizes: Any, limits: DeviceLimits,
) -> PrefillStatic:  # fmt: skip
    """Check plan()'s arguments other than the index arrays and masks (``STATIC_ARGS``) and gather what they fix."""
    hq, hkv = positive("num_qo_heads", num_qo_heads), positive("num_kv_heads", num_kv_heads)
    d = positive("head_dim", head_dim)
    dvo = d if head_dim_vo is None else positive("head_dim_vo", head_dim_vo)
    kvd = prefill_half_dtype("q_dtype", q_dtype) if kv_dtype is None else kv_dtype_of(kv_dtype)
    check_head_dims(d, dvo, kvd.itemsize)
    if hq % hkv:
        raise ValueError(
            f"num_qo_heads ({hq}) must be a multiple of num_kv_heads ({hkv}) for grouped-query attention; "
            "query head h reads kv head h // (num_qo_heads // num_kv_heads)"
        )
    qd = prefill_half_dtype("q_dtype", q_dtype)
    od = prefill_half_dtype("o_dtype", qd if o_dtype is None else o_dtype)
    if kvd is not qd and not kvd.is_float8:
        raise ValueError(
            f"the prefill kernel multiplies q and K/V of one 16-bit type (or fp8 K/V converted to q's) but q_dtype="
            f"{qd.value}, kv_dtype={kvd.value}; cast one of them"
        )
    opts = check_prefill_options(
        causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
        pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, variant=variant, head_dim=d,
    )  # fmt: skip
    ps = positive("page_size", page_size) if paged else 1
    tiles = parse_tile_sizes(tile_sizes)
    # the PrefillPlan fields these arguments fix, with every other field present (see plan_of)
    fields = {f.name: _PLAN_DEFAULTS.get(f.name) for f in dataclasses.fields(PrefillPlan)}
    users = user_variants(variant)
    facts = PrefillStatic(
        paged=paged, limits=limits, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_vo=dvo, page_size=ps,
        options=opts, tiles=tiles, max_query_tile=query_tile(math.inf, dvo), configs={},
        chain=refuse_transforms(kvd, chain_for(opts, decode=False, user=users)),
        chain_masked=chain_for(opts, decode=False, custom_mask_given=True, user=users), fields=fields,
    )  # fmt: skip
    fields.update(
        num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_vo=dvo, page_size=ps, q_dtype=qd, kv_dtype=kvd,
        o_dtype=od, options=opts, static=facts, partial_dim=dvo,
    )  # fmt: skip
    return facts


def tiles_for(facts: PrefillStatic, avg: float, memo: bool, masked: bool = False) -> TileConfig:
    """``choose_tiles`` for this batch (``masked``: with a custom mask, whose chain is ``facts.chain_masked``). The
    policy reads the average packed query length only through ``query_tile(avg, head_dim_vo)`` (or not at all when the
    query tile is forced), so that is the memo key (in the facts of the other arguments, ``facts.configs``)."""
    tiles, cap = facts.tiles, facts.max_query_tile
    # (at or past the largest query tile, query_tile is that tile: the usual prefill batch skips the policy's loop)
    key = (cap if avg >= cap else query_tile(avg, facts.head_dim_vo)) if tiles.tile_q is None else None
    chain = facts.chain_masked if masked else facts.chain
    if masked:
        key = (key, True)  # (the masked chain may take other tiles: never wide_logits)
    configs = facts.configs
    config = configs.get(key) if memo else None
    if config is None:
        config = choose_tiles(
            avg, facts.head_dim, facts.head_dim_vo, paged=facts.paged, limits=facts.limits, tile_q=tiles.tile_q,
            tile_kv=tiles.tile_kv, stages=tiles.stages, groups=tiles.groups, variant=chain.register_heavy,
            kv_itemsize=facts.fields["kv_dtype"].itemsize, kv_convert=tiles.convert, wide_logits=chain.wide_logits,
        )  # fmt: skip
        if memo:
            configs[key] = config
    return config
