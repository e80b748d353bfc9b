"""The host side of one prefill plan: option and index-array validation, the plan's facts (``PrefillPlan``), ragged
K/V views, and reference-path outputs. No GPU needed; ``cuinfer.prefill`` builds the wrapper on top of it."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.formats.kv import KV, check_aligned
from cuinfer.formats.paged import check_page_table
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.interop.dtypes import DType
from cuinfer.planner.tiles import kv_lens_from_pages
from cuinfer.planner.work import WorkPlan
from cuinfer.prefill_policy import check_head_dims, choose_tiles, query_tile
from cuinfer.prefill_specs import MASK_CAUSAL, MASK_CUSTOM, MASK_WINDOW, PrefillKernelKey, TileConfig
from cuinfer.runtime.options import AttentionOptions, kv_layout_name
from cuinfer.runtime.options import check_options as check_attention_options
from cuinfer.runtime.options import half_dtype as _half_dtype
from cuinfer.runtime.outputs import host_outputs  # noqa: F401 (re-exported)

layout_name = kv_layout_name  # prefill.py imports it from here


def half_dtype(name: str, x: Any) -> DType:
    return _half_dtype(name, x, what="the prefill kernel")


# ---- the facts of one plan --------------------------------------------------------------------------------------


@dataclass
class PrefillPlan:
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
    work: WorkPlan | None = None
    words: np.ndarray | None = None
    words_used: int = 0
    offsets: dict | None = None
    device_id: int | None = None
    uploaded_on: int | None = None
    qo_lens: np.ndarray | None = None  # qo_indptr[b+1] - qo_indptr[b]
    qo_range: tuple[int, int] = (0, 0)  # (min, max) of qo_lens
    kv_range: tuple[int, int] = (0, 0)  # (min, max) of kv_lens
    static: tuple | None = None  # the memoised facts of plan()'s arguments this plan was made from
    n_pages: int = 0  # page-table entries in use (kv_indptr[-1]); 0 for ragged K/V
    compact_groups: int = 0  # G when the plan buffer holds the compact form (planner.layout.pack_compact), else 0

    @property
    def nnz_qo(self) -> int:
        return int(self.qo_indptr[-1])

    def key(self, paged: bool) -> PrefillKernelKey:
        o = self.options
        mask = (MASK_CAUSAL if o.causal else 0) | (MASK_WINDOW if o.window_left >= 0 else 0)
        mask |= MASK_CUSTOM if self.mask_bytes is not None else 0
        return PrefillKernelKey(
            self.q_dtype.value, self.o_dtype.value, self.head_dim, self.head_dim_vo, self.config, paged, mask,
            soft_cap=o.logits_soft_cap > 0, alibi=o.pos_encoding == "alibi",
        )  # fmt: skip


def check_options(
    causal, sm_scale, logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant, head_dim
) -> AttentionOptions:
    o = check_attention_options(
        what="prefill", causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
        pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, variant=variant, head_dim=head_dim,
        builtin_hint="causal, custom_mask, sm_scale, logits_soft_cap, window_left, pos_encoding='alibi'",
    )  # fmt: skip
    if o.pos_encoding == "rope_llama":
        raise NotImplementedError(
            "pos_encoding='rope_llama' is not implemented in the prefill kernel yet; rotate q and k first with "
            "cuinfer.apply_rope(...) and plan with pos_encoding='none'"
        )
    return o


def positive(name: str, v: Any) -> int:
    if isinstance(v, bool) or int(v) != v or v < 1:
        raise ValueError(f"{name} must be a positive integer but is {v!r}")
    return int(v)


def custom_mask_bytes(custom_mask, packed_custom_mask, qo_lens: np.ndarray, kv_lens: np.ndarray):
    """(packed bytes, byte indptr) of a batch mask, or (None, None). The flat bool form is packed here."""
    if custom_mask is None and packed_custom_mask is None:
        return None, None
    if custom_mask is not None and packed_custom_mask is not None:
        raise ValueError(
            "custom_mask and packed_custom_mask were both given; pass one (packed_custom_mask is "
            "segment_packbits(custom_mask, ...) with bitorder='little')"
        )
    bits = qo_lens.astype(np.int64) * kv_lens.astype(np.int64)
    indptr = np.zeros(bits.shape[0] + 1, dtype=np.int64)
    np.cumsum((bits + 7) // 8, out=indptr[1:])
    if custom_mask is not None:
        m = np.asarray(host_array(custom_mask, "custom_mask")).astype(bool).reshape(-1)
        if m.shape[0] != int(bits.sum()):
            raise ValueError(
                f"custom_mask must hold sum(qo_len * kv_len) = {int(bits.sum())} entries (each request's row-major "
                f"[qo_len, kv_len] block, concatenated) but has {m.shape[0]}"
            )
        bit_indptr = np.zeros(bits.shape[0] + 1, dtype=np.int64)
        np.cumsum(bits, out=bit_indptr[1:])
        packed, _ = reference.segment_packbits(m, bit_indptr, bitorder="little")
    else:
        packed = np.asarray(host_array(packed_custom_mask, "packed_custom_mask"))
        if packed.ndim != 1 or packed.dtype != np.uint8 or packed.shape[0] != int(indptr[-1]):
            raise ValueError(
                f"packed_custom_mask must be 1-D uint8 with {int(indptr[-1])} bytes (each request's bits padded to a "
                f"byte, as segment_packbits(..., bitorder='little') returns) but has shape {packed.shape}, dtype "
                f"{packed.dtype}"
            )
    if indptr[-1] > np.iinfo(np.int32).max // 8:
        raise ValueError(f"custom masks above {np.iinfo(np.int32).max // 8} bytes are not supported")
    return np.ascontiguousarray(packed, dtype=np.uint8), indptr.astype(np.int32)


def parse_tile_sizes(tile_sizes) -> tuple[int | None, int | None, int, int | None]:
    """``None`` (policy) or ``(query_tile[, kv_tile[, stages[, groups]]])``; a None entry leaves that choice to the
    policy (``groups``: CTAs per block, 2 = paired blocks)."""
    if tile_sizes is None:
        return None, None, 2, None
    t = tuple(tile_sizes)
    if not 1 <= len(t) <= 4:
        raise ValueError(f"tile_sizes must be (query_tile, kv_tile[, stages[, groups]]) but is {tile_sizes!r}")
    t = t + (None,) * (4 - len(t))
    return t[0], t[1], 2 if t[2] is None else int(t[2]), None if t[3] is None else int(t[3])


def host_array(x: Any, name: str) -> np.ndarray:
    """A mask given as NumPy, list, host tensor or device array (one device-to-host copy) -> NumPy."""
    if isinstance(x, (np.ndarray, list, tuple)):
        return np.asarray(x)
    t = as_tensor(x, name)
    if not t.is_cuda:
        return t.numpy()
    if t.framework == "torch":
        return x.detach().cpu().numpy()
    if t.framework == "cupy":
        return x.get()
    return np.asarray(x)


_STATIC = (
    "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "causal", "head_dim_vo", "q_dtype", "kv_dtype",
    "o_dtype", "sm_scale", "logits_soft_cap", "window_left", "pos_encoding", "rope_scale", "rope_theta", "variant",
    "tile_sizes",
)  # fmt: skip
_I32 = np.dtype(np.int32)
_U32 = np.dtype(np.uint32)
_INT32_MAX = 2**31 - 1


def host_plan(
    paged: bool, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *, num_qo_heads, num_kv_heads, head_dim,
    page_size, causal, custom_mask, packed_custom_mask, head_dim_vo, q_dtype, kv_dtype, o_dtype, sm_scale,
    logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant, tile_sizes, limits,
    max_batch_size: int | None = None, fixed_config: TileConfig | None = None, memo: dict | None = None,
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
    static: tuple, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, custom_mask=None, packed_custom_mask=None,
    max_batch_size: int | None = None, fixed_config: TileConfig | None = None, memo: dict | None = None,
) -> PrefillPlan:  # fmt: skip
    """``host_plan`` with the arguments other than index arrays and masks already in one tuple, ``(paged, num_qo_heads,
    ..., tile_sizes, limits)`` in ``host_plan``'s order (``BatchPrefill.plan`` builds it directly: a call with two
    dozen keywords costs microseconds)."""
    facts = _facts(static, memo)
    paged = static[0]
    hq, hkv, ps = facts[0], facts[1], facts[4]
    arrays = _index_arrays_fast(paged, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, ps)
    if arrays is None:
        arrays = _index_arrays(paged, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, ps)
    qo, kvi, indices, last, qo_lens, kv_lens, max_page, qo_range, kv_range, n_pages = arrays
    batch = len(qo) - 1
    mask_bytes, mask_indptr = None, None
    if custom_mask is not None or packed_custom_mask is not None:
        mask_bytes, mask_indptr = custom_mask_bytes(custom_mask, packed_custom_mask, qo_lens, kv_lens)
    if max_batch_size is not None and batch > max_batch_size:
        raise ValueError(
            f"the plan has {batch} requests but the wrapper was built with max_batch_size={max_batch_size} "
            "for CUDA graphs; build it with a larger max_batch_size"
        )
    if fixed_config is not None:
        config = fixed_config
    else:
        config = _tiles_for(facts, qo.item(-1) * (hq // hkv) / max(batch, 1), paged, static[-1], memo is not None)
    # The dataclass __init__ with its 27 fields costs microseconds: the fields are set in a copy of the dict the
    # other arguments fix (facts[11], all fields in: no resize while the rest go in).
    fields = facts[11].copy()
    fields["batch"], fields["config"], fields["max_page"] = batch, config, max_page
    fields["qo_indptr"], fields["kv_indptr"], fields["kv_indices"], fields["kv_last_page_len"] = qo, kvi, indices, last
    fields["qo_lens"], fields["kv_lens"], fields["qo_range"], fields["kv_range"] = qo_lens, kv_lens, qo_range, kv_range
    fields["n_pages"] = n_pages
    if mask_bytes is not None:  # (else the defaults, None)
        fields["mask_bytes"], fields["mask_indptr"] = mask_bytes, mask_indptr
    plan = object.__new__(PrefillPlan)
    plan.__dict__ = fields
    return plan


_PLAN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PrefillPlan) if f.default is not dataclasses.MISSING}
_LAST = "last"  # memo key of the last (arguments, facts) pair: an identity-fast tuple comparison, no hashing


def _facts(static: tuple, memo: dict | None) -> tuple:
    """``_static_facts(*static)``, through the wrapper's memo when the arguments are hashable."""
    if memo is None:
        return _static_facts(*static)
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
        return _static_facts(*static)
    if facts is None:
        facts = memo[static] = _static_facts(*static)
    memo[_LAST] = (static, facts)
    return facts


