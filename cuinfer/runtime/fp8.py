"""fp8 KV caches at the boundary: the element types a plan takes, a cache's dtype against the plan's (CuPy holds fp8 as
``uint8``), and run()'s dequantisation scales. Shared by decode and prefill; docs/fp8.md is the user's side.

Scales (``k_scale`` / ``v_scale`` of run(): the cache holds ``k / k_scale`` and ``v / v_scale``):

* a real number: per tensor, folded on the host into the kernels' ``sm_scale`` (k) and output scale (v): free;
* an array of 1 or ``num_kv_heads`` float32 values (per tensor, or per KV head): on the GPU a device array of the
  call's device, read by the fp8 kernels at each item (so a CUDA graph replays with the array's current values); on
  the CPU reference a NumPy array.

Scales dequantise fp8 caches. With a 16-bit cache, arrays raise, and so do numbers in prefill (a 16-bit cache's
logits are rescaled with ``sm_scale`` of plan()); decode takes numbers with any cache (``k_scale`` multiplies
``sm_scale``, ``v_scale`` the output: what ``BatchDecode.run`` and the FlashInfer-compatible decode always took).
Both routes check them alike (``check_scale_args`` at run(), then ``check_scales`` resolves them).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cuinfer.formats.kv import KV
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType, as_dtype

KV_DTYPES = (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT8_E4M3FN, DType.FLOAT8_E5M2)


def kv_dtype_of(x: Any) -> DType:
    """A plan's ``kv_dtype``: float16, bfloat16, float8_e4m3fn or float8_e5m2 (names, NumPy / ml_dtypes, torch or JAX
    dtypes). ``uint8`` is refused: the plan must say which fp8 format the bytes of a CuPy cache hold."""
    dt = as_dtype(x)
    if dt is DType.UINT8:
        raise ValueError(
            "kv_dtype=uint8: say which fp8 format the cache holds, kv_dtype='float8_e4m3fn' or 'float8_e5m2' (a uint8 "
            "cache, as CuPy holds fp8, is then read as that format)"
        )
    if dt not in KV_DTYPES:
        raise ValueError(
            f"kv_dtype must be float16, bfloat16, float8_e4m3fn or float8_e5m2 but is {dt.value}; cast the cache"
        )
    return dt


def as_kv_dtype(t: Tensor, kv_dtype: DType, name: str) -> Tensor:
    """``t`` as the plan's ``kv_dtype`` when it is ``uint8`` (CuPy holds fp8 as bytes): read as the plan's fp8
    format, or a ValueError for a 16-bit plan. Any other dtype is returned as it is: the wrapper's dtype check, which
    names the cast, sees it."""
    if t.dtype is not DType.UINT8:
        return t
    if kv_dtype.is_float8:
        return t.reinterpret(kv_dtype)
    raise ValueError(
        f"{name} is uint8 but plan() was made for kv_dtype={kv_dtype.value}; a uint8 cache is read as fp8 codes "
        "(CuPy has no fp8 dtype): call plan() with kv_dtype='float8_e4m3fn' or 'float8_e5m2'"
    )


def match_cache_dtype(kv: KV, kv_dtype: DType, name: str = "kv_cache") -> KV:
    """``kv`` with a ``uint8`` K / V (CuPy's fp8) read as the plan's fp8 format (``as_kv_dtype``); the same view
    otherwise."""
    if kv.k.dtype is DType.UINT8 or kv.v.dtype is DType.UINT8:
        return replace(kv, k=as_kv_dtype(kv.k, kv_dtype, name), v=as_kv_dtype(kv.v, kv_dtype, name))
    return kv


def host_cache(x: Any, kv_dtype: DType) -> Any:
    """A NumPy cache (array or tuple) for the reference: ``uint8`` arrays viewed as the plan's fp8 format."""
    if isinstance(x, (tuple, list)):
        return type(x)(host_cache(a, kv_dtype) for a in x)
    if isinstance(x, np.ndarray) and x.dtype == np.uint8 and kv_dtype.is_float8:
        return x.view(kv_dtype.numpy)
    return x


@dataclass(frozen=True)
class KVScales:
    """run()'s scales, resolved: host factors (folded into sm_scale / the output scale) and, for array scales, what
    the kernels read (``k_ptr`` / ``v_ptr``: float32 device arrays; ``stride`` 0 for one value, 1 per KV head) or the
    reference multiplies by (``k_host`` / ``v_host``: float64 per KV head)."""

    k: float = 1.0
    v: float = 1.0
    k_ptr: int = 0
    v_ptr: int = 0
    k_stride: int = 0
    v_stride: int = 0
    k_host: np.ndarray | None = None
    v_host: np.ndarray | None = None
    keep: tuple = ()  # the Tensors behind the pointers (alive while the launch state holds them)

    @property
    def key(self) -> tuple:
        """What the kernel parameters depend on (the launch state rebuilds them when it changes)."""
        return (self.k, self.v, self.k_ptr, self.v_ptr, self.k_stride, self.v_stride)


NO_SCALES = KVScales()


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _number(name: str, x: Any) -> float:
    v = float(x)
    if not math.isfinite(v) or v == 0.0:
        raise ValueError(f"{name} must be a finite, nonzero number (or None for 1.0) but is {x!r}")
    return v


def check_scale_args(kv_dtype: DType, k_scale: Any, v_scale: Any, *, numbers_16bit: bool = False) -> None:
    """run()'s ``k_scale`` / ``v_scale`` against a plan of ``kv_dtype``, alike on both routes: a bool, a string or
    another non-number is a TypeError, a number must be finite and nonzero, and a 16-bit cache takes no arrays and
    numbers other than 1.0 only where ``numbers_16bit`` (decode). Arrays are checked when they are resolved
    (``check_scales``)."""
    given, arrays = [], []
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if x is None:
            continue
        given.append(name)
        if isinstance(x, (bool, np.bool_, str, bytes)) or (
            isinstance(x, numbers.Number) and not isinstance(x, numbers.Real)
        ):
            raise TypeError(
                f"{name} must be a number or an array of scales (or None for 1.0) but is {x!r} (a {type(x).__name__})"
            )
        if _is_number(x) or (isinstance(x, np.ndarray) and x.ndim == 0):
            if _number(name, x) == 1.0:
                given.pop()  # (1.0 changes nothing on any cache: let by)
        else:
            arrays.append(name)
    if not given or kv_dtype.is_float8 or (numbers_16bit and not arrays):
        return
    if numbers_16bit:  # (decode: numbers rescale a 16-bit cache; arrays are per-KV-head fp8 dequantisation)
        verb = "dequantises" if len(arrays) == 1 else "dequantise"
        raise ValueError(
            f"{' and '.join(arrays)} as {'an array' if len(arrays) == 1 else 'arrays'} (per KV head) {verb} fp8 "
            f"caches but plan() was made for kv_dtype={kv_dtype.value}; pass a number for a 16-bit cache (k_scale "
            "multiplies sm_scale, v_scale the output), or plan an fp8 cache (kv_dtype='float8_e4m3fn' / "
            "'float8_e5m2')"
        )
    verb = "dequantises" if len(given) == 1 else "dequantise"
    raise ValueError(
        f"{' and '.join(given)} {verb} fp8 caches but plan() was made for kv_dtype={kv_dtype.value}; leave "
        "them out for a 16-bit cache (rescale its logits with plan(sm_scale=...)), or plan an fp8 cache "
        "(kv_dtype='float8_e4m3fn' / 'float8_e5m2')"
    )


def check_scales(
    kv_dtype: DType, k_scale: Any, v_scale: Any, *, num_kv_heads: int, call: Any = None, gpu: bool,
    numbers_16bit: bool = False,
) -> KVScales:  # fmt: skip
    """Resolve run()'s ``k_scale`` / ``v_scale`` for a plan of ``kv_dtype`` (``call``: the GPU call importing device
    arrays; ``gpu=False``: the CPU reference, NumPy arrays; ``numbers_16bit``: see ``check_scale_args``). Raises
    before any launch."""
    if k_scale is None and v_scale is None:
        return NO_SCALES
    check_scale_args(kv_dtype, k_scale, v_scale, numbers_16bit=numbers_16bit)
    out: dict[str, Any] = {}
    keep = []
    for which, name, x in (("k", "k_scale", k_scale), ("v", "v_scale", v_scale)):
        if x is None:
            continue
        if _is_number(x) or (isinstance(x, np.ndarray) and x.ndim == 0):
            out[which] = _number(name, x)
            continue
        if gpu and not isinstance(x, (np.ndarray, list, tuple)):
            t = call.tensor(x, name)
            _check_array(name, t, num_kv_heads)
            if not t.is_cuda:
                raise ValueError(
                    f"{name} is a host array but run() runs on cuda:{call.device_id}; pass a float32 array on the "
                    "GPU (or a number for one scale)"
                )
            out[f"{which}_ptr"], out[f"{which}_stride"] = t.ptr, 0 if t.size == 1 else 1
            keep.append(t)
            continue
        a = np.asarray(x)
        if a.dtype.kind not in "fiu" or a.ndim != 1 or a.shape[0] not in (1, num_kv_heads):
            raise ValueError(
                f"{name} must be a number or a 1-D array of 1 or num_kv_heads={num_kv_heads} values but has shape "
                f"{a.shape} and dtype {a.dtype}"
            )
        if not np.all(np.isfinite(a)) or np.any(a == 0):
            raise ValueError(f"{name} must hold finite, nonzero values but holds {a}")
        if gpu:
            if a.shape[0] != 1:
                raise ValueError(
                    f"{name} per KV head must be a float32 array on the GPU (cuda:{call.device_id}) for a GPU run but "
                    "is a host array; move it to the GPU"
                )
            out[which] = float(a[0])
            continue
        out[f"{which}_host"] = np.broadcast_to(a.astype(np.float64), (num_kv_heads,))
    return KVScales(**out, keep=tuple(keep))


def _check_array(name: str, t: Tensor, num_kv_heads: int) -> None:
    if t.dtype is not DType.FLOAT32 or t.ndim > 1 or t.size not in (1, num_kv_heads):
        raise ValueError(
            f"{name} must be a number or a float32 array of 1 or num_kv_heads={num_kv_heads} values but has shape "
            f"{t.shape} and dtype {t.dtype.value}"
        )
    if t.size > 1 and t.strides[-1] != 1:
        raise ValueError(f"{name} must be contiguous but has strides {t.strides}; pass a contiguous copy")


def reference_scales(s: KVScales) -> dict[str, Any]:
    """``k_scale`` / ``v_scale`` keywords of the ``cuinfer.reference`` functions (a float, or float64 per KV head)."""
    return dict(
        k_scale=s.k if s.k_host is None else s.k_host * s.k, v_scale=s.v if s.v_host is None else s.v_host * s.v
    )
