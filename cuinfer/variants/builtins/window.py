"""Sliding window: the query at kv position ``qpos`` keeps keys ``j >= qpos - window_left`` (``window_left >= 0``; a
decode query sees ``window_left + 1`` keys)."""

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Param, Variant

WINDOW = register(
    Variant(name="window", key_lo="qpos - params.window_left", params=(Param("window_left", "i32"),), doc=__doc__)
)


def values(window_left: int) -> dict:
    return {"window_left": int(window_left)}