def _static_facts(
    paged, num_qo_heads, num_kv_heads, head_dim, page_size, causal, head_dim_vo, q_dtype, kv_dtype, o_dtype, sm_scale,
    logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant, tile_sizes, limits,
) -> tuple:  # fmt: skip
    hq, hkv = positive("num_qo_heads", num_qo_heads), positive("num_kv_heads", num_kv_heads)
    d = positive("head_dim", head_dim)
    dvo = d if head_dim_vo is None else positive("head_dim_vo", head_dim_vo)
    check_head_dims(d, dvo)
    if hq % hkv:
        raise ValueError(
            f"num_qo_heads ({hq}) must be a multiple of num_kv_heads ({hkv}) for grouped-query attention; "
            "query head h reads kv head h // (num_qo_heads // num_kv_heads)"
        )
    qd = half_dtype("q_dtype", q_dtype)
    kvd = half_dtype("kv_dtype", qd if kv_dtype is None else kv_dtype)
    od = half_dtype("o_dtype", qd if o_dtype is None else o_dtype)
    if kvd is not qd:
        raise ValueError(
            f"the prefill kernel multiplies q and K/V of one 16-bit type but q_dtype={qd.value}, kv_dtype="
            f"{kvd.value}; cast one of them"
        )
    opts = check_options(
        causal, sm_scale, logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant, d
    )
    ps = positive("page_size", page_size) if paged else 1
    tq, tkv, stages, groups = parse_tile_sizes(tile_sizes)
    # then: tile configs by query tile, the PrefillPlan fields these arguments fix (with every other field present,
    # see plan_of), and the largest query tile (query_tile of any longer average)
    fields = {f.name: _PLAN_DEFAULTS.get(f.name) for f in dataclasses.fields(PrefillPlan)}
    facts = (hq, hkv, d, dvo, ps, qd, kvd, od, opts, (tq, tkv, stages, groups), {}, fields, query_tile(math.inf, dvo))
    fields.update(
        num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_vo=dvo, page_size=ps, q_dtype=qd, kv_dtype=kvd,
        o_dtype=od, options=opts, static=facts,
    )  # fmt: skip
    return facts


