"""Logits soft cap: ``logit = cap * tanh(logit / cap)`` (``cap > 0``), computed to ~2e-7 x cap absolute (~6e-6 at cap
30) with one MUFU op per logit (common/math.cuh ``fmath::soft_cap``: ``cap - 2 cap / (1 + e^(2 logit / cap))``, the
reciprocal by Newton steps on the FMA pipe, the constants precomputed by ``values``): the MUFU tanh's 2^-11 relative
error would move capped logits by up to 0.015."""

import math

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

SOFT_CAP = register(
    Variant(
        name="soft_cap",
        logits="fmath::soft_cap(x, params.cap, params.neg_two_cap, params.ex2_scale)",
        params=(Param("cap", "f32"), Param("neg_two_cap", "f32"), Param("ex2_scale", "f32")),
        doc=__doc__,
    )
)


def values(cap: float) -> dict:
    """The parameters of a soft cap of ``cap``: the cap and the constants of ``fmath::soft_cap``, computed here once
    (-2 cap and 2 log2(e) / cap: constant-bank operands in the kernels, no registers)."""
    return {"cap": float(cap), "neg_two_cap": -2.0 * float(cap), "ex2_scale": 2.0 * math.log2(math.e) / float(cap)}
