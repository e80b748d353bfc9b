"""Merging attention states (o, lse): two states, S states, and the split-KV partials of a plan.

lse is base 2 and float32; o is float16, bfloat16 or float32 with head dim 64, 128 or 256. GPU arrays (torch, JAX,
CuPy, any DLPack producer) run the kernels of ``kernel_src/attention/merge.cu`` on the caller's current stream,
without copies; NumPy arrays run the float64 CPU reference after the same checks (o may also be float64 there) and
come back in the same dtypes (o in the input's, lse float32).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType
from cuinfer.jit import get_kernel, register
from cuinfer.merge.specs import (
    MERGE_HEAD_DIMS,
    THREADS,
    MergePartialsParams,
    MergeStatesParams,
    MergeTwoParams,
    all_specs,
    instance,
    merge_spec,
)
from cuinfer.runtime.calls import Call, start

register("merge", all_specs)

_VALUE_DTYPES = (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32)
_PAIR = ("o_a", "lse_a", "o_b", "lse_b")


def _check_values(name: str, t: Tensor, ndim: int) -> None:
    validate.check_ndim(name, t, ndim)
    # the CPU reference computes in float64 anyway, so NumPy users may also pass float64 states
    validate.check_dtype(name, t, _VALUE_DTYPES if t.is_cuda else _VALUE_DTYPES + (DType.FLOAT64,))
    validate.check_last_dim_contiguous(name, t)
    if t.shape[-1] not in MERGE_HEAD_DIMS:
        raise ValueError(
            f"{name} has head dim {t.shape[-1]} but merge kernels support head dims "
            f"{', '.join(map(str, MERGE_HEAD_DIMS))}; pad the last dimension to one of them"
        )
    if not t.is_cuda:
        return
    if t.ptr % 16:
        raise ValueError(
            f"{name} starts at an address that is not 16-byte aligned (0x{t.ptr:x}); the merge kernels read 16-byte "
            f"vectors: pass a contiguous copy of {name}"
        )
    bad = [s for s in t.strides[:-1] if (s * t.dtype.itemsize) % 16]
    if bad:
        raise ValueError(
            f"{name} has strides {t.strides} (elements) whose rows are not 16-byte aligned; pass a contiguous copy"
        )


def _grid(rows: int, rows_per_block: int, device_id: int) -> int:
    """Enough blocks to cover the rows, capped at 16 resident blocks per SM (the kernels grid-stride beyond that)."""
    from cuinfer.runtime.device import device_info

    cap = 16 * device_info(device_id).sm_count
    return max(1, min(cap, -(-rows // rows_per_block)))


def _rows_per_block(dtype: DType, head_dim: int) -> int:
    return THREADS // (head_dim // (16 // dtype.itemsize))


def _kernel(kind: str, dtype: DType, head_dim: int, device_id: int):
    return get_kernel(merge_spec(dtype.value, head_dim), instance(kind, dtype.value, head_dim), device_id)


def merge_state(o_a: Any, lse_a: Any, o_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """``[o_a, lse_a] ⊕ [o_b, lse_b]``; o ``[L, H, D]``, lse ``[L, H]`` float32 (base 2). Returns new (o, lse): o in
    the input dtype, lse float32 (NumPy inputs too)."""
    call, ta = start(o_a, "o_a")
    tb, sa, sb = call.tensor(o_b, "o_b"), call.tensor(lse_a, "lse_a"), call.tensor(lse_b, "lse_b")
    _check_pair(ta, sa, tb, sb, *_PAIR)
    o = call.empty(ta.shape, ta.dtype)
    lse = call.empty(ta.shape[:2], DType.FLOAT32)
    if call.is_host:
        _write(o, lse, reference.merge_state(ta.numpy(), sa.numpy(), tb.numpy(), sb.numpy()))
    else:
        _launch_two(call, ta, sa, tb, sb, o, lse, None)
    return call.give(o), call.give(lse)


def merge_state_in_place(o: Any, lse: Any, o_other: Any, lse_other: Any, mask: Any = None) -> None:
    """``[o, lse] ← [o, lse] ⊕ [o_other, lse_other]`` in place; rows whose ``mask`` [L] (bool) is False stay as they
    are."""
    call, to = start(o, "o")
    tl, tb, sb = call.tensor(lse, "lse"), call.tensor(o_other, "o_other"), call.tensor(lse_other, "lse_other")
    _check_pair(to, tl, tb, sb, "o", "lse", "o_other", "lse_other")
    validate.check_writable("o", to)
    validate.check_writable("lse", tl)
    tm = call.optional(mask, "mask")
    if tm is not None:
        validate.check_dtype("mask", tm, (DType.BOOL,))
        validate.check_shape("mask", tm, (to.shape[0],))
        if tm.strides[0] != 1 and tm.shape[0] > 1:
            raise ValueError(f"mask must be contiguous but has stride {tm.strides[0]}; pass a contiguous copy")
        validate.check_same_device(("o", "mask"), (to, tm))
    if call.is_host:
        reference.merge_state_in_place(
            to.numpy(), tl.numpy(), tb.numpy(), sb.numpy(), None if tm is None else tm.numpy()
        )
        return
    _launch_two(call, to, tl, tb, sb, to, tl, tm)


def _write(o: Tensor, lse: Tensor, merged: tuple) -> None:
    """The reference's float64 (o, lse) into the host outputs (o in its dtype, lse float32)."""
    out_o, out_lse = o.numpy(), lse.numpy()
    out_o[...] = merged[0].astype(out_o.dtype)
    out_lse[...] = merged[1].astype(np.float32)


