"""The outputs of a run(): the caller's ``out`` / ``lse`` checked or new arrays allocated in its framework, and the
reference results returned in the dtypes the GPU path would produce."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.formats.kv import check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType


def check_out_dtype(o_dtype: DType, to: Tensor) -> None:
    if to.dtype is not o_dtype:
        raise ValueError(
            f"out has dtype {to.dtype.value} but plan() was made for o_dtype={o_dtype.value}; pass an "
            f"out of dtype {o_dtype.value} or call plan() with o_dtype='{to.dtype.value}'"
        )


def prepare_outputs(
    call: Any, shape: tuple[int, ...], o_dtype: DType, out: Any, lse: Any, want_lse: bool
) -> tuple[Tensor, Tensor | None]:
    """(o, lse or None) Tensors for a run(): the caller's ``out`` / ``lse`` checked, or new arrays in its framework."""
    if out is None:
        to = call.empty(shape, o_dtype)
    else:
        to = call.tensor(out, "out")
        validate.check_shape("out", to, shape)
        check_out_dtype(o_dtype, to)
        validate.check_writable("out", to)
        check_aligned("out", to, (0, 1))
    tl = None
    if want_lse:
        if lse is None:
            tl = call.empty(shape[:2], DType.FLOAT32)
        else:
            tl = call.tensor(lse, "lse")
            validate.check_shape("lse", tl, shape[:2])
            validate.check_dtype("lse", tl, (DType.FLOAT32,))
            validate.check_writable("lse", tl)
    return to, tl


def host_outputs(o64: np.ndarray, lse64: np.ndarray, o_dtype: DType, out: Any, lse: Any, want_lse: bool) -> Any:
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
