"""Batch prefill / append attention (``BatchPrefill``) and single-request prefill (``single_prefill``).

``wrapper`` holds the wrapper, ``plan`` the host side of a plan (``index``: its index arrays), ``launch`` what run()
launches, ``policy`` the tile choice over ``tiles`` (tile configurations, shared-memory sizes), ``specs`` the kernel
specialisations (registered here as the "prefill" kernel group), ``sm90`` the Hopper backend (its kernel specs, the
"prefill_sm90" group, its limits and launch), ``single`` the single-request form.
"""

from cuinfer.jit import register
from cuinfer.prefill import sm90
from cuinfer.prefill.single import single_prefill
from cuinfer.prefill.specs import default_specs
from cuinfer.prefill.wrapper import BatchPrefill

register("prefill", default_specs)
register("prefill_sm90", sm90.default_specs)

__all__ = ["BatchPrefill", "single_prefill"]
