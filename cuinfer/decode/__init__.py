"""Batch decode on a paged KV cache (``BatchDecode``) and single-request decode (``single_decode``).

``wrapper`` holds the wrapper, ``plan`` the host side of a plan, ``launch`` what run() launches, ``policy`` the kernel
and tile choice, ``specs`` the kernel specialisations (registered here as the "decode" kernel group), ``single`` the
single-request form.
"""

from cuinfer.decode.single import single_decode
from cuinfer.decode.specs import all_specs
from cuinfer.decode.wrapper import BatchDecode
from cuinfer.jit import register

register("decode", all_specs)

__all__ = ["BatchDecode", "single_decode"]
