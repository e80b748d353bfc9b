"""ALiBi: ``logit += slope_h * (j - qpos)`` with the standard slopes of ``num_qo_heads`` heads: with m the largest
power of two <= n, ``2^(-8(h+1)/m)`` for h < m, then the odd slopes of the 2m sequence (``fmath::alibi_slope``).
The slope is the row's state (``row_state``): computed once per query row, not per key. Written as a ``slope`` (a
linear key bias, ``x + slope * kv_dist``), so prefill starts Q·K^T's accumulators at the bias: one FFMA per logit."""

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

ALIBI = register(
    Variant(
        name="alibi",
        row_state="row.slope = fmath::alibi_slope(qo_head, params.num_qo_heads);",
        row_fields="float slope;",
        slope="row.slope",
        params=(Param("num_qo_heads", "i32"),),
        rising_logits=True,  # the bias climbs toward the diagonal: prefill runs the KV tiles backwards (Variant)
        doc=__doc__,
    )
)


def values(num_qo_heads: int) -> dict:
    return {"num_qo_heads": int(num_qo_heads)}
