"""Causal attention, bottom-right aligned: the query at kv position ``qpos`` sees keys ``j <= qpos``."""

from cuinfer.variants.registry import register
from cuinfer.variants.spec import Variant

CAUSAL = register(Variant(name="causal", key_hi="qpos + 1", doc=__doc__))
