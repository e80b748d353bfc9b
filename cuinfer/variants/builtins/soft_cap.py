"""Logits soft cap: ``logit = cap * tanh(logit / cap)`` (``cap > 0``). tanh is computed to ~1e-7 absolute
(common/math.cuh ``fmath::tanh``): the MUFU tanh's 2^-11 relative error would move capped logits by up to 0.015."""

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

SOFT_CAP = register(
    Variant(
        name="soft_cap",
        logits="params.cap * fmath::tanh(x * params.inv_cap)",
        params=(Param("cap", "f32"), Param("inv_cap", "f32")),
        doc=__doc__,
    )
)


def values(cap: float) -> dict:
    return {"cap": float(cap), "inv_cap": 1.0 / float(cap)}
