"""Fused RoPE with Llama-3.1 frequency scaling (``rope_llama31``): rotate-half RoPE of q and k inside the kernel as
``rope`` (k at its kv index, q at ``qpos``), with dimension pair i turning at the Llama-3.1 frequency of
``f_i = rope_theta^(-2i/D)``: with wavelength ``λ = 2π / f_i`` and ``L = original_max_position``, ``f_i`` when
``λ < L / high_freq_factor``, ``f_i / rope_scale`` when ``λ > L / low_freq_factor``, and in between
``(1 - t) f_i / rope_scale + t f_i`` with ``t = (L / λ - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
Llama 3.1: ``rope_theta=5e5, rope_scale=8, low_freq_factor=1, high_freq_factor=4, original_max_position=8192``
(``variant_params={"rope_llama31": {...}}``, ``LLAMA31`` below). The frequency is computed once per thread in double
precision and carried as two floats, and keys rotate as ``rope``'s do (``KEY_ROTATION``)."""

import math

from cuinfer.variants.builtins.rope import KEY_ROTATION, ROTATE_HALF
from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

ROPE_LLAMA31 = register(
    Variant(
        name="rope_llama31",
        dim_state="""
const double f = exp2(-2.0 * double(dim) / double(head_dim) * log2(params.rope_theta));
// t = (L / wavelength - low) / (high - low), clamped to [0, 1]: 0 keeps f / scale, 1 keeps f
const double t = (double(params.original_max_position) * f / 6.283185307179586 - params.low_freq_factor) /
                 (params.high_freq_factor - params.low_freq_factor);
const double c = t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t);
const double g = (1.0 - c) * f / params.rope_scale + c * f;
state.hi = float(g);
state.lo = float(g - double(state.hi));
""",
        state_fields="float hi, lo;",
        query_transform=ROTATE_HALF,
        **KEY_ROTATION,
        params=(
            Param("rope_theta", "f64"),
            Param("rope_scale", "f64"),
            Param("low_freq_factor", "f64"),
            Param("high_freq_factor", "f64"),
            Param("original_max_position", "i32"),
        ),  # fmt: skip
        doc=__doc__,
    )
)

# The values of Llama 3.1 (and 3.2 / 3.3): variant_params={"rope_llama31": LLAMA31}
LLAMA31 = {
    "rope_theta": 5e5, "rope_scale": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position": 8192,
}  # fmt: skip


def check(values: dict) -> None:
    """Raise ValueError when the values do not define a frequency scaling (checked at plan())."""
    theta, scale = values["rope_theta"], values["rope_scale"]
    low, high, length = values["low_freq_factor"], values["high_freq_factor"], values["original_max_position"]
    if not (theta > 0 and scale > 0 and math.isfinite(theta) and math.isfinite(scale)):
        raise ValueError(f"rope_llama31: rope_theta and rope_scale must be finite and > 0 but are {theta}, {scale}")
    if not (0 < low < high) or not math.isfinite(high):
        raise ValueError(
            f"rope_llama31: need 0 < low_freq_factor < high_freq_factor but got {low}, {high} (Llama 3.1: 1, 4)"
        )
    if not length >= 1:
        raise ValueError(f"rope_llama31: original_max_position must be >= 1 but is {length} (Llama 3.1: 8192)")
