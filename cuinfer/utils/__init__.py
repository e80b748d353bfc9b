"""Serving utilities around the attention kernels, with FlashInfer's semantics and argument names: appending tokens
to a paged KV cache and the index arrays of a step (``paged``), RoPE on q / k (``rope``) and bit-packed masks
(``bits``).

Each function takes torch, JAX or CuPy arrays on the GPU (kernels of ``kernel_src/utility/``, on the caller's current
stream, outputs in the caller's framework) or NumPy arrays (the float64 CPU reference, ``cuinfer.reference``, with
the same checks and the GPU's output dtypes). Docs: docs/utilities.md.
"""

from cuinfer.jit import register
from cuinfer.utils.bits import packbits, segment_packbits
from cuinfer.utils.paged import append_paged_kv_cache, get_batch_indices_positions, get_seq_lens
from cuinfer.utils.rope import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)
from cuinfer.utils.specs import all_specs

register("utility", all_specs)

__all__ = [
    "append_paged_kv_cache",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "get_batch_indices_positions",
    "get_seq_lens",
    "packbits",
    "segment_packbits",
]
