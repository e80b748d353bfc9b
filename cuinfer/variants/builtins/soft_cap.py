"""Logits soft cap: ``logit = cap * tanh(logit / cap)`` (``cap > 0``), FlashInfer's formula: the tanh is one MUFU op
(``tanh.approx.f32``, relative error ~2^-11, so a capped logit moves by at most ~cap * 2^-11: 0.015 at cap 30, where
the logits saturate). Written with ``logits_scale="cap"``: the kernels fold ``cap`` and ``1 / cap`` into the scales
they apply anyway, and the Hopper prefill kernel, knowing ``|logit| <= cap``, runs its softmax without a running max
(bfloat16, cap <= 54). ``soft_cap_accurate`` (``variant="soft_cap_accurate"``) is the same cap with a tanh accurate to
~2e-7 (one MUFU op and a Newton reciprocal on the FMA pipe: ``fmath::tanh``), for ~28 % more time on Hopper prefill
(H200, 2026-12-04: 0.71-0.74x causal against the built-in's 0.91-0.92x)."""

import dataclasses

import numpy as np

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

SOFT_CAP = register(
    Variant(
        name="soft_cap",
        logits="fmath::tanh_approx(x)",
        logits_scale="cap",
        params=(Param("cap", "f32"),),
        doc=__doc__,
    )
)

SOFT_CAP_ACCURATE = register(
    dataclasses.replace(
        SOFT_CAP,
        name="soft_cap_accurate",
        logits="fmath::tanh(x)",
        numpy={"logits": lambda x: np.tanh(x)},  # (of x / cap: logits_scale)
        doc="The logits soft cap cap * tanh(x / cap) with a tanh accurate to ~2e-7 absolute (fmath::tanh: "
        "1 - 2 / (1 + 2^(2 x log2 e)), one MUFU op and the reciprocal by Newton steps); "
        "variant_params={'soft_cap_accurate': {'cap': c}}.",
    )
)


def values(cap: float) -> dict:
    """The parameters of a soft cap of ``cap``."""
    return {"cap": float(cap)}
