"""The host side of one prefill plan: option and index-array validation, the plan's facts (``PrefillPlan``), ragged
K/V views, and reference-path outputs. No GPU needed; ``cuinfer.prefill`` builds the wrapper on top of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.decode_io import KV, check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.interop.dtypes import DType, as_dtype
from cuinfer.planner.tiles import kv_lens_from_pages
from cuinfer.planner.work import WorkPlan
from cuinfer.prefill_policy import check_head_dims, choose_tiles
from cuinfer.prefill_specs import MASK_CAUSAL, MASK_CUSTOM, MASK_WINDOW, PrefillKernelKey, TileConfig

POS_ENCODINGS = ("none", "alibi", "rope_llama")


def layout_name(kv_layout: Any) -> str:
    name = getattr(kv_layout, "value", kv_layout)
    if isinstance(name, str) and name.upper() in ("NHD", "HND"):
        return name.upper()
    raise ValueError(f"kv_layout must be 'NHD' or 'HND' but is {kv_layout!r}")


def half_dtype(name: str, x: Any) -> DType:
    dt = as_dtype(x)
    if dt.is_float8:
        raise NotImplementedError(
            f"{name}={dt.value}: fp8 KV caches are not implemented in the prefill kernel yet; use float16 or bfloat16"
        )
    if dt not in (DType.FLOAT16, DType.BFLOAT16):
        raise ValueError(f"{name} must be float16 or bfloat16 but is {dt.value}")
    return dt


def host_outputs(o64: np.ndarray, lse64: np.ndarray, o_dtype: DType, out, lse, want_lse: bool):
    """Reference results in the dtypes the GPU path returns (o in o_dtype, lse float32), written into out / lse."""
    o = o64.astype(o_dtype.numpy)
    lse32 = lse64.astype(np.float32)
    if out is not None:
        out[...] = o
        o = out
    if lse is not None:
        lse[...] = lse32
        lse32 = lse
    return (o, lse32) if want_lse else o


# ---- the facts of one plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    causal: bool
    sm_scale: float
    logits_soft_cap: float
    window_left: int
    pos_encoding: str
    rope_scale: float
    rope_theta: float


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
    options: Options
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
) -> Options:
    if variant is not None:
        raise NotImplementedError(
            f"variant={variant!r}: user-defined attention variants are not implemented for prefill yet; use the "
            "built-in options (causal, custom_mask, sm_scale, logits_soft_cap, window_left, pos_encoding='alibi')"
        )
    pos = getattr(pos_encoding, "value", pos_encoding)
    pos = pos.lower() if isinstance(pos, str) else pos
    if pos not in POS_ENCODINGS:
        raise ValueError(f"pos_encoding must be one of {', '.join(POS_ENCODINGS)} but is {pos_encoding!r}")
    if pos == "rope_llama":
        raise NotImplementedError(
            "pos_encoding='rope_llama' is not implemented in the prefill kernel yet; rotate q and k first with "
            "cuinfer.apply_rope(...) and plan with pos_encoding='none'"
        )
    cap = float(logits_soft_cap or 0.0)
    if not cap >= 0 or not math.isfinite(cap):
        raise ValueError(f"logits_soft_cap must be >= 0 (0 disables it) but is {logits_soft_cap}")
    if int(window_left) != window_left or window_left < -1:
        raise ValueError(f"window_left must be an integer >= -1 (-1 disables the window) but is {window_left}")
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"sm_scale must be a finite number > 0 (default 1/sqrt(head_dim)) but is {sm_scale}")
    return Options(bool(causal), scale, cap, int(window_left), pos, float(rope_scale), float(rope_theta))


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


def parse_tile_sizes(tile_sizes) -> tuple[int | None, int | None, int]:
    """``None`` (policy) or ``(query_tile[, kv_tile[, stages]])``; a None entry leaves that choice to the policy."""
    if tile_sizes is None:
        return None, None, 2
    t = tuple(tile_sizes)
    if not 1 <= len(t) <= 3:
        raise ValueError(f"tile_sizes must be (query_tile, kv_tile[, stages]) but is {tile_sizes!r}")
    t = t + (None,) * (3 - len(t))
    return t[0], t[1], 2 if t[2] is None else int(t[2])


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


def host_plan(
paged: bool, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, *, num_qo_heads, num_kv_heads, head_dim,
    page_size, causal, custom_mask, packed_custom_mask, head_dim_vo, q_dtype, kv_dtype, o_dtype, sm_scale,
    logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant, tile_sizes, limits,
    max_batch_size: int | None = None, fixed_config: TileConfig | None = None,
) -> PrefillPlan:  # fmt: skip
    """Validate everything ``plan()`` receives and gather the facts of one plan (no GPU needed).

    ``max_batch_size`` (CUDA-graph mode) bounds the batch; ``fixed_config`` (CUDA-graph mode after the first plan)
    replaces the tile policy.
    """
    hq, hkv = positive("num_qo_heads", num_qo_heads), positive("num_kv_heads", num_kv_heads)
    d = positive("head_dim", head_dim)
    dvo = d if head_dim_vo is None else positive("head_dim_vo", head_dim_vo)
    check_head_dims(d, dvo)
    if hq % hkv:
        raise ValueError(
            f"num_qo_heads ({hq}) must be a multiple of num_kv_heads ({hkv}) for grouped-query attention; "
            "query head h reads kv head h // (num_qo_heads // num_kv_heads)"
        )
    g = hq // hkv
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
    qo = validate.check_indptr("qo_indptr", qo_indptr)
    batch = qo.shape[0] - 1
    hint = f"one entry per request plus the leading 0, like qo_indptr ({qo.shape[0]} entries)"
    if paged:
        ps = positive("page_size", page_size)
        kvi = validate.check_indptr("kv_indptr", kv_indptr, length=qo.shape[0], hint=hint)
        if kv_indices is None or kv_last_page_len is None:
            raise ValueError(
                "a paged BatchPrefill needs kv_indices and kv_last_page_len in plan(); pass the page table (or "
                "build BatchPrefill(paged=False) for ragged k/v)"
            )
        indices = validate.check_index_array("kv_indices", kv_indices, min_len=int(kvi[-1]))
        last = validate.check_index_array(
            "kv_last_page_len", kv_last_page_len, length=batch, hint="one entry per request (len(kv_indptr) - 1)"
        )
        pages = np.diff(kvi)
        bad = (pages > 0) & ((last < 1) | (last > ps))
        if np.any(bad):
            b = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"kv_last_page_len[{b}] must be in [1, page_size={ps}] for a request with pages but is "
                f"{int(last[b])}; it counts the tokens in the request's last page"
            )
        kv_lens = kv_lens_from_pages(kvi, last, ps).astype(np.int32)
        used = indices[: int(kvi[-1])]
        max_page = int(used.max()) if used.size else -1
    else:
        ps = 1
        kvi = validate.check_indptr("kv_indptr", kv_indptr, length=qo.shape[0], hint=hint)
        indices = last = None
        kv_lens = np.diff(kvi).astype(np.int32)
        max_page = -1
    qo_lens = np.diff(qo)
    mask_bytes, mask_indptr = custom_mask_bytes(custom_mask, packed_custom_mask, qo_lens, kv_lens)
    if max_batch_size is not None and batch > max_batch_size:
        raise ValueError(
            f"the plan has {batch} requests but the wrapper was built with max_batch_size={max_batch_size} "
            "for CUDA graphs; build it with a larger max_batch_size"
        )
    if fixed_config is not None:
        config = fixed_config
    else:
        avg = float(qo_lens.sum()) * g / max(batch, 1)
        tq, tkv, stages = parse_tile_sizes(tile_sizes)
        config = choose_tiles(
            avg, d, dvo, paged=paged, limits=limits, tile_q=tq, tile_kv=tkv, stages=stages,
            variant=opts.logits_soft_cap > 0 or opts.pos_encoding == "alibi",
        )  # fmt: skip
    return PrefillPlan(
        batch, hq, hkv, d, dvo, ps, qd, kvd, od, opts, config, qo, kvi, indices, last, kv_lens, max_page,
        mask_bytes, mask_indptr,
    )  # fmt: skip


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
