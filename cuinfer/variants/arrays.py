"""Array parameters of variants, given at run(): ``run(..., variant_arrays={"sinks": s})``.

A variant's ``Param(name, kind, per=...)`` is an array with one ``kind`` element per query head, KV head or request
of the plan. run() checks every such array before anything is launched (rule, value received, fix): each is given
once, under the parameter's name (or ``"variant.param"`` when two variants of the plan share a name), as a 1-D
contiguous array of the parameter's dtype and length, on the call's GPU (any framework, imported through DLPack on
the call's stream, no copy) or, for NumPy inputs, on the host. The kernels read it through a typed pointer in
``VariantParams`` (``Rendered.pack``'s ``arrays``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.interop.dtypes import DType
from cuinfer.variants.render import Rendered

DTYPES = {"i32": DType.INT32, "i64": DType.INT64, "f32": DType.FLOAT32, "f64": DType.FLOAT64}
_COUNT_NAMES = {"qo_head": "num_qo_heads", "kv_head": "num_kv_heads", "request": "batch_size"}
_ELEMENT = {"qo_head": "query head", "kv_head": "KV head", "request": "request"}


def _keys(chain: Rendered) -> dict[str, tuple[str, str]]:
    """Accepted ``variant_arrays`` keys -> (variant, param): ``variant.param`` always, ``param`` when unique."""
    params = chain.array_params
    count: dict[str, int] = {}
    for _, q in params:
        count[q.name] = count.get(q.name, 0) + 1
    keys = {}
    for v, q in params:
        keys[f"{v}.{q.name}"] = (v, q.name)
        if count[q.name] == 1:
            keys[q.name] = (v, q.name)
    return keys


def _describe(chain: Rendered, counts: dict[str, int]) -> str:
    keys = {slot: k for k, slot in _keys(chain).items() if "." not in k}
    parts = []
    for v, q in chain.array_params:
        key = keys.get((v, q.name), f"{v}.{q.name}")
        parts.append(f"{key!r}: {DTYPES[q.kind].value} [{counts[q.per]}] (one per {_ELEMENT[q.per]})")
    return "{" + ", ".join(parts) + "}"


def resolve(chain: Rendered, variant_arrays: Any, counts: dict[str, int]) -> dict[tuple[str, str], Any]:
    """``variant_arrays`` of run() by (variant, param), every array parameter of ``chain`` given exactly once.
    ``counts``: the plan's ``{"qo_head": num_qo_heads, "kv_head": num_kv_heads, "request": batch}``."""
    params = chain.array_params
    if not params:
        if variant_arrays:
            raise ValueError(
                f"variant_arrays names {sorted(variant_arrays)} but the variants of this plan ({chain.name}) take no "
                "array parameters; leave variant_arrays out"
            )
        return {}
    if variant_arrays is None:
        raise ValueError(
            f"the variants of this plan ({chain.name}) read arrays given at run(): pass "
            f"variant_arrays={_describe(chain, counts)}"
        )
    if not isinstance(variant_arrays, dict):
        raise TypeError(f"variant_arrays must be a dict {{param name: array}} but is {type(variant_arrays).__name__}")
    keys = _keys(chain)
    out: dict[tuple[str, str], Any] = {}
    for key, arr in variant_arrays.items():
        slot = keys.get(key)
        if slot is None:
            raise ValueError(
                f"variant_arrays names {key!r}, which is no array parameter of this plan's variants; they take "
                f"{_describe(chain, counts)}"
            )
        if slot in out:
            raise ValueError(f"variant_arrays gives {slot[0]}.{slot[1]} twice (as {slot[1]!r} and as "
                             f"'{slot[0]}.{slot[1]}'); give it once")  # fmt: skip
        out[slot] = arr
    missing = [f"{v}.{q.name}" for v, q in params if (v, q.name) not in out]
    if missing:
        raise ValueError(
            f"variant_arrays lacks {missing}: the variants of this plan read {_describe(chain, counts)} at run()"
        )
    return out


def _check(name: str, t: Tensor, kind: str, per: str, n: int) -> None:
    validate.check_ndim(name, t, 1, hint=f"it holds one element per {_ELEMENT[per]}")
    validate.check_shape(
        name, t, (n,), hint=f"one element per {_ELEMENT[per]}: the plan has {_COUNT_NAMES[per]}={n}"
    )  # fmt: skip
    validate.check_dtype(name, t, (DTYPES[kind],))
    if n > 1 and t.strides[0] != 1:
        raise ValueError(
            f"{name} must be contiguous (stride 1) but has stride {t.strides[0]}; pass "
            f"{validate.contiguous_fix(name, t.framework)}"
        )


def device_arrays(chain: Rendered, variant_arrays: Any, counts: dict[str, int], call: Any) -> dict:
    """run()'s arrays on the GPU: ``{(variant, param): Tensor}`` checked (shape, dtype, contiguous, the call's
    device), or ``{}`` when the chain has no array parameter."""
    raw = resolve(chain, variant_arrays, counts)
    if not raw:
        return raw
    kinds = {(v, q.name): q for v, q in chain.array_params}
    out = {}
    for slot, arr in raw.items():
        q = kinds[slot]
        name = f"variant_arrays[{q.name!r}]"
        t = call.tensor(arr, name)
        validate.check_cuda(name, t)
        if t.device_id != call.device_id:
            raise ValueError(
                f"{name} must be on the device of q (cuda:{call.device_id}) but is on {t.device}; move it there"
            )
        _check(name, t, q.kind, q.per, counts[q.per])
        out[slot] = t
    return out


def host_arrays(chain: Rendered, variant_arrays: Any, counts: dict[str, int]) -> dict:
    """run()'s arrays for the CPU reference (NumPy inputs): ``{(variant, param): np.ndarray}``, checked as on the
    GPU but on the host."""
    raw = resolve(chain, variant_arrays, counts)
    kinds = {(v, q.name): q for v, q in chain.array_params}
    out = {}
    for slot, arr in raw.items():
        q = kinds[slot]
        name = f"variant_arrays[{q.name!r}]"
        t = as_tensor(arr, name)
        if t.is_cuda:
            raise ValueError(
                f"{name} is on {t.device} but the other inputs are NumPy arrays (the CPU reference backend); pass "
                "a NumPy array"
            )
        _check(name, t, q.kind, q.per, counts[q.per])
        out[slot] = np.asarray(t.numpy())
    return out


def pointers(arrays: dict) -> dict[tuple[str, str], int]:
    """``{(variant, param): device address}`` of checked device arrays."""
    return {slot: t.ptr for slot, t in arrays.items()}
