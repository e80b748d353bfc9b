"""Checks at the public boundary. Each raises ``ValueError("<name> <rule> but <received>; <fix>")``.

Every message comes from `_fail`, so they all read the same way: the argument's name, the rule it breaks, what was
received, and how to fix it -- spelt in the caller's framework where that helps (``q.to(torch.float16)`` for torch,
``q.astype(jnp.float16)`` for JAX). Data-array checks take a `Tensor` (or anything `as_tensor` accepts); index arrays
(`check_index_array`, `check_indptr`) come back as host int32 NumPy arrays for the planner.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import numpy as np

from .arrays import Tensor, as_tensor
from .dtypes import DType, as_dtype

_INT32_MAX = np.iinfo(np.int32).max


def _fail(name: str, rule: str, received: str, fix: str | None = None) -> NoReturn:
    raise ValueError(f"{name} {rule} but {received}" + (f"; {fix}" if fix else ""))


def _one_of(items: Sequence[str]) -> str:
    """``a`` / ``a or b`` / ``one of a, b, c``."""
    if len(items) == 1:
        return items[0]
    if len(items) == 2:
        return f"{items[0]} or {items[1]}"
    return "one of " + ", ".join(items)


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def _fmt_shape(shape: Sequence[int | None]) -> str:
    dims = ["*" if n is None else str(n) for n in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _tensor(name: str, t: Any) -> Tensor:
    return t if isinstance(t, Tensor) else as_tensor(t, name)


# ---- fixes spelt in the caller's framework -------------------------------------------------------------------------


def _dtype_expr(framework: str, dtype: DType) -> str:
    if framework == "torch":
        return f"torch.{dtype.value}"
    if framework == "jax":
        return f"jnp.{dtype.value}"
    # NumPy and CuPy take NumPy dtypes; bfloat16 and fp8 come from ml_dtypes.
    if dtype in (DType.BFLOAT16, DType.FLOAT8_E4M3FN, DType.FLOAT8_E5M2):
        return f"ml_dtypes.{dtype.value}"
    return f"np.{dtype.value}" if dtype is not DType.BOOL else "np.bool_"


def cast_fix(name: str, framework: str, dtype: DType) -> str:
    """How to cast ``name`` to ``dtype`` in its framework, e.g. ``q.to(torch.float16)``."""
    if framework == "torch":
        return f"{name}.to({_dtype_expr(framework, dtype)})"
    return f"{name}.astype({_dtype_expr(framework, dtype)})"


def contiguous_fix(name: str, framework: str) -> str:
    return {
        "torch": f"{name}.contiguous()",
        "cupy": f"cupy.ascontiguousarray({name})",
        "numpy": f"np.ascontiguousarray({name})",
        "jax": f"jnp.array({name})",
    }.get(framework, f"a contiguous copy of {name}")


def to_gpu_fix(name: str, framework: str) -> str:
    return {
        "torch": f"pass {name}.cuda()",
        "jax": f"pass jax.device_put({name}, jax.devices('gpu')[0])",
        "numpy": "pass NumPy arrays for all data arrays to use the CPU reference backend, or move them all to the GPU",
    }.get(framework, f"move {name} to a CUDA device")


# ---- data arrays ---------------------------------------------------------------------------------------------------


def check_dtype(name: str, t: Any, allowed: Iterable[Any], *, hint: str | None = None) -> DType:
    """``t.dtype`` must be one of ``allowed`` (dtype-likes); returns it. ``hint`` adds another way out
    (e.g. ``"or plan() with q_dtype='float32'"``)."""
    t = _tensor(name, t)
    allowed = [as_dtype(a) for a in allowed]
    if t.dtype in allowed:
        return t.dtype
    fix = f"cast it with {cast_fix(name, t.framework, allowed[0])}" + (f" {hint}" if hint else "")
    _fail(name, f"must have dtype {_one_of([a.value for a in allowed])}", f"has dtype {t.dtype.value}", fix)


def check_same_dtype(names: Sequence[str], tensors: Sequence[Any], *, hint: str | None = None) -> DType:
    """All ``tensors`` have one dtype; returns it."""
    ts = [_tensor(n, t) for n, t in zip(names, tensors, strict=True)]
    for n, t in zip(names[1:], ts[1:], strict=True):
        if t.dtype is not ts[0].dtype:
            fix = f"cast it with {cast_fix(n, t.framework, ts[0].dtype)}" + (f" {hint}" if hint else "")
            _fail(
                f"{names[0]} and {n}",
                "must have the same dtype",
                f"{names[0]} is {ts[0].dtype.value} and {n} is {t.dtype.value}",
                fix,
            )
    return ts[0].dtype


def check_ndim(name: str, t: Any, ndim: int | Sequence[int], *, hint: str | None = None) -> None:
    """``t`` has ``ndim`` dimensions (or one of several counts)."""
    t = _tensor(name, t)
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if t.ndim not in allowed:
        _fail(
            name,
            f"must have {_one_of([str(n) for n in allowed])} dimensions",
            f"has {t.ndim} (shape {_fmt_shape(t.shape)})",
            hint,
        )


def check_shape(name: str, t: Any, expected: Sequence[int | None], *, hint: str | None = None) -> None:
    """``t.shape`` matches ``expected``; None matches any size. ``hint`` says where the expectation comes from
    (``"plan() was made for num_qo_heads=32"``)."""
    t = _tensor(name, t)
    ok = len(t.shape) == len(expected) and all(e is None or n == e for n, e in zip(t.shape, expected, strict=True))
    if not ok:
        _fail(name, f"must have shape {_fmt_shape(expected)}", f"has shape {_fmt_shape(t.shape)}", hint)


def check_cuda(name: str, t: Any) -> None:
    t = _tensor(name, t)
    if not t.is_cuda:
        _fail(name, "must be a CUDA array", f"is a host array ({t.framework})", to_gpu_fix(name, t.framework))


def check_same_device(names: Sequence[str], tensors: Sequence[Any]) -> None:
    """All ``tensors`` live on one device (kernels read every pointer from one GPU)."""
    ts = [_tensor(n, t) for n, t in zip(names, tensors, strict=True)]
    first = (ts[0].device_type, ts[0].device_id)
    for n, t in zip(names[1:], ts[1:], strict=True):
        if (t.device_type, t.device_id) != first:
            _fail(
                ", ".join(names),
                "must be on one device",
                f"{names[0]} is on {ts[0].device} and {n} is on {t.device}",
                f"move {n} to {ts[0].device}",
            )


def check_last_dim_contiguous(name: str, t: Any) -> None:
    """Kernels load rows with vector loads: the last dimension must have stride 1. Other strides are honoured."""
    t = _tensor(name, t)
    if not t.last_dim_contiguous:
        _fail(
            name,
            "must have a contiguous last dimension (stride 1)",
            f"has stride {t.strides[-1]}",
            f"pass {contiguous_fix(name, t.framework)}",
        )


def check_writable(name: str, t: Any) -> None:
    """``t`` is written to (``out=``, in-place ops): its producer must not have exported it read-only."""
    t = _tensor(name, t)
    if t.readonly:
        fix = (
            "JAX arrays are immutable: leave it out to get a new array"
            if t.framework == "jax"
            else f"pass a writable array (e.g. a copy of {name})"
        )
        _fail(name, "must be writable", "it is read-only", fix)


# ---- index arrays --------------------------------------------------------------------------------------------------


def _device_to_host(x: Any, t: Tensor) -> np.ndarray:
    """The one device-to-host copy of a device index array, made by its own framework (so it waits for the
    producer's pending writes to it, and blocks the host until the copy is done)."""
    if t.framework == "torch":
        return x.detach().cpu().numpy()
    if t.framework == "cupy":
        return x.get()
    if t.framework == "jax":
        return np.asarray(x)
    import cupy

    return cupy.from_dlpack(x).get()


def _host_index_array(name: str, x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple, range)):
        try:
            arr = np.asarray(x)
        except ValueError as exc:  # ragged nesting
            _fail(name, "must be a 1-D list of integers", f"could not be read as an array ({exc})")
        return arr.astype(np.int64) if arr.size == 0 else arr  # [] reads as float64
    if hasattr(x, "__dlpack__"):
        t = as_tensor(x, name)
        if t.dtype not in (DType.INT32, DType.INT64, DType.UINT8, DType.INT8):
            # Checked before any copy, so a wrong device array costs no synchronisation.
            _fail(
                name,
                "must have an integer dtype (int32)",
                f"has dtype {t.dtype.value}",
                f"cast it with {cast_fix(name, t.framework, DType.INT32)}",
            )
        return t.numpy() if not t.is_cuda else _device_to_host(x, t)
    if x is None:
        _fail(name, "must be given", "is None")
    _fail(name, "must be a 1-D integer array or list", f"is a {type(x).__name__}", f"pass [{name}] for one value")


