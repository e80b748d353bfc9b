"""The paged KV cache of a serving step: appending tokens (``append_paged_kv_cache``) and the index arrays around it
(``get_batch_indices_positions``, ``get_seq_lens``), with FlashInfer's semantics and argument names.

NumPy inputs run on the CPU reference (``cuinfer.reference``) after the same checks; GPU arrays run the kernels of
``kernel_src/utility/append.cu`` and ``positions.cu`` on the caller's current stream, without copies and without
synchronising. The index values of GPU arrays are not read by the host (that would synchronise): the kernels skip
rows whose indices fall outside the page table or the cache, and ``check_indices=True`` checks them on the host
first, with the messages of the NumPy route.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.interop.dtypes import DType
from cuinfer.prefill.specs import fast_div_magic
from cuinfer.reference import utilities as ref_utils
from cuinfer.runtime.calls import Call, begin
from cuinfer.runtime.fp8 import KV_DTYPES, as_kv_dtype, kv_dtype_of
from cuinfer.runtime.options import kv_layout_name
from cuinfer.utils import specs as S
from cuinfer.utils.launch import (
    HALF_DTYPES,
    Launch,
    as_int32,
    blocks,
    check_index,
    check_positive_int,
    check_rows16,
    host_values,
    index_launch,
    sm_count,
)

_INT32 = DType.INT32
# tokens x vectors of one launch stay below 2^30 (the kernel divides 32-bit work indices)
_MAX_WORK = 1 << 30


@dataclass(frozen=True)
class CacheSide:
    """The K or V half of a paged cache: element 0 and the element strides of a page, a slot and a head."""

    ptr: int
    s_page: int
    s_slot: int
    s_head: int
    num_pages: int
    page_size: int
    num_heads: int
    head_dim: int


@dataclass(frozen=True)
class AppendArgs:
    """The checked arguments of one append."""

    key: Tensor
    value: Tensor
    caches: tuple[Tensor, ...]  # the 5-D cache, or k_cache and v_cache
    k: CacheSide
    v: CacheSide
    batch_indices: Tensor
    positions: Tensor
    kv_indices: Tensor
    kv_indptr: Tensor
    kv_last_page_len: Tensor
    layout: str
    k_scale: float = 1.0  # an fp8 cache of 16-bit rows stores saturate(x / scale)
    v_scale: float = 1.0

    @property
    def nnz(self) -> int:
        return self.key.shape[0]

    @property
    def batch_size(self) -> int:
        return self.kv_indptr.shape[0] - 1


def _cache_shape(layout: str, ndim: int) -> str:
    dims = "page_size, num_kv_heads" if layout == "NHD" else "num_kv_heads, page_size"
    return f"[num_pages, 2, {dims}, head_dim]" if ndim == 5 else f"[num_pages, {dims}, head_dim]"


def _side(t: Tensor, layout: str, ptr: int, strides: tuple[int, ...], shape: tuple[int, ...]) -> CacheSide:
    """A cache half from its 4-D [num_pages, a, b, head_dim] view (a, b = slot, head in NHD; head, slot in HND)."""
    slot_dim, head_dim_ = (1, 2) if layout == "NHD" else (2, 1)
    return CacheSide(
        ptr=ptr,
        s_page=strides[0],
        s_slot=strides[slot_dim],
        s_head=strides[head_dim_],
        num_pages=shape[0],
        page_size=shape[slot_dim],
        num_heads=shape[head_dim_],
        head_dim=shape[3],
    )


def parse_cache(paged_kv_cache: Any, layout: str, tensor) -> tuple[tuple[Tensor, ...], CacheSide, CacheSide]:
    """The cache arrays and their K / V halves; ``tensor(x, name)`` imports an array."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            kind = type(paged_kv_cache).__name__
            raise ValueError(
                f"paged_kv_cache must be one 5-D array or a (k_cache, v_cache) tuple but is a {kind} of "
                f"{len(paged_kv_cache)} arrays; pass (k_cache, v_cache)"
            )
        tk, tv = tensor(paged_kv_cache[0], "k_cache"), tensor(paged_kv_cache[1], "v_cache")
        for name, t in (("k_cache", tk), ("v_cache", tv)):
            validate.check_ndim(name, t, 4, hint=f"it is {_cache_shape(layout, 4)} for kv_layout={layout!r}")
        validate.check_same_dtype(("k_cache", "v_cache"), (tk, tv))
        k, v = _side(tk, layout, tk.ptr, tk.strides, tk.shape), _side(tv, layout, tv.ptr, tv.strides, tv.shape)
        if (k.num_pages, k.page_size, k.num_heads) != (v.num_pages, v.page_size, v.num_heads):
            raise ValueError(
                f"k_cache and v_cache must have the same num_pages, page_size and num_kv_heads but have shapes "
                f"{tk.shape} and {tv.shape} (kv_layout={layout!r}); pass the two halves of one cache"
            )
        return (tk, tv), k, v
    tc = tensor(paged_kv_cache, "paged_kv_cache")
    hint = f"it is {_cache_shape(layout, 5)} for kv_layout={layout!r}, or pass a (k_cache, v_cache) tuple"
    validate.check_ndim("paged_kv_cache", tc, 5, hint=hint)
    validate.check_shape("paged_kv_cache", tc, (None, 2, None, None, None), hint=hint)
    strides = tc.strides[:1] + tc.strides[2:]
    shape = tc.shape[:1] + tc.shape[2:]
    k = _side(tc, layout, tc.ptr, strides, shape)
    v = _side(tc, layout, tc.ptr + tc.strides[1] * tc.dtype.itemsize, strides, shape)
    return (tc,), k, v


