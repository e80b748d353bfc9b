"""Paged KV caches on the CPU: reading a page table into ragged K/V, and appending tokens into pages.

Page-table format (CSR): request i owns pages `kv_indices[kv_indptr[i]:kv_indptr[i+1]]`, in order, and
`kv_len_i = page_size·(num_pages_i − 1) + kv_last_page_len[i]` (0 pages: kv_len 0). The cache is one 5-D array
`[num_pages, 2, page_size, Hkv, D]` (NHD) / `[num_pages, 2, Hkv, page_size, D]` (HND) or a tuple (k_cache, v_cache)
of 4-D arrays. Everything here works on NHD-ordered *views*, so appends write through to the caller's array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from cuinfer.reference.util import as_index, as_indptr
from cuinfer.runtime.options import kv_layout_name


@dataclass(frozen=True)
class PageTable:
    """A validated page table over NHD views of the caches: k/v are [num_pages, page_size, Hkv, D*]."""

    k: np.ndarray
    v: np.ndarray
    kv_indptr: np.ndarray  # int64 [B+1], into kv_indices
    kv_indices: np.ndarray  # int64
    kv_lens: np.ndarray  # int64 [B], tokens per request

    @property
    def page_size(self) -> int:
        return self.k.shape[1]

    def request_kv(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Request b's keys and values [kv_len, Hkv, D*] in the cache dtype (a gathered copy)."""
        pages = self.kv_indices[self.kv_indptr[b] : self.kv_indptr[b + 1]]
        n = int(self.kv_lens[b])
        k = self.k[pages].reshape(-1, *self.k.shape[2:])[:n]
        v = self.v[pages].reshape(-1, *self.v.shape[2:])[:n]
        return k, v


def split_kv_cache(kv_cache: Any, kv_layout: Any = "NHD") -> tuple[np.ndarray, np.ndarray]:
    """NHD-ordered views (k, v), each [num_pages, page_size, Hkv, D*], of a 5-D cache or a (k_cache, v_cache) tuple."""
    layout = kv_layout_name(kv_layout)
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise ValueError(f"a tuple kv_cache must be (k_cache, v_cache) but has {len(kv_cache)} entries")
        k, v = (np.asarray(c) for c in kv_cache)
        if k.ndim != 4 or v.ndim != 4:
            raise ValueError(
                f"k_cache and v_cache must be 4-D [num_pages, page_size, Hkv, D] ({layout}) but have shapes "
                f"{k.shape}, {v.shape}"
            )
    else:
        c = np.asarray(kv_cache)
        if c.ndim != 5 or c.shape[1] != 2:
            expect = "[num_pages, 2, page_size, Hkv, D]" if layout == "NHD" else "[num_pages, 2, Hkv, page_size, D]"
            raise ValueError(
                f"kv_cache must be 5-D {expect} ({layout}) or a (k_cache, v_cache) tuple but has shape {c.shape}"
            )
        k, v = c[:, 0], c[:, 1]
    if layout == "HND":
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v caches must agree in (num_pages, page_size, Hkv) but are {k.shape[:3]} and {v.shape[:3]} "
            f"(NHD order)"
        )
    return k, v


def page_table(kv_cache: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, kv_layout: Any) -> PageTable:
    """Validate a page table against its cache and compute each request's kv_len."""
    k, v = split_kv_cache(kv_cache, kv_layout)
    num_pages, page_size = k.shape[0], k.shape[1]
    indices = as_index(kv_indices, "kv_indices")
    indptr = as_indptr(kv_indptr, "kv_indptr", total=indices.shape[0])
    last = as_index(kv_last_page_len, "kv_last_page_len")
    batch = indptr.shape[0] - 1
    if last.shape[0] != batch:
        raise ValueError(f"kv_last_page_len must have one entry per request ({batch}) but has {last.shape[0]}")
    used = indices[indptr[0] : indptr[-1]]
    if used.size and (used.min() < 0 or used.max() >= num_pages):
        raise ValueError(
            f"kv_indices must name pages in [0, {num_pages}) but hold values in [{used.min()}, {used.max()}]"
        )
    n_pages = np.diff(indptr)
    bad = (n_pages > 0) & ((last < 1) | (last > page_size))
    if np.any(bad):
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"kv_last_page_len[{b}] = {int(last[b])} but must be in [1, page_size={page_size}] for a request with pages"
        )
    kv_lens = np.where(n_pages > 0, page_size * (n_pages - 1) + last, 0)
    return PageTable(k=k, v=v, kv_indptr=indptr, kv_indices=indices, kv_lens=kv_lens)


