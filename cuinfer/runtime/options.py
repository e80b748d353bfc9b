"""The attention options every wrapper accepts (docs/api.md semantics), validated in one place."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.interop.dtypes import DType, as_dtype

POS_ENCODINGS = ("none", "rope_llama", "alibi")
KV_LAYOUTS = ("NHD", "HND")
INT32_MAX = 2**31 - 1


def check_int(name: str, v: Any, *, lo: int = 1, hi: int = INT32_MAX, rule: str = "a positive integer") -> int:
    """A count or index argument as a Python int: an int or a NumPy integer (never a bool or a float, even a whole
    one: ``num_qo_heads=8.0`` is a mistake to show, not to round) in ``[lo, hi]``; TypeError for the wrong type,
    ValueError naming ``rule`` for a value out of range."""
    if type(v) is not int:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be an integer but is {v!r} (a {type(v).__name__}); pass a Python int")
        v = int(v)
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be {rule} but is {v}" + (f" (at most {hi})" if v > hi else ""))
    return v


def check_window_left(window_left: Any) -> int:
    return check_int("window_left", window_left, lo=-1, rule="an integer >= -1 (-1 disables the window)")


def kv_layout_name(kv_layout: Any) -> str:
    """'NHD' or 'HND' from a string (any case) or an enum whose value is one of them."""
    name = getattr(kv_layout, "value", kv_layout)
    if isinstance(name, str) and name.upper() in KV_LAYOUTS:
        return name.upper()
    raise ValueError(f"kv_layout must be 'NHD' or 'HND' but is {kv_layout!r}")


def half_dtype(name: str, x: Any, *, what: str) -> DType:
    """A float16 / bfloat16 dtype argument of q or o (``what`` names the kernels in messages, e.g. "the decode
    kernels"); fp8 is a KV-cache format only (``kv_dtype``: cuinfer.runtime.fp8)."""
    dt = as_dtype(x)
    if dt.is_float8:
        raise ValueError(
            f"{name}={dt.value}: {what} take q and o in float16 or bfloat16; fp8 is for the KV cache "
            f"(kv_dtype='{dt.value}' with {name}='bfloat16' or 'float16')"
        )
    if dt not in (DType.FLOAT16, DType.BFLOAT16):
        raise ValueError(f"{name} must be float16 or bfloat16 but is {dt.value}")
    return dt


@dataclass(frozen=True)
class AttentionOptions:
    """The checked attention options of a plan (decode plans are never causal); built once per set of plan()
    arguments, then read by the kernel key, the launch parameters and the CPU reference."""

    causal: bool
    sm_scale: float
    logits_soft_cap: float
    window_left: int
    pos_encoding: str
    rope_scale: float
    rope_theta: float

    def reference_kwargs(self) -> dict[str, Any]:
        """The options as keywords of the ``cuinfer.reference`` functions, ``causal`` aside (batch decode takes
        none)."""
        return dict(
            sm_scale=self.sm_scale, logits_soft_cap=self.logits_soft_cap, window_left=self.window_left,
            pos_encoding=self.pos_encoding, rope_scale=self.rope_scale, rope_theta=self.rope_theta,
        )  # fmt: skip


def check_options(
    *, what: str, causal: Any, sm_scale: Any, logits_soft_cap: Any, window_left: Any, pos_encoding: Any,
    rope_scale: Any, rope_theta: Any, variant: Any, head_dim: int, builtin_hint: str,
) -> AttentionOptions:  # fmt: skip
    """Validate the options shared by decode and prefill (``what`` names the wrapper in messages; ``variant`` is
    resolved by the caller, cuinfer.variants.select)."""
    pos = getattr(pos_encoding, "value", pos_encoding)
    pos = pos.lower() if isinstance(pos, str) else pos
    if pos not in POS_ENCODINGS:
        raise ValueError(f"pos_encoding must be one of {', '.join(POS_ENCODINGS)} but is {pos_encoding!r}")
    cap = float(logits_soft_cap or 0.0)
    if not cap >= 0 or not math.isfinite(cap):
        raise ValueError(f"logits_soft_cap must be >= 0 (0 disables it) but is {logits_soft_cap}")
    window_left = check_window_left(window_left)
    if pos == "rope_llama" and not (rope_scale > 0 and rope_theta > 0):
        raise ValueError(f"rope_scale and rope_theta must be > 0 but are {rope_scale}, {rope_theta}")
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"sm_scale must be a finite number > 0 (default 1/sqrt(head_dim)) but is {sm_scale}")
    return AttentionOptions(
        causal=bool(causal), sm_scale=scale, logits_soft_cap=cap, window_left=window_left, pos_encoding=pos,
        rope_scale=float(rope_scale), rope_theta=float(rope_theta),
    )  # fmt: skip