def check_append_scales(cache_dtype: DType, key_dtype: DType, k_scale: Any, v_scale: Any) -> tuple[float, float]:
    """``k_scale`` / ``v_scale`` of an append, as the float32-rounded numbers the kernel divides by (1.0 for None).

    They quantise 16-bit rows into an fp8 cache (the cache holds ``saturate(k / k_scale)``, what run() dequantises
    with the same scales); a number, finite and nonzero, as run()'s. Arrays (per KV head) are not taken. A 16-bit
    cache, and fp8 rows copied into an fp8 cache, take only None or 1.0."""
    out = []
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if x is None:
            out.append(1.0)
            continue
        if isinstance(x, (bool, np.bool_, str, bytes)) or not (
            isinstance(x, numbers.Real) or (isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "fiu")
        ):
            if hasattr(x, "shape") and getattr(x, "ndim", 0) > 0:
                raise ValueError(
                    f"{name} must be a number but is an array of shape {tuple(x.shape)}: append_paged_kv_cache "
                    "quantises with one scale per tensor; pass a number (run() takes per-head arrays, append not yet)"
                )
            raise TypeError(f"{name} must be a number (or None for 1.0) but is {x!r} (a {type(x).__name__})")
        v = float(x)
        if not math.isfinite(v) or v == 0.0:
            raise ValueError(f"{name} must be a finite, nonzero number (or None for 1.0) but is {x!r}")
        v32 = float(np.float32(v))
        if v32 == 0.0 or not math.isfinite(v32):
            raise ValueError(f"{name} = {x!r} is outside float32's range; the kernel divides by it in float32")
        if v != 1.0 and not (cache_dtype.is_float8 and not key_dtype.is_float8):
            what = (
                f"the rows are already {key_dtype.value} (copied as they are)"
                if key_dtype.is_float8
                else f"the cache is {cache_dtype.value} (rows are copied bit-exact)"
            )
            raise ValueError(
                f"{name} = {x!r} but {what}: scales quantise float16 / bfloat16 rows into an fp8 cache; pass None"
            )
        out.append(v32)
    return out[0], out[1]


