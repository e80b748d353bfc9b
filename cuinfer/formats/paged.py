"""Paged KV caches: a 5-D cache or a ``(k_cache, v_cache)`` tuple of either layout parsed into a ``KV`` view, and the
CSR page table (``kv_indptr``, ``kv_indices``, ``kv_last_page_len``) checked against it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from cuinfer.formats.kv import KV, check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor

I32 = np.dtype(np.int32)
U32 = np.dtype(np.uint32)
INT32_MAX = 2**31 - 1


def check_page_table(
    indptr: np.ndarray, kv_indices: Any, kv_last_page_len: Any, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate a CSR page table whose ``indptr`` is already checked -> (indices in use, last_page_len, kv_lens int32).

    ``kv_indices`` may be longer than ``indptr[-1]`` (a preallocated buffer, as FlashInfer allows): only the entries in
    use are read. A request's ``kv_len`` must fit the kernels' int32 token counts."""
    batch = indptr.shape[0] - 1
    nnz = int(indptr[-1])
    indices = validate.check_index_array(
        "kv_indices", kv_indices, used=nnz, hint=f"kv_indptr[-1] = {nnz} pages are in use"
    )
    last = validate.check_index_array(
        "kv_last_page_len", kv_last_page_len, length=batch, hint="one entry per request (len(kv_indptr) - 1)"
    )
    pages = np.diff(indptr)
    bad = (pages > 0) & ((last < 1) | (last > page_size))
    if np.any(bad):
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"kv_last_page_len[{b}] must be in [1, page_size={page_size}] for a request with pages but is "
            f"{int(last[b])}; it counts the tokens in the request's last page"
        )
    kv_lens = np.maximum(pages.astype(np.int64) * page_size + (last.astype(np.int64) - page_size), 0)
    if batch and int(kv_lens.max()) > INT32_MAX:
        b = int(np.argmax(kv_lens))
        raise ValueError(
            f"request {b} must hold at most {INT32_MAX} tokens (the kernels count a request's keys in int32) but "
            f"kv_indptr and kv_last_page_len give it {int(kv_lens[b])} ({int(pages[b])} pages of page_size="
            f"{page_size}); split the request"
        )
    return indices, last, kv_lens.astype(np.int32)


def check_cache_matches(kv: KV, plan: Any, layout: str) -> None:
    """Raise unless the parsed paged cache ``kv`` has the page size, KV heads and head dim ``plan`` was made for
    (decode and prefill plans both carry ``page_size``, ``num_kv_heads``, ``head_dim``)."""
    got = (kv.page_size, kv.num_kv_heads, kv.head_dim)
    want = (plan.page_size, plan.num_kv_heads, plan.head_dim)
    if got != want:
        raise ValueError(
            f"kv_cache has (page_size, num_kv_heads, head_dim) = {got} ({layout}) but plan() was made for "
            f"{want}; pass the cache the plan describes (or check kv_layout)"
        )


def check_pages_in_cache(max_page: int, kv: KV) -> None:
    """Raise unless the cache ``kv`` holds page ``max_page``, the largest index the plan's page table reads."""
    if max_page >= kv.num_pages:
        raise ValueError(
            f"kv_indices holds page index {max_page} but kv_cache has {kv.num_pages} pages (valid indices are "
            f"0..{kv.num_pages - 1}); the page table passed to plan() does not belong to this cache"
        )


def paged_kv(tensor: Callable[[Any, str], Tensor], kv_cache: Any, layout: str) -> KV:
    """Parse a 5-D cache or a (k_cache, v_cache) tuple of ``layout`` (imported with ``tensor``), checked as both routes
    check it (``check_aligned``: a contiguous last dimension; on the GPU also the 16-byte alignment the kernels
    need)."""
    nhd = layout == "NHD"
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise ValueError(f"a tuple kv_cache must be (k_cache, v_cache) but has {len(kv_cache)} entries")
        k, v = tensor(kv_cache[0], "k_cache"), tensor(kv_cache[1], "v_cache")
        expect = (
            "[num_pages, page_size, num_kv_heads, head_dim]"
            if nhd
            else "[num_pages, num_kv_heads, page_size, head_dim]"
        )
        for name, t in (("k_cache", k), ("v_cache", v)):
            validate.check_ndim(name, t, 4, hint=f"a ({layout}) cache is {expect}")
            check_aligned(name, t, (0, 1, 2))
        validate.check_shape("v_cache", v, k.shape, hint="it must match k_cache")
        slot, head = (1, 2) if nhd else (2, 1)
        ks = (k.strides[0], k.strides[slot], k.strides[head])
        vs = (v.strides[0], v.strides[slot], v.strides[head])
        shape, kt, vt, kp, vp = k.shape, k, v, k.ptr, v.ptr
    else:
        c = tensor(kv_cache, "kv_cache")
        expect = (
            "[num_pages, 2, page_size, num_kv_heads, head_dim]"
            if nhd
            else "[num_pages, 2, num_kv_heads, page_size, head_dim]"
        )
        validate.check_ndim(
            "kv_cache", c, 5, hint=f"a ({layout}) cache is {expect}, or pass a (k_cache, v_cache) tuple"
        )
        if c.shape[1] != 2:
            raise ValueError(
                f"kv_cache must have shape {expect} ({layout}) but has shape {c.shape}; dim 1 holds K and V"
            )
        check_aligned("kv_cache", c, (0, 1, 2, 3))
        slot, head = (2, 3) if nhd else (3, 2)
        ks = vs = (c.strides[0], c.strides[slot], c.strides[head])
        shape = (c.shape[0],) + c.shape[2:]
        kt = vt = c
        kp, vp = c.ptr, c.ptr + c.strides[1] * c.dtype.itemsize
    validate.check_same_dtype(("k_cache", "v_cache"), (kt, vt))
    page_size, heads = (shape[1], shape[2]) if nhd else (shape[2], shape[1])
    return KV(kt, vt, kp, vp, ks, vs, shape[0], page_size, heads, shape[3])


