"""cuinfer: an attention engine for LLM inference serving.

NVRTC-compiled CUDA kernels launched through CuPy, a pure-NumPy planner, and DLPack so torch, JAX and CuPy arrays
pass in and out without copies. NumPy inputs run on the float64 CPU reference backend.
"""

from cuinfer.decode import BatchDecode, single_decode
from cuinfer.errors import CompileError, CuinferError, NoGPUError, ToolchainError
from cuinfer.merge import merge_state, merge_state_in_place, merge_states
from cuinfer.prefill import BatchPrefill, single_prefill
from cuinfer.utils import (
    append_paged_kv_cache,
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
    get_batch_indices_positions,
    get_seq_lens,
    packbits,
    segment_packbits,
)
from cuinfer.variants import Param, Variant
from cuinfer.variants import register as register_variant
from cuinfer.version import __version__

__all__ = [
    "BatchDecode",
    "BatchPrefill",
    "single_prefill",
    "single_decode",
    "CompileError",
    "CuinferError",
    "NoGPUError",
    "ToolchainError",
    "__version__",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "Param",
    "Variant",
    "register_variant",
    "append_paged_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "packbits",
    "segment_packbits",
]