def check_append(
    append_key: Any,
    append_value: Any,
    batch_indices: Any,
    positions: Any,
    paged_kv_cache: Any,
    kv_indices: Any,
    kv_indptr: Any,
    kv_last_page_len: Any,
    kv_layout: Any,
    tensor,
    kv_dtype: Any = None,
) -> AppendArgs:
    """Every check that needs no index value (both routes): structure, shapes, dtypes, devices. A ``uint8`` cache
    (CuPy's fp8) is read as ``kv_dtype``."""
    layout = kv_layout_name(kv_layout)
    fmt = None if kv_dtype is None else kv_dtype_of(kv_dtype)

    def cache_tensor(x, name):
        t = tensor(x, name)
        if fmt is None:
            return t
        if t.dtype is DType.UINT8 and not fmt.is_float8:
            raise ValueError(
                f"{name} is uint8 but kv_dtype={fmt.value}; a uint8 cache holds fp8 codes (CuPy has no fp8 dtype): "
                "pass kv_dtype='float8_e4m3fn' or 'float8_e5m2'"
            )
        if t.dtype is not DType.UINT8 and t.dtype is not fmt:
            raise ValueError(
                f"{name} has dtype {t.dtype.value} but kv_dtype={fmt.value}; kv_dtype names the fp8 format of a uint8 "
                "cache: leave it out, or pass the matching dtype"
            )
        return as_kv_dtype(t, fmt, name)

    caches, k, v = parse_cache(paged_kv_cache, layout, cache_tensor)
    names = ("k_cache", "v_cache") if len(caches) == 2 else ("paged_kv_cache",)
    dtype = caches[0].dtype
    if dtype is DType.UINT8:
        raise ValueError(
            f"{names[0]} is uint8: say which fp8 format it holds (CuPy has no fp8 dtype), "
            "kv_dtype='float8_e4m3fn' or 'float8_e5m2'"
        )
    validate.check_dtype(names[0], caches[0], KV_DTYPES)
    tk, tv = tensor(append_key, "append_key"), tensor(append_value, "append_value")
    nnz = tk.shape[0] if tk.ndim else 0
    for name, t, side in (("append_key", tk, k), ("append_value", tv, v)):
        validate.check_ndim(name, t, 3, hint="it is [nnz, num_kv_heads, head_dim]")
        validate.check_shape(name, t, (nnz, side.num_heads, side.head_dim), hint=f"it must match {names[-1]}")
        validate.check_last_dim_contiguous(name, t)
        if side.head_dim % 8:
            raise ValueError(
                f"{name} has head_dim {side.head_dim} but append_paged_kv_cache moves 16-byte vectors of 8 elements: "
                "head_dim must be a multiple of 8; pad the head dimension"
            )
    if dtype.is_float8 and tk.dtype in HALF_DTYPES:  # quantising: 16-bit rows of one dtype
        validate.check_same_dtype(("append_key", "append_value"), (tk, tv))
    else:
        validate.check_same_dtype((names[0], "append_key", "append_value"), (caches[0], tk, tv))
    for name, t in zip(names, caches, strict=True):
        validate.check_last_dim_contiguous(name, t)
    idx = {n: tensor(x, n) for n, x in (("batch_indices", batch_indices), ("positions", positions))}
    for name, t in idx.items():
        check_index(name, t, nnz, hint="one entry per row of append_key")
    ti, tp = tensor(kv_indices, "kv_indices"), tensor(kv_indptr, "kv_indptr")
    tl = tensor(kv_last_page_len, "kv_last_page_len")
    check_index("kv_indices", ti)
    check_index("kv_indptr", tp, hint="it is [batch_size + 1]")
    if tp.shape[0] < 1:
        raise ValueError("kv_indptr must have batch_size + 1 >= 1 entries but is empty; pass [0] for an empty batch")
    check_index("kv_last_page_len", tl, tp.shape[0] - 1, hint="one entry per request (len(kv_indptr) - 1)")
    every = (*names, "append_key", "append_value", "batch_indices", "positions", "kv_indices", "kv_indptr")
    validate.check_same_device(
        (*every, "kv_last_page_len"), (*caches, tk, tv, idx["batch_indices"], idx["positions"], ti, tp, tl)
    )
    return AppendArgs(
        tk, tv, caches, k, v, idx["batch_indices"], idx["positions"], ti, tp, tl, layout
    )  # fmt: skip