def _tiles_for(facts: tuple, avg: float, paged: bool, limits, memo: bool) -> TileConfig:
    """``choose_tiles`` for this batch. The policy reads the average packed query length only through
    ``query_tile(avg, head_dim_vo)`` (or not at all when the query tile is forced), so that is the memo key (in the
    facts of the other arguments, ``facts[10]``)."""
    tq, cap = facts[9][0], facts[12]
    # (at or past the largest query tile, query_tile is that tile: the usual prefill batch skips the policy's loop)
    key = (cap if avg >= cap else query_tile(avg, facts[3])) if tq is None else None
    configs = facts[10]
    config = configs.get(key) if memo else None
    if config is None:
        d, dvo, opts, (tq, tkv, stages, groups) = facts[2], facts[3], facts[8], facts[9]
        config = choose_tiles(
            avg, d, dvo, paged=paged, limits=limits, tile_q=tq, tile_kv=tkv, stages=stages, groups=groups,
            variant=opts.logits_soft_cap > 0 or opts.pos_encoding == "alibi",
        )  # fmt: skip
        if memo:
            configs[key] = config
    return config


def _index_arrays(paged: bool, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, ps: int) -> tuple:
    """The validators' path: ``(qo_indptr, kv_indptr, kv_indices, last, qo_lens, kv_lens, max_page, qo_range,
    kv_range, n_pages)``, raising the error that names the argument."""
    qo = validate.check_indptr("qo_indptr", qo_indptr)
    batch = qo.shape[0] - 1
    hint = f"one entry per request plus the leading 0, like qo_indptr ({qo.shape[0]} entries)"
    if paged:
        kvi = validate.check_indptr("kv_indptr", kv_indptr, length=qo.shape[0], hint=hint)
        if kv_indices is None or kv_last_page_len is None:
            raise ValueError(
                "a paged BatchPrefill needs kv_indices and kv_last_page_len in plan(); pass the page table (or "
                "build BatchPrefill(paged=False) for ragged k/v)"
            )
        indices, last, pages = check_page_table(kvi, kv_indices, kv_last_page_len, ps)
        kv_lens = kv_lens_from_pages(kvi, last, ps).astype(np.int32)
        used = indices[: int(kvi[-1])]
        max_page = int(used.max()) if used.size else -1
    else:
        kvi = validate.check_indptr("kv_indptr", kv_indptr, length=qo.shape[0], hint=hint)
        indices = last = None
        kv_lens = np.diff(kvi).astype(np.int32)
        max_page = -1
    qo_lens = np.diff(qo)
    ranges = [(int(a.min()), int(a.max())) if batch else (0, 0) for a in (qo_lens, kv_lens)]
    n_pages = int(kvi[-1]) if paged else 0
    return qo, kvi, indices, last, qo_lens, kv_lens, max_page, ranges[0], ranges[1], n_pages


