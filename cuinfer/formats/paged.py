"""Paged KV caches: a 5-D cache or a ``(k_cache, v_cache)`` tuple of either layout parsed into a ``KV`` view, and the
CSR page table (``kv_indptr``, ``kv_indices``, ``kv_last_page_len``) checked against it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cuinfer.formats.kv import KV, check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor


def check_page_table(
    indptr: np.ndarray, kv_indices: Any, kv_last_page_len: Any, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate a CSR page table whose ``indptr`` is already checked -> (indices, last_page_len, pages per request)."""
    batch = indptr.shape[0] - 1
    indices = validate.check_index_array("kv_indices", kv_indices, min_len=int(indptr[-1]))
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
    return indices, last, pages


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


def paged_kv(tensor: Callable[[Any, str], Tensor], kv_cache: Any, layout: str, *, gpu: bool) -> KV:
    """Parse a 5-D cache or a (k_cache, v_cache) tuple of ``layout`` (imported with ``tensor``); ``gpu`` adds the
    16-byte alignment checks the kernels need."""
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
            if gpu:
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
        if gpu:
            check_aligned("kv_cache", c, (0, 1, 2, 3))
        slot, head = (2, 3) if nhd else (3, 2)
        ks = vs = (c.strides[0], c.strides[slot], c.strides[head])
        shape = (c.shape[0],) + c.shape[2:]
        kt = vt = c
        kp, vp = c.ptr, c.ptr + c.strides[1] * c.dtype.itemsize
    validate.check_same_dtype(("k_cache", "v_cache"), (kt, vt))
    page_size, heads = (shape[1], shape[2]) if nhd else (shape[2], shape[1])
    return KV(kt, vt, kp, vp, ks, vs, shape[0], page_size, heads, shape[3])
