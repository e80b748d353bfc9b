"""The outputs of a run(): the caller's ``out`` / ``lse`` checked or new arrays allocated in its framework (on both
routes: ``call`` is a GPU ``Call`` or the CPU reference's ``HOST``), and the reference results written into them in
the dtypes the GPU path produces."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.formats.kv import check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType

# the dtypes plan() takes for q, k/v and o: a fix may suggest re-planning only for one of these
PLANNABLE = (DType.FLOAT16, DType.BFLOAT16)


def replan_hint(arg: str, got: DType) -> str:
    """`` or call plan() with <arg>='<got>'`` when plan() would take it (``kv_dtype``: fp8 too), else nothing (a fix
    suggests only what works)."""
    ok = got in PLANNABLE or (arg == "kv_dtype" and got.is_float8)
    return f" or call plan() with {arg}='{got.value}'" if ok else ""


def check_out_dtype(o_dtype: DType, to: Tensor) -> None:
    if to.dtype is not o_dtype:
        raise ValueError(
            f"out has dtype {to.dtype.value} but plan() was made for o_dtype={o_dtype.value}; pass an "
            f"out of dtype {o_dtype.value}{replan_hint('o_dtype', to.dtype)}"
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


def host_outputs(o64: np.ndarray, lse64: np.ndarray, to: Tensor, tl: Tensor | None) -> Any:
    """Write reference results into the host outputs of ``prepare_outputs`` (o in their dtype, lse float32) and
    return them as run() does: ``o``, or ``(o, lse)`` when ``tl`` is given."""
    o = to.numpy()
    o[...] = o64.astype(o.dtype)
    if tl is None:
        return to.obj
    tl.numpy()[...] = lse64.astype(np.float32)
    return to.obj, tl.obj