def _index_arrays_fast(paged: bool, qo, kvi, indices, last, ps: int) -> tuple | None:
    """``_index_arrays`` for 1-D NumPy int32 inputs in one reduction over the rows ``[qo_lens, kv_lens, lp, -qo_lens,
    -kv_lens, -lp]`` (``lp = last - page_size``, see ``read_page_table_fast``), or None: the validators' path
    then runs and names whatever is wrong. The rows lie end to end in one buffer: ``reduceat`` takes their maxima in
    two thirds of the instructions of a 2-D reduction, and scalars are read with ``item`` (no NumPy scalar)."""
    nd = np.ndarray
    if type(qo) is not nd or type(kvi) is not nd or qo.dtype is not _I32 or kvi.dtype is not _I32:
        return None
    if paged and (type(indices) is not nd or type(last) is not nd or indices.dtype is not _I32
                  or last.dtype is not _I32 or indices.ndim != 1 or last.ndim != 1):  # fmt: skip
        return None
    if qo.ndim != 1 or kvi.ndim != 1:
        return None
    batch = len(qo) - 1
    if batch < 1 or len(kvi) != batch + 1 or qo.item(0) or kvi.item(0):
        return None
    r = 3 if paged else 2
    half = r * batch
    rows = np.empty(2 * half, _I32)
    qo_lens, kv_lens = rows[:batch], rows[batch : 2 * batch]
    np.subtract(qo[1:], qo[:-1], out=qo_lens)
    np.subtract(kvi[1:], kvi[:-1], out=kv_lens)
    max_page = -1
    if paged:
        nnz = kvi.item(-1)
        if last.shape[0] != batch or indices.shape[0] < nnz:
            return None
        c = _const32(ps)
        lp = np.subtract(last, c, out=rows[2 * batch : half])
        np.multiply(kv_lens, c, out=kv_lens)
        kv_lens += lp
        if nnz:
            used = indices if indices.shape[0] == nnz else indices[:nnz]
            max_page = int(np.maximum.reduce(used.view(_U32)))
            if max_page > _INT32_MAX:
                return None
    np.negative(rows[:half], out=rows[half:])
    kept = _ROW_STARTS[paged]
    starts = kept.get(batch)
    if starts is None:
        if len(kept) >= 64:
            kept.clear()
        starts = kept[batch] = np.arange(0, 2 * half, batch)
        starts.flags.writeable = False
    hi = np.maximum.reduceat(rows, starts).tolist()
    qo_hi, kv_hi, qo_lo, kv_lo = hi[0], hi[1], -hi[r], -hi[r + 1]
    if qo_lo < 0:
        return None
    if paged:
        lp_hi, lp_lo = hi[2], -hi[r + 2]
        if lp_hi > 0 or lp_lo <= -ps or kv_lo <= -ps:
            return None
        if kv_lo < 0:  # requests without pages have length 0
            np.maximum(kv_lens, 0, out=kv_lens)
            kv_lo = 0
        return qo, kvi, indices, last, qo_lens, kv_lens, max_page, (qo_lo, qo_hi), (kv_lo, kv_hi), nnz
    if kv_lo < 0:
        return None
    return qo, kvi, None, None, qo_lens, kv_lens, -1, (qo_lo, qo_hi), (kv_lo, kv_hi), 0


