"""FlashInfer attention names the drop-in does not cover yet. Each exists here, so that ``from flashinfer import X``
at the top of a module keeps working, and raises ``NotImplementedError`` when it is constructed or called, naming
what is missing and what to use instead (docs/compat.md has the same list)."""

from __future__ import annotations

from typing import Any

from cuinfer.compat.flashinfer.common import not_covered

_CASCADE = (
    "cascade attention is not in cuinfer yet; run one prefill / decode wrapper per level with return_lse=True and "
    "combine the states with merge_state / merge_states (base-2 lse, as FlashInfer's)"
)
_SPARSE = (
    "block-sparse attention is not in cuinfer yet; express the block mask as custom_mask / packed_custom_mask of "
    "BatchPrefillWithRaggedKVCacheWrapper"
)
_MLA = "MLA (multi-head latent attention) is not in cuinfer"
_POD = (
    "fused prefill + decode launches are not in cuinfer yet; run BatchPrefillWithPagedKVCacheWrapper for the "
    "prefill requests and BatchDecodeWithPagedKVCacheWrapper for the decode requests"
)
_BACKEND_ENTRY = (
    "backend-specific entry points (TensorRT-LLM, cuDNN, XQA kernels) are not covered; use the plan/run wrappers"
)

# name -> (what it is, what to use instead)
CLASSES = {
    "MultiLevelCascadeAttentionWrapper": ("cascade attention", _CASCADE),
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper": ("shared-prefix cascade decode", _CASCADE),
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper": ("shared-prefix cascade prefill", _CASCADE),
    "BlockSparseAttentionWrapper": ("block-sparse attention", _SPARSE),
    "VariableBlockSparseAttentionWrapper": ("variable block-sparse attention", _SPARSE),
    "BatchMLAPagedAttentionWrapper": ("MLA decode / prefill", _MLA),
    "PODWithPagedKVCacheWrapper": ("POD (prefill-on-decode) attention", _POD),
    "BatchPODWithPagedKVCacheWrapper": ("batched POD attention", _POD),
    "BatchAttention": ("the persistent mixed prefill + decode kernel", _POD),
    "BatchAttentionWithAttentionSinkWrapper": (
        "attention with sinks",
        "attention sinks are not in cuinfer's variants yet",
    ),
}
FUNCTIONS = {
    "trtllm_batch_decode_with_kv_cache": ("TensorRT-LLM decode", _BACKEND_ENTRY),
    "trtllm_batch_context_with_kv_cache": ("TensorRT-LLM context attention", _BACKEND_ENTRY),
    "xqa_batch_decode_with_kv_cache": ("XQA decode", _BACKEND_ENTRY),
    "cudnn_batch_decode_with_kv_cache": ("cuDNN decode", _BACKEND_ENTRY),
    "cudnn_batch_prefill_with_kv_cache": ("cuDNN prefill", _BACKEND_ENTRY),
    "fast_decode_plan": (
        "fast_decode_plan (a replacement plan() patched onto FlashInfer's decode wrapper)",
        "call BatchDecodeWithPagedKVCacheWrapper.plan(); cuinfer's plan() is host-only and cheap",
    ),
    "append_paged_mla_kv_cache": ("the MLA paged-cache append", _MLA),
}


def _class(name: str, what: str, instead: str) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise not_covered(f"flashinfer.{name} ({what})", instead)

    doc = f"Not covered by cuinfer.compat.flashinfer ({what}): constructing it raises NotImplementedError. {instead}."
    return type(name, (), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


def _function(name: str, what: str, instead: str) -> Any:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise not_covered(f"flashinfer.{name} ({what})", instead)

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = f"Not covered by cuinfer.compat.flashinfer ({what}): calling it raises NotImplementedError."
    return stub


STUBS: dict[str, Any] = {
    **{name: _class(name, *spec) for name, spec in CLASSES.items()},
    **{name: _function(name, *spec) for name, spec in FUNCTIONS.items()},
}
