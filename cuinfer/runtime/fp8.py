"""fp8 KV caches at the boundary: the element types a plan takes, a cache's dtype against the plan's (CuPy holds fp8 as
``uint8``), and run()'s dequantisation scales. Shared by decode and prefill; docs/fp8.md is the user's side.

Scales (``k_scale`` / ``v_scale`` of run(): the cache holds ``k / k_scale`` and ``v / v_scale``):

* a real number: per tensor, folded on the host into the kernels' ``sm_scale`` (k) and output scale (v): free;
* an array of 1 or ``num_kv_heads`` float32 values (per tensor, or per KV head): on the GPU a device array of the
  call's device, read by the fp8 kernels at each item (so a CUDA graph replays with the array's current values); on
  the CPU reference a NumPy array.

Scales dequantise fp8 caches only: given with a 16-bit cache they raise (a 16-bit cache's logits are rescaled with
``sm_scale`` of plan()).
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


def match_cache_dtype(kv: KV, kv_dtype: DType, name: str = "kv_cache") -> KV:
    """``kv`` as the plan's ``kv_dtype``: the same view, or a ``uint8`` cache (CuPy's fp8) read as the plan's fp8
    format; ValueError for anything else, before any launch."""
    if check_cache_dtype(kv.k.dtype, kv_dtype, name):
        return replace(kv, k=kv.k.reinterpret(kv_dtype), v=kv.v.reinterpret(kv_dtype))
    return kv


def check_cache_dtype(got: DType, kv_dtype: DType, name: str = "kv_cache") -> bool:
    """Whether a cache of dtype ``got`` is read as the plan's ``kv_dtype`` by reinterpreting it (a ``uint8`` cache and
    an fp8 plan); False when it is that dtype; ValueError otherwise."""
    if got is kv_dtype:
        return False
    if got is DType.UINT8 and kv_dtype.is_float8:
        return True
    if got is DType.UINT8:
        raise ValueError(
            f"{name} is uint8 but plan() was made for kv_dtype={kv_dtype.value}; a uint8 cache is read as fp8 codes "
            "(CuPy has no fp8 dtype): call plan() with kv_dtype='float8_e4m3fn' or 'float8_e5m2'"
        )
    fix = f"call plan() with kv_dtype='{got.value}'"
    if got.is_float8 or kv_dtype.is_float8:
        fix += " (fp8 caches: the plan names the format the cache holds)"
    raise ValueError(f"{name} has dtype {got.value} but plan() was made for kv_dtype={kv_dtype.value}; {fix}")


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
        raise ValueError(f"{name} must be a finite, nonzero number (the cache holds values / {name}) but is {x!r}")
    return v


def check_scales(
    kv_dtype: DType, k_scale: Any, v_scale: Any, *, num_kv_heads: int, call: Any = None, gpu: bool
) -> KVScales:
    """Resolve run()'s ``k_scale`` / ``v_scale`` for a plan of ``kv_dtype`` (``call``: the GPU call importing device
    arrays; ``gpu=False``: the CPU reference, NumPy arrays). Raises before any launch."""
    if k_scale is None and v_scale is None:
        return NO_SCALES
    if not kv_dtype.is_float8:
        given = [n for n, s in (("k_scale", k_scale), ("v_scale", v_scale)) if s is not None]
        verb = "dequantises" if len(given) == 1 else "dequantise"
        raise ValueError(
            f"{' and '.join(given)} {verb} fp8 caches but plan() was made for kv_dtype={kv_dtype.value}; leave "
            "them out for a 16-bit cache (rescale its logits with plan(sm_scale=...)), or plan an fp8 cache "
            "(kv_dtype='float8_e4m3fn' / 'float8_e5m2')"
        )
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
