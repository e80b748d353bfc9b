"""A drop-in for FlashInfer's attention API on cuinfer: ``import cuinfer.compat.flashinfer as flashinfer``.

FlashInfer 0.7.2's names, positional order, defaults and return conventions (torch tensors in, torch tensors out;
lse base 2, ``(o, lse)`` with ``return_lse=True``), as thin adapters over cuinfer's public wrappers:

- ``BatchDecodeWithPagedKVCacheWrapper`` (and ``CUDAGraphBatchDecodeWithPagedKVCacheWrapper``) ->
  ``cuinfer.BatchDecode``
- ``BatchPrefillWithPagedKVCacheWrapper`` / ``BatchPrefillWithRaggedKVCacheWrapper`` -> ``cuinfer.BatchPrefill``
- ``single_decode_with_kv_cache`` / ``single_prefill_with_kv_cache(_return_lse)`` -> ``cuinfer.single_decode`` /
  ``single_prefill``
- ``merge_state``, ``merge_state_in_place``, ``merge_states`` -> cuinfer's merges
- ``append_paged_kv_cache``, ``get_batch_indices_positions``, the ``apply_rope`` family (in place, Llama 3.1, the
  cos/sin cache), ``packbits``, ``segment_packbits`` -> cuinfer's serving utilities (``cuinfer.utils``);
  ``get_seq_lens`` is FlashInfer's formula

NumPy inputs run cuinfer's float64 CPU reference. Every argument either works as in FlashInfer, leaves the result
unchanged (launch hints, inputs of FlashInfer's other backends), or raises ``NotImplementedError`` naming it and
what to use instead; FlashInfer names outside the attention API that the drop-in does not cover (cascade,
block-sparse, MLA, POD, backend-specific entry points) exist and raise the same way. Coverage: docs/compat.md.
torch is never imported here: the arrays' own methods are used.
"""

from __future__ import annotations

from typing import Any

from cuinfer.compat.flashinfer import cascade, decode, page, prefill, quantization, rope
from cuinfer.compat.flashinfer.cascade import merge_state as merge_state
from cuinfer.compat.flashinfer.cascade import merge_state_in_place as merge_state_in_place
from cuinfer.compat.flashinfer.cascade import merge_states as merge_states
from cuinfer.compat.flashinfer.common import FLASHINFER_API_VERSION as FLASHINFER_API_VERSION
from cuinfer.compat.flashinfer.common import InvalidOptionError as InvalidOptionError
from cuinfer.compat.flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper as BatchDecodeWithPagedKVCacheWrapper
from cuinfer.compat.flashinfer.decode import (
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper as CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)
from cuinfer.compat.flashinfer.decode import single_decode_with_kv_cache as single_decode_with_kv_cache
from cuinfer.compat.flashinfer.page import append_paged_kv_cache as append_paged_kv_cache
from cuinfer.compat.flashinfer.page import get_batch_indices_positions as get_batch_indices_positions
from cuinfer.compat.flashinfer.page import get_seq_lens as get_seq_lens
from cuinfer.compat.flashinfer.prefill import (
    BatchPrefillWithPagedKVCacheWrapper as BatchPrefillWithPagedKVCacheWrapper,
)
from cuinfer.compat.flashinfer.prefill import (
    BatchPrefillWithRaggedKVCacheWrapper as BatchPrefillWithRaggedKVCacheWrapper,
)
from cuinfer.compat.flashinfer.prefill import single_prefill_with_kv_cache as single_prefill_with_kv_cache
from cuinfer.compat.flashinfer.prefill import (
    single_prefill_with_kv_cache_return_lse as single_prefill_with_kv_cache_return_lse,
)
from cuinfer.compat.flashinfer.quantization import packbits as packbits
from cuinfer.compat.flashinfer.quantization import segment_packbits as segment_packbits
from cuinfer.compat.flashinfer.rope import apply_llama31_rope as apply_llama31_rope
from cuinfer.compat.flashinfer.rope import apply_llama31_rope_inplace as apply_llama31_rope_inplace
from cuinfer.compat.flashinfer.rope import apply_llama31_rope_pos_ids as apply_llama31_rope_pos_ids
from cuinfer.compat.flashinfer.rope import apply_llama31_rope_pos_ids_inplace as apply_llama31_rope_pos_ids_inplace
from cuinfer.compat.flashinfer.rope import apply_rope as apply_rope
from cuinfer.compat.flashinfer.rope import apply_rope_inplace as apply_rope_inplace
from cuinfer.compat.flashinfer.rope import apply_rope_pos_ids as apply_rope_pos_ids
from cuinfer.compat.flashinfer.rope import apply_rope_pos_ids_inplace as apply_rope_pos_ids_inplace
from cuinfer.compat.flashinfer.rope import apply_rope_with_cos_sin_cache as apply_rope_with_cos_sin_cache
from cuinfer.compat.flashinfer.rope import (
    apply_rope_with_cos_sin_cache_inplace as apply_rope_with_cos_sin_cache_inplace,
)
from cuinfer.compat.flashinfer.uncovered import STUBS
from cuinfer.version import __version__ as _cuinfer_version

# FlashInfer's version with cuinfer's as the local part, for code that reads flashinfer.__version__.
__version__ = f"{FLASHINFER_API_VERSION}+cuinfer.{_cuinfer_version}"

globals().update(STUBS)

COVERED = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
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
NOT_COVERED = sorted(STUBS)

__all__ = [*COVERED, *NOT_COVERED, "FLASHINFER_API_VERSION", "InvalidOptionError", "__version__"]
_SUBMODULES = (cascade, decode, page, prefill, quantization, rope)  # (FlashInfer's submodule names)


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"cuinfer.compat.flashinfer has no attribute {name!r}: it covers FlashInfer's attention API "
        f"({', '.join(COVERED[:4])}, ...); docs/compat.md lists what is covered"
    )