# ---- the page table of a plan --------------------------------------------------------------------------------------


def read_page_table(out: dict, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, page_size: int) -> None:
    """Check a CSR page table and put its host int32 facts into ``out`` (a plan's fields): ``kv_indptr``,
    ``kv_indices``, ``kv_last_page_len``, ``kv_lens``, ``max_page`` (-1 when no page is read), ``kv_range`` ((min, max)
    of kv_lens) and ``nnz`` (page indices read). 1-D NumPy int32 inputs take a fast path of three reductions (plan()
    runs every step); anything else, or a failed check, goes through the interop validators, which raise the error
    that names the argument."""
    if (
        type(kv_indptr) is np.ndarray and type(kv_indices) is np.ndarray and type(kv_last_page_len) is np.ndarray
        and kv_indptr.dtype is I32 and kv_indices.dtype is I32 and kv_last_page_len.dtype is I32
        and read_page_table_fast(out, kv_indptr, kv_indices, kv_last_page_len, page_size)
    ):  # fmt: skip
        return
    read_checked_page_table(out, kv_indptr, kv_indices, kv_last_page_len, page_size)


def read_checked_page_table(out: dict, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, page_size: int) -> None:
    """``read_page_table`` through the validators (raising the error that names the argument)."""
    indptr = validate.check_indptr("kv_indptr", kv_indptr)
    batch = indptr.shape[0] - 1
    indices, last, kv_lens = check_page_table(indptr, kv_indices, kv_last_page_len, page_size)
    nnz = int(indptr[-1])
    out["kv_indptr"], out["kv_indices"], out["kv_last_page_len"], out["kv_lens"] = indptr, indices, last, kv_lens
    out["max_page"] = int(indices.max()) if nnz else -1
    out["kv_range"] = (int(kv_lens.min()), int(kv_lens.max())) if batch else (0, 0)
    out["nnz"] = nnz


def read_page_table_fast(out: dict, indptr: np.ndarray, indices: np.ndarray, last: np.ndarray, page_size: int) -> bool:
    """``read_page_table`` for 1-D NumPy int32 arrays: the validators' checks in two reductions; False (``out``
    untouched) when any fails, the slow path then naming the problem.

    With ``lp = last - page_size`` in ``[1 - page_size, 0]``, ``kv_lens = pages * page_size + lp`` is above
    ``-page_size`` exactly when no request has a negative page count (``<= 0`` only for requests without pages, whose
    length is 0). One reduction over the rows ``[lp, kv, -lp, -kv]`` gives all four bounds; the page indices seen as
    uint32 are below 2**31 exactly when none is negative, and their max is the largest page the plan reads.
    """
    if indptr.ndim != 1 or indices.ndim != 1 or last.ndim != 1:
        return False
    batch = indptr.shape[0] - 1
    if batch < 1 or last.shape[0] != batch or indptr.item(0) != 0:
        return False
    nnz = indptr.item(-1)
    n_ind = indices.shape[0]
    if n_ind < nnz or not 0 <= nnz * page_size <= INT32_MAX:  # (negative: decreasing; past int32: kv_lens might be)
        return False
    ps = const32(page_size)  # a 0-d operand: NumPy calls with Python scalars cost about twice as much
    rows = np.empty((4, batch), dtype=np.int32)
    lp, kv = rows[0], rows[1]
    np.subtract(last, ps, out=lp)
    np.subtract(indptr[1:], indptr[:-1], out=kv)  # pages
    np.multiply(kv, ps, out=kv)
    np.add(kv, lp, out=kv)
    np.negative(rows[:2], out=rows[2:])
    lp_hi, kv_hi, lp_lo, kv_lo = np.maximum.reduce(rows, axis=1).tolist()
    if lp_hi > 0 or lp_lo >= page_size or kv_lo >= page_size:  # (lp_lo, kv_lo are the negated minima)
        return False
    kv_lo = -kv_lo
    if kv_lo < 0:  # requests without pages have length 0
        np.maximum(kv, 0, out=kv)
        kv_lo = 0
    if n_ind != nnz:
        indices = indices[:nnz]  # (a longer buffer's tail is not read)
    max_page = int(np.maximum.reduce(indices.view(U32))) if nnz else -1
    if max_page > INT32_MAX:
        return False
    out["kv_indptr"], out["kv_indices"], out["kv_last_page_len"], out["kv_lens"] = indptr, indices, last, kv
    out["max_page"], out["kv_range"], out["nnz"] = max_page, (kv_lo, kv_hi), nnz
    return True


@functools.lru_cache(maxsize=64)
def const32(v: int) -> np.ndarray:
    """A read-only 0-d int32 operand (NumPy calls with a Python scalar cost about twice as much on small arrays)."""
    c = np.array(v, dtype=np.int32)
    c.flags.writeable = False
    return c