def check_index_array(
    name: str,
    x: Any,
    *,
    length: int | None = None,
    min_len: int | None = None,
    nonnegative: bool = True,
    hint: str | None = None,
    used: int | None = None,
) -> np.ndarray:
    """A host ``int32`` 1-D NumPy array of the indices in ``x``.

    ``x`` may be a list, a NumPy array, a host tensor (read in place: no device synchronisation) or a device array
    (one device-to-host copy, which waits for the array's producer and blocks the host). The result may share
    memory with ``x`` when ``x`` already is a host int32 array; treat it as read-only. ``used``: only the first
    ``used`` entries are read (checked and returned); ``x`` must have at least that many, and what follows is ignored
    (a longer buffer, as FlashInfer's page tables allow).
    """
    arr = _host_index_array(name, x)
    if arr.dtype.kind not in "iu":
        fix = f"pass {name} as int32" if arr.dtype.kind != "b" else f"pass the indices of the True entries of {name}"
        _fail(name, "must have an integer dtype (int32)", f"has dtype {arr.dtype}", fix)
    if arr.ndim != 1:
        _fail(name, "must be 1-D", f"has shape {_fmt_shape(arr.shape)}", f"pass {name}.ravel() if it is flat data")
    if length is not None and arr.shape[0] != length:
        _fail(name, f"must have {_entries(length)}", f"has {arr.shape[0]}", hint)
    if used is not None:
        min_len = used if min_len is None else max(min_len, used)
    if min_len is not None and arr.shape[0] < min_len:
        _fail(name, f"must have at least {_entries(min_len)}", f"has {arr.shape[0]}", hint)
    if used is not None and arr.shape[0] > used:
        arr = arr[:used]
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if nonnegative and lo < 0:
            i = int(np.argmin(arr))
            _fail(name, "must be non-negative", f"{name}[{i}] = {lo}", hint)
        if hi > _INT32_MAX or lo < -_INT32_MAX - 1:
            i = int(np.argmax(arr)) if hi > _INT32_MAX else int(np.argmin(arr))
            _fail(name, "must fit in int32", f"{name}[{i}] = {arr[i]}", "indices beyond 2**31 - 1 are not supported")
    return np.ascontiguousarray(arr, dtype=np.int32)


def check_indptr(
    name: str, x: Any, *, length: int | None = None, last: int | None = None, hint: str | None = None
) -> np.ndarray:
    """A CSR offsets array (``indptr[i]:indptr[i+1]`` is row i's range): starts at 0, never decreases, and has
    ``length`` entries and ends at ``last`` when those are given. Returns it as host int32."""
    arr = check_index_array(name, x, length=length, min_len=1, hint=hint)
    if arr[0] != 0:
        _fail(name, "must start at 0", f"starts at {arr[0]}", f"{name}[i]:{name}[i+1] is the range of row i")
    drops = np.flatnonzero(arr[1:] < arr[:-1])
    if drops.size:
        i = int(drops[0])
        _fail(
            name,
            "must be non-decreasing",
            f"{name}[{i}] = {arr[i]} > {name}[{i + 1}] = {arr[i + 1]}",
            f"{name}[i+1] - {name}[i] is the length of row i and cannot be negative",
        )
    if last is not None and arr[-1] != last:
        _fail(name, f"must end at {last}", f"ends at {arr[-1]}", hint)
    return arr