def paged_kv_to_ragged(
    kv_cache: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, *, kv_layout: str = "NHD"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gather a paged cache into ragged (k[nnz_kv, Hkv, D], v[nnz_kv, Hkv, Dv], kv_indptr_tokens[B+1] int32).

    K and V keep the cache dtype (no rounding happens here).
    """
    table = page_table(kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout)
    parts = [table.request_kv(b) for b in range(table.kv_lens.shape[0])]
    k_shape, v_shape = table.k.shape[2:], table.v.shape[2:]
    k = np.concatenate([p[0] for p in parts], axis=0) if parts else np.empty((0, *k_shape), table.k.dtype)
    v = np.concatenate([p[1] for p in parts], axis=0) if parts else np.empty((0, *v_shape), table.v.dtype)
    indptr_tokens = np.concatenate([[0], np.cumsum(table.kv_lens)]).astype(np.int32)
    return k, v, indptr_tokens


def get_batch_indices_positions(append_indptr: Any, seq_lens: Any, nnz: int) -> tuple[np.ndarray, np.ndarray]:
    """Request index and position of each appended token (int32 [nnz] each), FlashInfer's semantics.

    Appended token t of request b (rows append_indptr[b]:append_indptr[b+1]) lands at position
    `seq_lens[b] - append_len_b + (t - append_indptr[b])` (seq_lens count the tokens after the append). Rows past
    append_indptr[-1] (padding up to nnz) get batch index -1 and position -1, and append_paged_kv_cache skips them.
    """
    indptr = as_indptr(append_indptr, "append_indptr")
    lens = as_index(seq_lens, "seq_lens")
    batch = indptr.shape[0] - 1
    if lens.shape[0] != batch:
        raise ValueError(f"seq_lens must have one entry per request ({batch}) but has {lens.shape[0]}")
    if int(nnz) < indptr[-1]:
        raise ValueError(f"nnz = {nnz} is smaller than append_indptr[-1] = {int(indptr[-1])}; pass nnz >= it")
    append_lens = np.diff(indptr)
    if np.any(append_lens > lens):
        b = int(np.flatnonzero(append_lens > lens)[0])
        raise ValueError(
            f"request {b} appends {int(append_lens[b])} tokens but seq_lens[{b}] = {int(lens[b])}; seq_lens must "
            f"count the tokens after the append"
        )
    batch_indices = np.full(int(nnz), -1, dtype=np.int32)
    positions = np.full(int(nnz), -1, dtype=np.int32)
    rows = np.arange(indptr[0], indptr[-1])
    req = np.repeat(np.arange(batch), append_lens)
    batch_indices[rows] = req
    positions[rows] = lens[req] - append_lens[req] + rows - indptr[req]
    return batch_indices, positions


def append_paged_kv_cache(
    k: Any,
    v: Any,
    batch_indices: Any,
    positions: Any,
    kv_cache: Any,
    kv_indices: Any,
    kv_indptr: Any,
    kv_last_page_len: Any,
    *,
    kv_layout: str = "NHD",
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> None:
    """Write k[nnz, Hkv, D], v[nnz, Hkv, Dv] into a NumPy paged cache in place (cast to the cache dtype).

    Into an fp8 cache (ml_dtypes float8_e4m3fn / float8_e5m2) from other dtypes the rows are quantised as the GPU
    kernel does (``quantize_fp8``): ``float32(x) / float32(scale)``, clipped to the format's max finite, rounded to
    nearest even; ``k_scale`` / ``v_scale`` default to 1.0. Other caches take no scale other than 1.0 (a cast).

    Row t goes to request batch_indices[t] at position positions[t], i.e. page
    kv_indices[kv_indptr[b] + pos // page_size], slot pos % page_size. Rows with batch index -1 are skipped.
    The page table describes the cache after the append, so every position must be < kv_len of its request.
    """
    caches = kv_cache if isinstance(kv_cache, (tuple, list)) else (kv_cache,)
    if not all(isinstance(c, np.ndarray) and c.flags.writeable for c in caches):
        raise ValueError(
            "append_paged_kv_cache writes into kv_cache in place, so it must be a writeable NumPy array (or a tuple "
            f"of two) but is {type(kv_cache).__name__}"
        )
    table = page_table(kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout)
    k_in, v_in = np.asarray(k), np.asarray(v)
    bidx, pos = as_index(batch_indices, "batch_indices"), as_index(positions, "positions")
    nnz = k_in.shape[0] if k_in.ndim else 0
    if k_in.shape[1:] != table.k.shape[2:] or v_in.shape[1:] != table.v.shape[2:] or v_in.shape[0] != nnz:
        raise ValueError(
            f"k and v must be [nnz, Hkv, D] matching the cache's {table.k.shape[2:]} / {table.v.shape[2:]} but have "
            f"shapes {k_in.shape}, {v_in.shape}"
        )
    if bidx.shape[0] != nnz or pos.shape[0] != nnz:
        raise ValueError(
            f"batch_indices and positions must have nnz = {nnz} entries but have {bidx.shape[0]}, {pos.shape[0]}"
        )
    live = bidx >= 0
    b, p = bidx[live], pos[live]
    batch = table.kv_lens.shape[0]
    if b.size and b.max() >= batch:
        raise ValueError(f"batch_indices must be < batch_size = {batch} (or -1 for padding) but reach {b.max()}")
    out_of_range = (p < 0) | (p >= table.kv_lens[b])
    if np.any(out_of_range):
        t = int(np.flatnonzero(live)[np.flatnonzero(out_of_range)[0]])
        raise ValueError(
            f"token {t} goes to position {int(pos[t])} of request {int(bidx[t])}, whose kv_len is "
            f"{int(table.kv_lens[bidx[t]])}; kv_indptr / kv_last_page_len must describe the cache after the append"
        )
    page = table.kv_indices[table.kv_indptr[b] + p // table.page_size]
    slot = p % table.page_size
    table.k[page, slot] = _to_cache(k_in[live], table.k.dtype, k_scale, "k_scale")
    table.v[page, slot] = _to_cache(v_in[live], table.v.dtype, v_scale, "v_scale")


_FP8 = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))


def quantize_fp8(x: np.ndarray, dtype: Any, scale: float | None = None) -> np.ndarray:
    """``saturate(float32(x) / float32(scale))`` as ``dtype`` (float8_e4m3fn / float8_e5m2): one float32 division, then
    the values beyond the max finite (448 / 57344, infinities included) clipped to it and the rest rounded to
    nearest even by ml_dtypes' direct float32 -> fp8 cast. NaN stays NaN. What append.cu stores."""
    dt = np.dtype(dtype)
    s = np.float32(1.0 if scale is None else scale)
    with np.errstate(over="ignore", invalid="ignore"):  # (inf, then clipped: satfinite; NaN stays NaN)
        y = np.asarray(x).astype(np.float32) / s
    m = np.float32(ml_dtypes.finfo(dt).max)
    return np.clip(y, -m, m).astype(dt)


def _to_cache(x: np.ndarray, dtype: np.dtype, scale: float | None, name: str) -> np.ndarray:
    if dtype in _FP8 and x.dtype != dtype:
        return quantize_fp8(x, dtype, scale)
    if scale is not None and float(scale) != 1.0:
        raise ValueError(
            f"{name} = {scale!r} but the rows are copied into a {dtype} cache: scales quantise into an fp8 cache"
        )
    return x.astype(dtype)