# paged -> {batch: the first word of each row of _index_arrays_fast's buffer} (for reduceat)
_ROW_STARTS: dict = {False: {}, True: {}}


@functools.lru_cache(maxsize=64)
def _const32(v: int) -> np.ndarray:
    """A 0-d int32 operand (NumPy calls with a Python scalar cost about twice as much on small arrays)."""
    c = np.array(v, dtype=np.int32)
    c.flags.writeable = False
    return c


def check_ragged_shapes(ks: tuple, vs: tuple, plan: PrefillPlan, layout: str) -> None:
    nnz = int(plan.kv_indptr[-1])
    expect_k = (nnz, plan.num_kv_heads, plan.head_dim) if layout == "NHD" else (plan.num_kv_heads, nnz, plan.head_dim)
    expect_v = expect_k[:2] + (plan.head_dim_vo,)
    desc = "[nnz_kv, num_kv_heads, head_dim]" if layout == "NHD" else "[num_kv_heads, nnz_kv, head_dim]"
    for name, got, want in (("k", tuple(ks), expect_k), ("v", tuple(vs), expect_v)):
        if len(got) != 3:
            raise ValueError(f"{name} must be 3-D {desc} ({layout}) but has shape {got}")
        rows = got[0] if layout == "NHD" else got[1]
        if rows != nnz:
            raise ValueError(
                f"{name} has {rows} tokens but kv_indptr[-1] = {nnz}; {name} holds the KV tokens of every request, "
                "request b in rows kv_indptr[b]:kv_indptr[b+1]"
            )
        if got != want:
            raise ValueError(
                f"{name} must have shape {want} ({layout} {desc}) but has shape {got}; plan() was made for "
                f"num_kv_heads={plan.num_kv_heads}, head_dim={plan.head_dim}, head_dim_vo={plan.head_dim_vo}"
            )


def ragged_kv(tk: Tensor, tv: Tensor, layout: str, plan: PrefillPlan) -> KV:
    check_ragged_shapes(tk.shape, tv.shape, plan, layout)
    validate.check_same_dtype(("k", "v"), (tk, tv))
    nhd = layout == "NHD"
    for name, t in (("k", tk), ("v", tv)):
        check_aligned(name, t, (0, 1))
    tok, head = (0, 1) if nhd else (1, 0)
    ks = (0, tk.strides[tok], tk.strides[head])
    vs = (0, tv.strides[tok], tv.strides[head])
    return KV(tk, tv, tk.ptr, tv.ptr, ks, vs, 1, 1, plan.num_kv_heads, plan.head_dim)
