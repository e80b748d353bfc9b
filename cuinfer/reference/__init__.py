"""CPU reference backend: exact float64 attention with cuinfer's semantics (the oracle of every GPU test).

Pure NumPy, one module per concern: ``core`` (the attention math and its batched forms), ``positional`` (RoPE, ALiBi
slopes), ``state`` (merging attention states), ``paged`` (page tables, appends), ``mask`` (bit-packed masks) and
``util`` (the input checks they share). Everything is used through this package: ``reference.attention(...)``; the
names re-exported ``as`` themselves were importable from the single module this package replaces.
"""

from cuinfer.reference.core import LOG2E as LOG2E
from cuinfer.reference.core import POS_ENCODINGS as POS_ENCODINGS
from cuinfer.reference.core import attention, batch_attention_ragged, batch_decode_paged, batch_prefill_paged
from cuinfer.reference.mask import packbits, segment_packbits, unpack_custom_mask
from cuinfer.reference.paged import append_paged_kv_cache, get_batch_indices_positions, paged_kv_to_ragged
from cuinfer.reference.paged import page_table as page_table
from cuinfer.reference.positional import alibi_slopes, apply_rope, apply_rope_pos_ids, rope
from cuinfer.reference.state import merge_state, merge_state_in_place, merge_states
from cuinfer.reference.util import as_bool_mask as as_bool_mask
from cuinfer.reference.util import as_f64 as as_f64
from cuinfer.reference.util import as_indptr as as_indptr

__all__ = [
    "alibi_slopes",
    "append_paged_kv_cache",
    "apply_rope",
    "apply_rope_pos_ids",
    "attention",
    "batch_attention_ragged",
    "batch_decode_paged",
    "batch_prefill_paged",
    "get_batch_indices_positions",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "packbits",
    "paged_kv_to_ragged",
    "rope",
    "segment_packbits",
    "unpack_custom_mask",
]
