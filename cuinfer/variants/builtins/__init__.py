"""The built-in variants, each in its own file and written as a user would write one (``cuinfer.Variant``)."""

from cuinfer.variants.builtins import alibi, causal, custom_mask, rope, rope_llama31, sigmoid, sinks, soft_cap, window

__all__ = ["alibi", "causal", "custom_mask", "rope", "rope_llama31", "sigmoid", "sinks", "soft_cap", "window"]
