"""Fused RoPE (``rope_llama``): rotate-half rotary embedding of q and k inside the kernel, k at its kv index, q at
``qpos``; angle ``pos / rope_scale * rope_theta^(-2i/D)``. The frequency is computed once per thread in double
precision and carried as two floats, and the angle is range-reduced exactly (``fmath::rope_sincos``): positions in the
10^4..10^5 range need far better than fp32 products. Keys get their sin / cos once per (key, dimension pair), in
decode exactly at a thread's first key of a tile and by angle addition at its next ones (``KEY_ROTATION``)."""

import math

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

# The rotation both RoPE built-ins apply to q (the frequency pair comes from the variant's per-dimension state)
ROTATE_HALF = """
float sn, cs;
fmath::rope_sincos(pos, fmath::RopeFreq{state.hi, state.lo}, sn, cs);
return dim < head_dim / 2 ? x * cs - partner * sn : x * cs + partner * sn;
"""

# ... and to k: sin / cos of the key's angle once per (key, dimension pair) as its pos_state, exact (range-reduced) at
# a decode thread's first key of each K tile and by angle addition (rotation by the step's angle, 4 FMAs) at its
# further keys of the tile: up to 3 steps (the CUDA-core kernel; the tensor-core kernel at head dim 256), or one step
# of 8 keys (the tensor-core kernel at head dim 64 / 128, keys rotated on their MMA fragments; at 128 the first key
# carried from tile to tile, up to 15 steps of 64 keys before an exact seed again), |error| of sin / cos <= ~2e-6
# with one step, <= ~7e-6 with 15 (the steps' own MUFU errors add up) at any position (exact path ~5e-7), far below a
# 16-bit key's rounding (bf16 2^-9, fp16 2^-12 relative)
KEY_ROTATION = {
    "pos_fields": "float sn, cs;",
    "pos_state": "fmath::rope_sincos(pos, fmath::RopeFreq{state.hi, state.lo}, kpos.sn, kpos.cs);",
    "pos_advance": """
const float sn = fmaf(kpos.sn, step.cs, kpos.cs * step.sn);
kpos.cs = fmaf(kpos.cs, step.cs, -kpos.sn * step.sn);
kpos.sn = sn;
""",
    "key_transform": "dim < head_dim / 2 ? x * kpos.cs - partner * kpos.sn : x * kpos.cs + partner * kpos.sn",
}

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
        **KEY_ROTATION,
        params=(Param("log2_theta", "f64"), Param("rcp_scale", "f64")),
        doc=__doc__,
    )
)


def values(rope_scale: float, rope_theta: float) -> dict:
    return {"log2_theta": math.log2(rope_theta), "rcp_scale": 1.0 / rope_scale}