def _check_pair(oa: Tensor, la: Tensor, ob: Tensor, lb: Tensor, noa: str, nla: str, nob: str, nlb: str) -> None:
    _check_values(noa, oa, 3)
    _check_values(nob, ob, 3)
    validate.check_shape(nob, ob, oa.shape, hint=f"it must match {noa}")
    validate.check_same_dtype((noa, nob), (oa, ob))
    for name, t in ((nla, la), (nlb, lb)):
        validate.check_dtype(name, t, (DType.FLOAT32,))
        validate.check_shape(name, t, oa.shape[:2], hint=f"lse is [rows, heads] of {noa}")
    validate.check_same_device((noa, nla, nob, nlb), (oa, la, ob, lb))


def _launch_two(call: Call, a: Tensor, la: Tensor, b: Tensor, lb: Tensor, o: Tensor, lo: Tensor, mask) -> None:
    rows, heads, d = a.shape
    if rows * heads == 0:
        return
    p = MergeTwoParams.pack(
        o_a=a.ptr, lse_a=la.ptr, o_b=b.ptr, lse_b=lb.ptr, o=o.ptr, lse=lo.ptr, mask=0 if mask is None else mask.ptr,
        num_rows=rows, num_heads=heads,
        o_a_s0=a.strides[0], o_a_s1=a.strides[1], o_b_s0=b.strides[0], o_b_s1=b.strides[1],
        o_s0=o.strides[0], o_s1=o.strides[1],
        lse_a_s0=la.strides[0], lse_a_s1=la.strides[1], lse_b_s0=lb.strides[0], lse_b_s1=lb.strides[1],
        lse_s0=lo.strides[0], lse_s1=lo.strides[1],
    )  # fmt: skip
    k = _kernel("merge_two", a.dtype, d, call.device_id)
    k.launch(_grid(rows * heads, _rows_per_block(a.dtype, d), call.device_id), THREADS, (p,), stream=call.stream)


