"""plan()'s index arrays of a prefill batch (``qo_indptr``, ``kv_indptr`` and, paged, the page table) read into a
plan's fields: a fast path of one reduction for 1-D NumPy int32 inputs (plan() runs every batch), the interop
validators for everything else."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.formats.paged import I32, INT32_MAX, U32, check_page_table, const32
from cuinfer.interop import validate


def read_index_arrays(
    out: dict, paged: bool, qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, ps: int
) -> None:
    """Check plan()'s index arrays and put their host facts into ``out`` (a plan's fields): ``qo_indptr``,
    ``kv_indptr``, ``kv_indices`` and ``kv_last_page_len`` (None for ragged K/V), ``qo_lens``, ``kv_lens``,
    ``max_page`` (-1: none), ``qo_range`` and ``kv_range`` ((min, max) of the lengths) and ``n_pages`` (page-table
    entries in use, 0 for ragged K/V). 1-D NumPy int32 inputs take the fast path; anything else, or anything the fast
    path cannot vouch for, the validators', which raise the error that names the argument."""
    if not read_index_arrays_fast(out, paged, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, ps):
        read_checked_index_arrays(out, paged, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, ps)


def read_checked_index_arrays(
    out: dict, paged: bool, qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, ps: int
) -> None:
    """``read_index_arrays`` through the validators (raising the error that names the argument)."""
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
        indices, last, kv_lens = check_page_table(kvi, kv_indices, kv_last_page_len, ps)
        max_page = int(indices.max()) if indices.size else -1
    else:
        kvi = validate.check_indptr("kv_indptr", kv_indptr, length=qo.shape[0], hint=hint)
        indices = last = None
        kv_lens = np.diff(kvi).astype(np.int32)
        max_page = -1
    qo_lens = np.diff(qo)
    ranges = [(int(a.min()), int(a.max())) if batch else (0, 0) for a in (qo_lens, kv_lens)]
    n_pages = int(kvi[-1]) if paged else 0
    out["qo_indptr"], out["kv_indptr"], out["kv_indices"], out["kv_last_page_len"] = qo, kvi, indices, last
    out["qo_lens"], out["kv_lens"], out["max_page"] = qo_lens, kv_lens, max_page
    out["qo_range"], out["kv_range"], out["n_pages"] = ranges[0], ranges[1], n_pages


def read_index_arrays_fast(out: dict, paged: bool, qo: Any, kvi: Any, indices: Any, last: Any, ps: int) -> bool:
    """``read_index_arrays`` for 1-D NumPy int32 inputs in one reduction over the rows ``[qo_lens, kv_lens, lp,
    -qo_lens, -kv_lens, -lp]`` (``lp = last - page_size``, see ``formats.paged.read_page_table_fast``); False (``out``
    untouched) when it cannot vouch for them: the validators' path then runs and names whatever is wrong. The rows lie
    end to end in one buffer: ``reduceat`` takes their maxima in two thirds of the instructions of a 2-D reduction,
    and scalars are read with ``item`` (no NumPy scalar)."""
    nd = np.ndarray
    if type(qo) is not nd or type(kvi) is not nd or qo.dtype is not I32 or kvi.dtype is not I32:
        return False
    if paged and (type(indices) is not nd or type(last) is not nd or indices.dtype is not I32
                  or last.dtype is not I32 or indices.ndim != 1 or last.ndim != 1):  # fmt: skip
        return False
    if qo.ndim != 1 or kvi.ndim != 1:
        return False
    batch = len(qo) - 1
    if batch < 1 or len(kvi) != batch + 1 or qo.item(0) or kvi.item(0):
        return False
    r = 3 if paged else 2
    half = r * batch
    rows = np.empty(2 * half, I32)
    qo_lens, kv_lens = rows[:batch], rows[batch : 2 * batch]
    np.subtract(qo[1:], qo[:-1], out=qo_lens)
    np.subtract(kvi[1:], kvi[:-1], out=kv_lens)
    max_page = -1
    if paged:
        nnz = kvi.item(-1)
        if last.shape[0] != batch or indices.shape[0] < nnz or not 0 <= nnz * ps <= INT32_MAX:
            return False  # (a negative nnz: a decreasing kv_indptr; past int32: kv_lens might not fit int32)
        c = const32(ps)
        lp = np.subtract(last, c, out=rows[2 * batch : half])
        np.multiply(kv_lens, c, out=kv_lens)
        kv_lens += lp
        if indices.shape[0] != nnz:
            indices = indices[:nnz]  # (a longer buffer's tail is not read)
        if nnz:
            max_page = int(np.maximum.reduce(indices.view(U32)))
            if max_page > INT32_MAX:
                return False
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
        return False
    if paged:
        lp_hi, lp_lo = hi[2], -hi[r + 2]
        if lp_hi > 0 or lp_lo <= -ps or kv_lo <= -ps:
            return False
        if kv_lo < 0:  # requests without pages have length 0
            np.maximum(kv_lens, 0, out=kv_lens)
            kv_lo = 0
        out["qo_indptr"], out["kv_indptr"], out["kv_indices"], out["kv_last_page_len"] = qo, kvi, indices, last
        out["qo_lens"], out["kv_lens"], out["max_page"] = qo_lens, kv_lens, max_page
        out["qo_range"], out["kv_range"], out["n_pages"] = (qo_lo, qo_hi), (kv_lo, kv_hi), nnz
        return True
    if kv_lo < 0:
        return False
    out["qo_indptr"], out["kv_indptr"], out["kv_indices"], out["kv_last_page_len"] = qo, kvi, None, None
    out["qo_lens"], out["kv_lens"], out["max_page"] = qo_lens, kv_lens, -1
    out["qo_range"], out["kv_range"], out["n_pages"] = (qo_lo, qo_hi), (kv_lo, kv_hi), 0
    return True


# paged -> {batch: the first word of each row of read_index_arrays_fast's buffer} (for reduceat)
_ROW_STARTS: dict = {False: {}, True: {}}