def check_append_indices(a: AppendArgs, host: dict[str, np.ndarray]) -> None:
    """The index values against the page table and the cache (host arrays of int64, by argument name)."""
    indptr = host["kv_indptr"]
    indices, last, bidx, pos = host["kv_indices"], host["kv_last_page_len"], host["batch_indices"], host["positions"]
    validate.check_indptr("kv_indptr", indptr)
    if indptr[-1] > indices.shape[0]:
        raise ValueError(
            f"kv_indptr must end at most at len(kv_indices) = {indices.shape[0]} but ends at {indptr[-1]}; "
            "kv_indices[kv_indptr[b]:kv_indptr[b+1]] are the pages of request b"
        )
    used = indices[: indptr[-1]]
    bad = np.flatnonzero((used < 0) | (used >= a.k.num_pages))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"kv_indices must name pages of the cache (0 <= page < num_pages = {a.k.num_pages}) but kv_indices[{i}] "
            f"= {used[i]}; the page table and paged_kv_cache disagree"
        )
    pages = np.diff(indptr)
    bad = np.flatnonzero((pages > 0) & ((last < 1) | (last > a.k.page_size)))
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"kv_last_page_len must be in [1, page_size = {a.k.page_size}] for a request with pages but "
            f"kv_last_page_len[{b}] = {last[b]}; it counts the tokens of the request's last page"
        )
    kv_lens = np.where(pages > 0, (pages - 1) * a.k.page_size + last, 0)
    batch = a.batch_size
    bad = np.flatnonzero((bidx < -1) | (bidx >= batch))
    if bad.size:
        t = int(bad[0])
        raise ValueError(
            f"batch_indices must be in [0, batch_size = {batch}) (or -1 for a padding row, which is skipped) but "
            f"batch_indices[{t}] = {bidx[t]}; batch_size is len(kv_indptr) - 1"
        )
    live = np.flatnonzero(bidx >= 0)
    past = live[(pos[live] < 0) | (pos[live] >= kv_lens[bidx[live]])]
    if past.size:
        t = int(past[0])
        b = int(bidx[t])
        raise ValueError(
            f"positions must be in [0, kv_len) of their request but positions[{t}] = {pos[t]} and request {b} "
            f"(batch_indices[{t}]) has kv_len {kv_lens[b]}; kv_indptr and kv_last_page_len must describe the cache "
            "after the append (get_seq_lens gives each request's kv_len)"
        )


_INDEX_NAMES = ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len")


def _cache_names(a: AppendArgs) -> tuple[str, ...]:
    return ("k_cache", "v_cache") if len(a.caches) == 2 else ("paged_kv_cache",)


def _index_tensors(a: AppendArgs) -> tuple[Tensor, ...]:
    return (a.batch_indices, a.positions, a.kv_indices, a.kv_indptr, a.kv_last_page_len)


def _side_params(src: Tensor, side: CacheSide, vec: int, scale: float) -> dict:
    per_row = side.head_dim // vec
    per_token = side.num_heads * per_row
    if side.num_heads == 1 or (src.strides[1] == side.head_dim and side.s_head == side.head_dim):
        per_row = per_token  # heads contiguous in the source row and in the cache slot: one run of vectors (h = 0)
    row_mul, row_shift = fast_div_magic(max(per_row, 1))
    return dict(
        src=src.ptr, dst=side.ptr, src_s0=src.strides[0], src_s1=src.strides[1],
        dst_page=side.s_page, dst_slot=side.s_slot, dst_head=side.s_head,
        vecs_per_row=per_row, vecs_per_token=per_token, row_mul=row_mul, row_shift=row_shift, scale=scale,
    )  # fmt: skip


