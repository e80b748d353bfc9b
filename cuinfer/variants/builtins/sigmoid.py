"""Sigmoid attention without softmax (FlashInfer's, after "Theory, Analysis, and Best Practices for Sigmoid
Self-Attention"): ``o = Σ_j sigmoid(x_j + bias) v_j`` with ``x_j = q·k_j·sm_scale``, no normalisation. lse is
``log2(Σ_j sigmoid(x_j + bias))`` (-inf for a row without keys). ``bias`` is a plan parameter:
``variant_params={"sigmoid": {"bias": b}}``."""

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

SIGMOID = register(
    Variant(
        name="sigmoid",
        logits="fmath::sigmoid(x + params.bias)",
        softmax=False,
        params=(Param("bias", "f32"),),
        doc=__doc__,
    )
)
