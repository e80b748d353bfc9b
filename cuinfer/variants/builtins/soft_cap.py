"""Logits soft cap: ``logit = cap * tanh(logit / cap)`` (``cap > 0``), computed to ~2e-7 x cap absolute (~6e-6 at cap
30) with one MUFU op per logit (common/math.cuh ``fmath::soft_cap``: ``cap - 2 cap / (1 + e^(2 logit / cap))``, the
reciprocal by Newton steps on the FMA pipe): the MUFU tanh's 2^-11 relative error would move capped logits by up to
0.015."""

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

SOFT_CAP = register(
    Variant(
        name="soft_cap",
        logits="fmath::soft_cap(x, params.cap, params.inv_cap)",
        params=(Param("cap", "f32"), Param("inv_cap", "f32")),
        doc=__doc__,
    )
)


def values(cap: float) -> dict:
    return {"cap": float(cap), "inv_cap": 1.0 / float(cap)}