def append_launches(a: AppendArgs, sms: int) -> list[Launch]:
    """The launches of one append: one per chunk of tokens (a single one below 2^30 vectors)."""
    if a.nnz == 0 or a.batch_size == 0 or a.kv_indices.shape[0] == 0 or a.k.num_heads == 0:
        return []  # nothing to write (no request, no page): every row would be skipped
    dtype, cache_dtype = a.key.dtype.value, a.caches[0].dtype.value
    vec = 16 // a.key.dtype.itemsize  # elements of a 16-byte input vector (an fp8 cache of 16-bit rows: 8 bytes out)
    k, v = _side_params(a.key, a.k, vec, a.k_scale), _side_params(a.value, a.v, vec, a.v_scale)
    per_token = max(k["vecs_per_token"], v["vecs_per_token"])  # a thread's vector r of K and of V
    tok_mul, tok_shift = fast_div_magic(per_token)
    chunk = max(1, _MAX_WORK // per_token)
    page_mul, page_shift = fast_div_magic(a.k.page_size)
    spec, expr = S.append_spec(dtype, cache_dtype), S.append_instance(dtype, cache_dtype)
    out = []
    for begin_ in range(0, a.nnz, chunk):
        n = min(chunk, a.nnz - begin_)
        params = S.AppendParams.pack(
            k=k, v=v,
            batch_indices=a.batch_indices.ptr, positions=a.positions.ptr, kv_indices=a.kv_indices.ptr,
            kv_indptr=a.kv_indptr.ptr, kv_last_page_len=a.kv_last_page_len.ptr,
            token_begin=begin_, nnz=n, batch_size=a.batch_size, num_pages=a.k.num_pages,
            num_indices=a.kv_indices.shape[0], page_size=a.k.page_size, page_mul=page_mul, page_shift=page_shift,
            vecs_per_token=per_token, tok_mul=tok_mul, tok_shift=tok_shift,
        )  # fmt: skip
        needed = -(-n * per_token // (S.APPEND_THREADS * S.APPEND_UNROLL))
        grid = (blocks(needed, sms, S.APPEND_BLOCKS_PER_SM),)  # every SM's resident blocks, grid-striding
        out.append(Launch(spec, expr, grid, (S.APPEND_THREADS,), params))
    return out


def _fresh_caches(call: Call, caches: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Copies of immutable (JAX) caches, made on the call's stream, for the append to write into."""
    import cupy

    out = []
    for t in caches:
        if not t.is_contiguous:
            raise ValueError(
                f"a JAX paged_kv_cache must be contiguous to be copied for the append but has strides {t.strides}; "
                "pass jnp.array(cache)"
            )
        new = call.empty(t.shape, t.dtype)
        if t.nbytes:
            cupy.cuda.runtime.memcpyAsync(new.ptr, t.ptr, t.nbytes, 3, call.stream)  # 3: device to device
        out.append(new)
    return tuple(out)


def append_paged_kv_cache(
    append_key: Any,
    append_value: Any,
    batch_indices: Any,
    positions: Any,
    paged_kv_cache: Any,
    kv_indices: Any,
    kv_indptr: Any,
    kv_last_page_len: Any,
    kv_layout: str = "NHD",
    *,
    check_indices: bool = False,
    k_scale: Any = None,
    v_scale: Any = None,
    kv_dtype: Any = None,
) -> Any:
    """Write row t of ``append_key`` / ``append_value`` ``[nnz, num_kv_heads, head_dim]`` into the cache slot of
    request ``batch_indices[t]`` at position ``positions[t]``: page ``kv_indices[kv_indptr[b] + pos // page_size]``,
    slot ``pos % page_size``. Bit-exact, in place; rows with batch index -1 (padding) are skipped.

    An fp8 cache (float8_e4m3fn / float8_e5m2; a CuPy ``uint8`` cache with ``kv_dtype`` naming the format) takes
    float16 / bfloat16 rows quantised on the way in: ``saturate(float(x) / k_scale)`` (``v_scale`` for V), float32
    division, rounded to nearest even, beyond the format's max finite (448 / 57344) the max finite; the scales are
    numbers (None: 1.0), those run() dequantises with. fp8 rows of the cache's format are copied as they are.

    ``paged_kv_cache`` is ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (NHD) /
    ``[num_pages, 2, num_kv_heads, page_size, head_dim]`` (HND) or a ``(k_cache, v_cache)`` tuple of 4-D arrays;
    the page table (``kv_indices``, ``kv_indptr``, ``kv_last_page_len``) describes the cache *after* the append.
    Returns None, except for JAX caches (immutable): then the updated cache, a new array (or tuple) in the same
    structure.
    """
    if isinstance(append_key, np.ndarray):
        a = check_append(
            append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
            kv_last_page_len, kv_layout, as_tensor, kv_dtype,
        )  # fmt: skip
        ks, vs = check_append_scales(a.caches[0].dtype, a.key.dtype, k_scale, v_scale)
        for name, t in zip(_cache_names(a), a.caches, strict=True):
            validate.check_writable(name, t)
        check_append_indices(
            a, {n: host_values(n, t, None) for n, t in zip(_INDEX_NAMES, _index_tensors(a), strict=True)}
        )
        cache = paged_kv_cache
        if kv_dtype is not None:  # uint8 codes: written through a view of the fp8 format
            np_dtype = a.caches[0].dtype.numpy
            cache = (
                tuple(c.view(np_dtype) for c in paged_kv_cache)
                if isinstance(paged_kv_cache, (tuple, list))
                else paged_kv_cache.view(np_dtype)
            )
        reference.append_paged_kv_cache(
            append_key, append_value, batch_indices, positions, cache, kv_indices, kv_indptr,
            kv_last_page_len, kv_layout=a.layout, k_scale=ks, v_scale=vs,
        )  # fmt: skip
        return None
    anchor = paged_kv_cache[0] if isinstance(paged_kv_cache, (tuple, list)) and paged_kv_cache else paged_kv_cache
    call, _ = begin(anchor, "paged_kv_cache")
    a = check_append(
        append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len,
        kv_layout, call.tensor, kv_dtype,
    )  # fmt: skip
    ks, vs = check_append_scales(a.caches[0].dtype, a.key.dtype, k_scale, v_scale)
    fresh = all(t.framework == "jax" for t in a.caches)
    for name, t in zip(_cache_names(a), a.caches, strict=True):
        if not fresh:
            validate.check_writable(name, t)
        check_rows16(name, t)
    for name, t in (("append_key", a.key), ("append_value", a.value)):
        check_rows16(name, t)
    if check_indices:
        raw = (batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len)
        host = {n: host_values(n, t, x) for n, t, x in zip(_INDEX_NAMES, _index_tensors(a), raw, strict=True)}
        check_append_indices(a, host)
    if fresh:
        new = _fresh_caches(call, a.caches)
        a = check_append(
            append_key, append_value, batch_indices, positions, new if len(new) == 2 else new[0], kv_indices,
            kv_indptr, kv_last_page_len, kv_layout, call.tensor, kv_dtype,
        )  # fmt: skip
    a = replace(a, **{n: as_int32(call, t) for n, t in zip(_INDEX_NAMES, _index_tensors(a), strict=True)})
    a = replace(a, k_scale=ks, v_scale=vs)
    for launch in append_launches(a, sm_count(call.device_id)):
        launch.run(call.device_id, call.stream)
    if not fresh:
        return None
    out = tuple(call.give(t) for t in a.caches)
    return out if len(out) == 2 else out[0]


# ---- index arrays of a step ----------------------------------------------------------------------------------------


def _check_positions_args(ti: Tensor, tl: Tensor, nnz: Any) -> int:
    check_index("append_indptr", ti, hint="it is [batch_size + 1]")
    if ti.shape[0] < 1:
        raise ValueError("append_indptr must have batch_size + 1 >= 1 entries but is empty; pass [0] for no request")
    check_index("seq_lens", tl, ti.shape[0] - 1, hint="one entry per request (len(append_indptr) - 1)")
    validate.check_same_device(("append_indptr", "seq_lens"), (ti, tl))
    return check_positive_int("nnz", nnz, minimum=0)


def get_batch_indices_positions(append_indptr: Any, seq_lens: Any, nnz: int) -> tuple[Any, Any]:
    """``(batch_indices, positions)``, int32 ``[nnz]`` each: row t of request b (``append_indptr[b] <= t <
    append_indptr[b+1]``) lands at position ``seq_lens[b] - append_len_b + t - append_indptr[b]`` (``seq_lens``
    count the tokens after the append); rows past ``append_indptr[-1]`` (padding up to ``nnz``) get -1 and -1."""
    if isinstance(append_indptr, np.ndarray):
        ti, tl = as_tensor(append_indptr, "append_indptr"), as_tensor(seq_lens, "seq_lens")
        n = _check_positions_args(ti, tl, nnz)
        indptr = validate.check_indptr("append_indptr", append_indptr)
        validate.check_index_array("seq_lens", seq_lens, nonnegative=False)
        if indptr[-1] > n:
            raise ValueError(
                f"append_indptr must end at most at nnz = {n} but ends at {indptr[-1]}; pass nnz >= append_indptr[-1]"
            )
        return reference.get_batch_indices_positions(append_indptr, seq_lens, n)
    call, ti = begin(append_indptr, "append_indptr")
    tl = call.tensor(seq_lens, "seq_lens")
    n = _check_positions_args(ti, tl, nnz)
    b_out, p_out = call.empty((n,), _INT32), call.empty((n,), _INT32)
    if n:
        ti, tl = as_int32(call, ti), as_int32(call, tl)
        _positions_launch("batch_indices_positions", ti, tl, b_out, p_out, n, ti.shape[0] - 1, 0, call)
    return call.give(b_out), call.give(p_out)


def _check_seq_lens_args(tp: Tensor, tl: Tensor, page_size: Any) -> int:
    check_index("kv_indptr", tp, hint="it is [batch_size + 1]")
    if tp.shape[0] < 1:
        raise ValueError("kv_indptr must have batch_size + 1 >= 1 entries but is empty; pass [0] for no request")
    check_index("kv_last_page_len", tl, tp.shape[0] - 1, hint="one entry per request (len(kv_indptr) - 1)")
    validate.check_same_device(("kv_indptr", "kv_last_page_len"), (tp, tl))
    return check_positive_int("page_size", page_size)


def get_seq_lens(kv_indptr: Any, kv_last_page_len: Any, page_size: int) -> Any:
    """Tokens per request, int32 ``[batch_size]``: ``(pages - 1) * page_size + kv_last_page_len[b]`` for a request
    with pages, 0 for one without (FlashInfer's formula, which gives ``kv_last_page_len[b]`` there, agrees whenever
    page-less requests have ``kv_last_page_len`` 0, FlashInfer's convention)."""
    if isinstance(kv_indptr, np.ndarray):
        tp, tl = as_tensor(kv_indptr, "kv_indptr"), as_tensor(kv_last_page_len, "kv_last_page_len")
        ps = _check_seq_lens_args(tp, tl, page_size)
        validate.check_indptr("kv_indptr", kv_indptr)
        validate.check_index_array("kv_last_page_len", kv_last_page_len, nonnegative=False)
        return ref_utils.get_seq_lens(kv_indptr, kv_last_page_len, ps)
    call, tp = begin(kv_indptr, "kv_indptr")
    tl = call.tensor(kv_last_page_len, "kv_last_page_len")
    ps = _check_seq_lens_args(tp, tl, page_size)
    batch = tp.shape[0] - 1
    out = call.empty((batch,), _INT32)
    if batch:
        tp, tl = as_int32(call, tp), as_int32(call, tl)
        _positions_launch("seq_lens", tp, tl, out, out, batch, batch, ps, call)
    return call.give(out)


def _positions_launch(kind, indptr, lens, out0, out1, n, batch, page_size, call: Call) -> None:
    launch = index_launch(kind, indptr, lens, out0, out1, n, batch, page_size, sm_count(call.device_id))
    launch.run(call.device_id, call.stream)


__all__ = ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"]
