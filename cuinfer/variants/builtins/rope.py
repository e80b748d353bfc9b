"""Fused RoPE (``rope_llama``): rotate-half rotary embedding of q and k inside the kernel, k at its kv index, q at
``qpos``; angle ``pos / rope_scale * rope_theta^(-2i/D)``. The frequency is computed once per thread in double
precision and carried as two floats, and the angle is range-reduced exactly (``fmath::rope_sincos``): positions in the
10^4..10^5 range need far better than fp32 products."""

import math

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

# The rotation both RoPE built-ins apply to q and k (the frequency pair comes from the variant's per-dimension state)
ROTATE_HALF = """
float sn, cs;
fmath::rope_sincos(pos, fmath::RopeFreq{state.hi, state.lo}, sn, cs);
return dim < head_dim / 2 ? x * cs - partner * sn : x * cs + partner * sn;
"""

ROPE = register(
    Variant(
        name="rope",
        dim_state="""
const double f = exp2(-2.0 * double(dim) / double(head_dim) * params.log2_theta) * params.rcp_scale;
state.hi = float(f);
state.lo = float(f - double(state.hi));
""",
        state_fields="float hi, lo;",
        query_transform=ROTATE_HALF,
        key_transform=ROTATE_HALF,
        params=(Param("log2_theta", "f64"), Param("rcp_scale", "f64")),
        doc=__doc__,
    )
)


def values(rope_scale: float, rope_theta: float) -> dict:
    return {"log2_theta": math.log2(rope_theta), "rcp_scale": 1.0 / rope_scale}
