"""The host side of one decode plan: options, the plan's facts (``_Plan``), the page table read from the caller's
index arrays, and the words packed beside the work plan. No GPU needed; ``cuinfer.decode`` builds the wrapper on
top of it (as ``prefill_plan`` does for prefill)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from cuinfer.decode_policy import DecodeConfig
from cuinfer.decode_specs import DecodeKernelKey
from cuinfer.formats.paged import check_page_table
from cuinfer.interop import validate
from cuinfer.interop.dtypes import DType
from cuinfer.planner import layout as plan_layout
from cuinfer.planner.work import WorkPlan
from cuinfer.runtime.options import CommonOptions, check_common_options

# ---- the facts of one plan --------------------------------------------------------------------------------------


@dataclass
class _Plan:
    batch: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: DType
    kv_dtype: DType
    o_dtype: DType
    options: CommonOptions
    config: DecodeConfig
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    kv_last_page_len: np.ndarray
    kv_lens: np.ndarray
    max_page: int  # largest page index the plan reads, -1 when it reads none
    work: WorkPlan | None = None
    # GPU side (None for a host-only plan)
    words: np.ndarray | None = None  # the pinned buffer this plan was packed into
    words_used: int = 0
    offsets: dict | None = None  # word offsets of the plan arrays and of the page table
    device_id: int | None = None
    uploaded_on: int | None = None  # stream the current device copy was made on
    kv_range: tuple[int, int] = (0, 0)  # (min, max) of kv_lens
    nnz: int = 0  # page indices the plan reads (kv_indptr[-1])

    @classmethod
    def from_fields(cls, fields: dict) -> _Plan:
        """A plan from a dict holding every field (which the plan then owns): plan() builds one per step from the
        fields its static arguments fix (memoised by ``_host_plan``), cheaper than the 24-argument ``__init__``."""
        plan = object.__new__(cls)
        plan.__dict__ = fields
        return plan

    def key(self, lse: bool) -> DecodeKernelKey:
        o = self.options
        return DecodeKernelKey(
            self.config,
            self.q_dtype.value,
            self.kv_dtype.value,
            self.o_dtype.value,
            pos_encoding=o.pos_encoding,
            soft_cap=o.logits_soft_cap > 0,
            window=o.window_left >= 0,
            lse=lse,
        )


def _check_options(
    sm_scale, logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant, head_dim
) -> CommonOptions:
    return check_common_options(
        what="decode", sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
        pos_encoding=pos_encoding, rope_scale=rope_scale, rope_theta=rope_theta, variant=variant, head_dim=head_dim,
        builtin_hint="sm_scale, logits_soft_cap, window_left, pos_encoding",
    )  # fmt: skip


_I32 = np.dtype(np.int32)
_U32 = np.dtype(np.uint32)
_INT32_MAX = 2**31 - 1
# plan()'s arguments that do not depend on the page table, in order (memoised per wrapper).
_STATIC = (
    "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "q_dtype", "kv_dtype", "o_dtype", "sm_scale",
    "logits_soft_cap", "window_left", "pos_encoding", "rope_scale", "rope_theta", "variant",
)  # fmt: skip


def _page_table(kv_indptr, kv_indices, kv_last_page_len, page_size: int):
    """Host int32 ``(indptr, indices, last, kv_lens, max_page, (kv_min, kv_max), nnz)``. 1-D NumPy int32 inputs take a
    fast path of three reductions (plan() runs every step); anything else, or a failed check, goes through the
    interop validators, which raise the error that names the argument."""
    if (
        type(kv_indptr) is np.ndarray and type(kv_indices) is np.ndarray and type(kv_last_page_len) is np.ndarray
        and kv_indptr.dtype is _I32 and kv_indices.dtype is _I32 and kv_last_page_len.dtype is _I32
    ):  # fmt: skip
        fast = _page_table_fast(kv_indptr, kv_indices, kv_last_page_len, page_size)
        if fast is not None:
            return fast
    indptr = validate.check_indptr("kv_indptr", kv_indptr)
    batch = indptr.shape[0] - 1
    indices, last, pages = check_page_table(indptr, kv_indices, kv_last_page_len, page_size)
    nnz = int(indptr[-1])
    kv_lens = np.maximum(pages * page_size + (last - page_size), 0).astype(np.int32, copy=False)
    max_page = int(indices[:nnz].max()) if nnz else -1
    kv_range = (int(kv_lens.min()), int(kv_lens.max())) if batch else (0, 0)
    return indptr, indices, last, kv_lens, max_page, kv_range, nnz


def _page_table_fast(indptr, indices, last, page_size: int):
    """The validators' checks in two reductions, or None when any fails (the slow path then names the problem).

    With ``lp = last - page_size`` in ``[1 - page_size, 0]``, ``kv_lens = pages * page_size + lp`` is above
    ``-page_size`` exactly when no request has a negative page count (``<= 0`` only for requests without pages, whose
    length is 0). One reduction over the rows ``[lp, kv, -lp, -kv]`` gives all four bounds; the page indices seen as
    uint32 are below 2**31 exactly when none is negative, and their max is the largest page the plan reads.
    """
    if indptr.ndim != 1 or indices.ndim != 1 or last.ndim != 1:
        return None
    batch = indptr.shape[0] - 1
    if batch < 1 or last.shape[0] != batch or indptr.item(0) != 0:
        return None
    nnz = indptr.item(-1)
    n_ind = indices.shape[0]
    if n_ind < nnz:
        return None
    ps = _const32(page_size)  # a 0-d operand: NumPy calls with Python scalars cost about twice as much
    rows = np.empty((4, batch), dtype=np.int32)
    lp, kv = rows[0], rows[1]
    np.subtract(last, ps, out=lp)
    np.subtract(indptr[1:], indptr[:-1], out=kv)  # pages
    np.multiply(kv, ps, out=kv)
    np.add(kv, lp, out=kv)
    np.negative(rows[:2], out=rows[2:])
    lp_hi, kv_hi, lp_lo, kv_lo = np.maximum.reduce(rows, axis=1).tolist()
    if lp_hi > 0 or lp_lo >= page_size or kv_lo >= page_size:  # (lp_lo, kv_lo are the negated minima)
        return None
    kv_lo = -kv_lo
    if kv_lo < 0:  # requests without pages have length 0
        np.maximum(kv, 0, out=kv)
        kv_lo = 0
    if nnz:
        max_page = int(np.maximum.reduce((indices if n_ind == nnz else indices[:nnz]).view(_U32)))
    else:
        max_page = -1
    if max_page > _INT32_MAX:
        return None
    return indptr, indices, last, kv, max_page, (kv_lo, kv_hi), nnz


@functools.lru_cache(maxsize=64)
def _const32(v: int) -> np.ndarray:
    c = np.array(v, dtype=np.int32)
    c.flags.writeable = False
    return c


def _fill_words(plan: _Plan, host: np.ndarray, lay, off: dict, generation: int, memos: dict) -> None:
    """Pack the work plan and the page table into ``host`` at the word offsets ``off``; ``memos`` keeps the memo of
    ``planner.pack`` per host buffer and layout."""
    memo = memos.get(id(host))
    if memo is None or memo[0] is not host or memo[1] is not lay:
        if len(memos) >= 8:
            memos.clear()
        memo = memos[id(host)] = (host, lay, {})
    plan_layout.pack(plan.work, lay, host, generation=generation, memo=memo[2])
    b = plan.batch
    o = off["page_indptr"]
    host[o : o + b + 1] = plan.kv_indptr
    o = off["kv_lens"]
    host[o : o + b] = plan.kv_lens
    nnz, indices = plan.nnz, plan.kv_indices
    o = off["page_indices"]
    host[o : o + nnz] = indices if indices.shape[0] == nnz else indices[:nnz]


class _FixedLayout:
    fixed_layout = None
