"""Attention variants: ``Variant`` (CUDA snippets + typed parameters, compiled by NVRTC into the decode and prefill
kernels), the registry of named variants, the built-ins, and their rendering into C++ (kernel_src/variants/)."""

from cuinfer.variants import builtins  # noqa: F401  (each built-in registers itself)
from cuinfer.variants.registry import lookup, register, registered
from cuinfer.variants.render import Rendered, render
from cuinfer.variants.spec import Param, Variant

__all__ = ["Param", "Rendered", "Variant", "lookup", "register", "registered", "render"]
