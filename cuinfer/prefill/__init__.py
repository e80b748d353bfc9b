"""Batch prefill / append attention (``BatchPrefill``) and single-request prefill (``single_prefill``).

``wrapper`` holds the wrapper, ``plan`` the host side of a plan (``index``: its index arrays), ``launch`` what run()
launches, ``policy`` the tile choice over ``tiles`` (tile configurations, shared-memory sizes), ``specs`` the kernel
specialisations (registered here as the "prefill" kernel group), ``single`` the single-request form.
"""

from cuinfer.jit import register
from cuinfer.prefill.single import single_prefill
from cuinfer.prefill.specs import default_specs
from cuinfer.prefill.wrapper import BatchPrefill

register("prefill", default_specs)

__all__ = ["BatchPrefill", "single_prefill"]