def merge_states(o: Any, lse: Any) -> tuple[Any, Any]:
    """Merge S states per row: o ``[L, S, H, D]``, lse ``[L, S, H]`` float32 -> (o ``[L, H, D]``, lse ``[L, H]``).

    States with lse = -inf are empty and contribute nothing (their o is never read); a row whose states are all empty
    gives o = 0, lse = -inf. o comes back in the input dtype, lse float32 (NumPy inputs too).
    """
    call, to = start(o, "o")
    tl = call.tensor(lse, "lse")
    _check_states(to, tl)
    rows, states, heads, d = to.shape
    out = call.empty((rows, heads, d), to.dtype)
    out_lse = call.empty((rows, heads), DType.FLOAT32)
    if call.is_host:
        _write(out, out_lse, reference.merge_states(to.numpy(), tl.numpy()))
    elif rows * heads:
        p = MergeStatesParams.pack(
            o_in=to.ptr, lse_in=tl.ptr, o=out.ptr, lse=out_lse.ptr,
            num_rows=rows, num_heads=heads, num_states=states,
            o_in_s0=to.strides[0], o_in_s1=to.strides[1], o_in_s2=to.strides[2],
            lse_in_s0=tl.strides[0], lse_in_s1=tl.strides[1], lse_in_s2=tl.strides[2],
            o_s0=out.strides[0], o_s1=out.strides[1], lse_s0=out_lse.strides[0], lse_s1=out_lse.strides[1],
        )  # fmt: skip
        k = _kernel("merge_states", to.dtype, d, call.device_id)
        grid = _grid(rows * heads, _rows_per_block(to.dtype, d), call.device_id)
        k.launch(grid, THREADS, (p,), stream=call.stream)
    return call.give(out), call.give(out_lse)


def _check_states(to: Tensor, tl: Tensor) -> None:
    _check_values("o", to, 4)
    validate.check_dtype("lse", tl, (DType.FLOAT32,))
    validate.check_shape("lse", tl, to.shape[:3], hint="lse is [rows, states, heads] of o")
    validate.check_same_device(("o", "lse"), (to, tl))


def launch_merge_partials(
    *,
    device_id: int,
    stream: int,
    num_targets_ptr: int,
    merge_indptr_ptr: int,
    merge_src_ptr: int,
    merge_dst_token_ptr: int,
    merge_dst_head_ptr: int,
    partial_o_ptr: int,
    partial_lse_ptr: int,
    o: Tensor,
    lse: Tensor | None,
    grid: int,
) -> None:
    """Merge a plan's split-KV partials (fp32 rows of the workspace) into ``o [tokens, heads, Dv]`` / ``lse``.

    Every pointer is fixed for a given plan layout and the target count is read on the device, so this launch can be
    captured in a CUDA graph once and replayed after re-planning. ``grid`` stays fixed too (the kernel grid-strides).
    """
    d = o.shape[-1]
    p = MergePartialsParams.pack(
        num_targets=num_targets_ptr, merge_indptr=merge_indptr_ptr, merge_src=merge_src_ptr,
        merge_dst_token=merge_dst_token_ptr, merge_dst_head=merge_dst_head_ptr,
        partial_o=partial_o_ptr, partial_lse=partial_lse_ptr, o=o.ptr, lse=0 if lse is None else lse.ptr,
        o_s0=o.strides[0], o_s1=o.strides[1],
        lse_s0=0 if lse is None else lse.strides[0], lse_s1=0 if lse is None else lse.strides[1],
    )  # fmt: skip
    k = _kernel("merge_partials", o.dtype, d, device_id)
    k.launch(grid, THREADS, (p,), stream=stream)


def merge_partials_kernel(dtype: DType, head_dim: int, device_id: int) -> tuple[Any, int]:
    """(kernel, threads per block) of the plan-partials merge, for callers that cache their launches."""
    return _kernel("merge_partials", dtype, head_dim, device_id), THREADS


def merge_partials_rows_per_block(dtype: DType, head_dim: int) -> int:
    return _rows_per_block(dtype, head_dim)


__all__ = ["merge_state", "merge_state_in_place", "merge_states", "launch_merge_partials"]
