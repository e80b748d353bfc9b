"""Attention sinks (gpt-oss): a learned logit ``s_h`` per query head joins every row's softmax as an extra key whose
value is 0, so ``o = Σ_j e^(x_j) v_j / (e^(s_h) + Σ_j e^(x_j))`` and ``lse = log2(e^(s_h) + Σ_j e^(x_j))``. ``s_h``
is a natural logit in the units of ``x`` (after sm_scale; no logits transform applies to it). A row with no key gives
``o = 0``, ``lse = s_h·log2(e)``. The kernels fold the sink once per row where the row is finalised, so it is exact
under KV splitting. The array is given at run(): ``variant_arrays={"sinks": s}``, float32 ``[num_qo_heads]``."""

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

SINKS = register(
    Variant(name="sinks", sink="params.sinks[qo_head]", params=(Param("sinks", "f32", per="qo_head"),), doc=__doc__)
)
