"""FlashInfer's prefill API on cuinfer: ``BatchPrefillWithPagedKVCacheWrapper`` and
``BatchPrefillWithRaggedKVCacheWrapper`` over ``cuinfer.BatchPrefill(paged=True / False)``; the single-request
functions live in ``single`` and are re-exported here, where FlashInfer has them.

FlashInfer 0.7.2's names, positional order and defaults. Semantics FlashInfer has and cuinfer spells differently:
a custom mask *replaces* ``causal`` in FlashInfer (cuinfer ANDs the two, so ``causal`` is dropped when a mask is
given); ``fixed_split_size`` counts pages (tokens for ragged KV); ``lse_base`` / ``lse_layout`` convert cuinfer's
base-2 ``[tokens, heads]`` lse.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from cuinfer.compat.flashinfer import common
from cuinfer.compat.flashinfer.single import single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse
from cuinfer.compat.flashinfer.wrapper import CompatWrapper
from cuinfer.prefill import BatchPrefill

__all__ = [
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
]

_TRTLLM_ONLY = "it selects a cubin of FlashInfer's trtllm-gen backend on SM107 only; leave it None"


class PrefillWrapper(CompatWrapper):
    """What the paged and ragged prefill wrappers share: construction, the mask and option translation, run()."""

    _PAGED: bool = True

    def _setup(self, backend: str, jit_args: Any, jit_kwargs: Any, variant_owns_mask: bool) -> None:
        if variant_owns_mask and backend != "fa2":
            raise ValueError(
                "variant_owns_mask is only supported on the fa2 backend: the SM90 (fa3) batch prefill kernels "
                "return cudaErrorNotSupported under MaskMode.CUSTOM."
            )
        common.check_no_jit(jit_args, jit_kwargs)
        if variant_owns_mask:
            raise ValueError(
                "variant_owns_mask requires a custom JIT module (jit_args): the default attention variant "
                "dereferences the custom mask buffer under MaskMode.CUSTOM."
            )
        self._backend = backend
        self._core = BatchPrefill(
            paged=self._PAGED, kv_layout=self._kv_layout, backend=common.backend(backend), **self._core_settings()
        )  # fmt: skip

    def _core_plan(
        self, index_arrays: tuple, *, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int,
        head_dim_vo: int | None, custom_mask: Any, packed_custom_mask: Any, causal: bool, options: dict,
        q_data_type: Any, kv_data_type: Any, o_data_type: Any, fixed_split_size: int | None,
        disable_split_kv: bool,
    ) -> None:  # fmt: skip
        """Plan the cuinfer wrapper. FlashInfer uses ``packed_custom_mask`` over ``custom_mask`` when both are
        given, and a mask in place of ``causal``."""
        self._head_dim_qk = head_dim_qk
        if packed_custom_mask is not None:
            custom_mask = None
        has_mask = custom_mask is not None or packed_custom_mask is not None
        if (
            has_mask
            and self._use_cuda_graph
            and not (common.is_array(self._custom_mask_buf) and common.is_array(self._mask_indptr_buf))
        ):
            raise ValueError(
                "custom_mask_buf and mask_indptr_buf must be initialized with a torch.Tensor in cuda graph mode if "
                "we use custom mask in attention computation."
            )
        self._core.plan(
            *index_arrays, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim_qk,
            page_size=page_size, causal=bool(causal) and not has_mask, custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask, head_dim_vo=head_dim_vo, q_dtype=common.data_type(q_data_type),
            kv_dtype=common.kv_data_type(kv_data_type), o_dtype=common.data_type(o_data_type),
            fixed_split_size=common.split_options(fixed_split_size, disable_split_kv, page_size), **options,
        )  # fmt: skip

    def _run(self, q: Any, kv: tuple, out: Any, lse: Any, return_lse: bool, lse_base: str, lse_layout: str,
             v_scale: Any) -> Any:  # fmt: skip
        common.check_lse_options(lse_base, lse_layout)
        lse_core, lse_dst = common.stage_lse(lse, lse_layout, return_lse)
        result = self._core.run(q, *kv, out=out, lse=lse_core, return_lse=return_lse or lse_core is not None)
        return self._finish(result, return_lse, v_scale, lse_base, lse_layout, lse_dst)

    def _prefill_forward(self, call: dict, return_lse: bool) -> Any:
        """forward() / forward_return_lse(): FlashInfer multiplies sm_scale by ``k_scale`` (it goes into the new
        plan here) and the output by ``v_scale``."""
        call = dict(call)
        k_scale, v_scale = call.pop("k_scale", None), call.pop("v_scale", None)
        if k_scale is not None and common.scalar(k_scale) != 1.0:
            base = call["sm_scale"]
            base = 1.0 / math.sqrt(self._head_dim_qk) if base is None else float(base)
            call["sm_scale"] = base * common.scalar(k_scale)
        result = self._forward(call, return_lse)
        if return_lse:
            return common.scale_output(result[0], v_scale), result[1]
        return common.scale_output(result, v_scale)


def _plan_call(local: dict, positional: tuple[str, ...]) -> dict:
    """plan()'s keyword values (every option, defaults included) for forward()'s comparison and re-plan."""
    return {k: v for k, v in local.items() if k != "self" and k not in positional}


_PAGED_POSITIONAL = ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
                     "num_kv_heads", "head_dim_qk", "page_size")  # fmt: skip
_RAGGED_POSITIONAL = ("qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim_qk")


class BatchPrefillWithPagedKVCacheWrapper(PrefillWrapper):
    """FlashInfer's prefill / append wrapper on a paged KV cache, over ``cuinfer.BatchPrefill(paged=True)``.

    ``float_workspace_buffer`` gives the device (cuinfer keeps its own workspace); with ``use_cuda_graph`` the batch
    size is ``len(qo_indptr_buf) - 1`` as in FlashInfer (the buffers are not written: cuinfer's index arrays live
    in its own plan buffer). ``backend``: 'auto', 'fa2', 'fa3' (cuinfer's best kernel for the device).
    """

    _API = "BatchPrefillWithPagedKVCacheWrapper"
    _PAGED = True
    _RUN_ARRAYS = ("q", "paged_kv_cache")

    def __init__(
        self,
        float_workspace_buffer: Any,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: Any = None,
        paged_kv_indptr_buf: Any = None,
        paged_kv_indices_buf: Any = None,
        paged_kv_last_page_len_buf: Any = None,
        custom_mask_buf: Any = None,
        mask_indptr_buf: Any = None,
        backend: str = "auto",
        jit_args: Any = None,
        jit_kwargs: Any = None,
        variant_owns_mask: bool = False,
    ) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph)
        if use_cuda_graph:
            common.require_buffers(
                "CUDA graph",
                qo_indptr_buf=qo_indptr_buf, paged_kv_indptr_buf=paged_kv_indptr_buf,
                paged_kv_indices_buf=paged_kv_indices_buf, paged_kv_last_page_len_buf=paged_kv_last_page_len_buf,
            )  # fmt: skip
            self._fixed_batch_size = common.length(qo_indptr_buf) - 1
            if common.length(paged_kv_indptr_buf) != self._fixed_batch_size + 1:
                raise ValueError("The length of paged_kv_indptr_buf should be batch_size + 1.")
            if common.length(paged_kv_last_page_len_buf) != self._fixed_batch_size:
                raise ValueError("The length of paged_kv_last_page_len_buf should be batch_size.")
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._custom_mask_buf, self._mask_indptr_buf = custom_mask_buf, mask_indptr_buf
        self._setup(backend, jit_args, jit_kwargs, variant_owns_mask)

    def plan(
        self,
        qo_indptr: Any,
        paged_kv_indptr: Any,
        paged_kv_indices: Any,
        paged_kv_last_page_len: Any,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask: Any = None,
        packed_custom_mask: Any = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        o_data_type: Any = None,
        non_blocking: bool = True,
        prefix_len_ptr: Any = None,
        token_pos_in_items_ptr: Any = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: Any = None,
        seq_lens: Any = None,
        seq_lens_q: Any = None,
        block_tables: Any = None,
        max_token_per_sequence: int | None = None,
        max_sequence_kv: int | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
        uniform_q_len: int | None = None,
    ) -> None:
        """Plan one batch (FlashInfer's arguments). ``non_blocking``, ``seq_lens``, ``seq_lens_q``, ``block_tables``,
        ``max_token_per_sequence``, ``max_sequence_kv`` and ``uniform_q_len`` are planning hints or inputs of
        FlashInfer's other backends: cuinfer reads the CSR page table, as FlashInfer's fa2 path does."""
        call = _plan_call(locals(), _PAGED_POSITIONAL)
        common.plan_refusals(
            use_fp16_qk_reduction=use_fp16_qk_reduction, prefix_len_ptr=prefix_len_ptr,
            token_pos_in_items_ptr=token_pos_in_items_ptr, max_item_len_ptr=max_item_len_ptr,
        )  # fmt: skip
        self._check_graph_batch(common.length(qo_indptr) - 1, qo_indptr)
        if self._use_cuda_graph and common.length(paged_kv_indices) > common.length(self._paged_kv_indices_buf):
            raise ValueError("The length of paged_kv_indices exceeds the allocated buffer size.")
        options = common.attention_options(call, num_qo_heads)
        index = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)
        self._core_plan(
            index, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk, page_size=page_size,
            head_dim_vo=head_dim_vo, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask, causal=causal,
            options=options, q_data_type=q_data_type, kv_data_type=kv_data_type, o_data_type=o_data_type,
            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
        )  # fmt: skip
        self._remember(index + (num_qo_heads, num_kv_heads, head_dim_qk, page_size), call, options["window_left"])

    begin_forward = plan

    def run(
        self, q: Any, paged_kv_cache: Any, *args: Any, q_scale: Any = None, k_scale: Any = None, v_scale: Any = None,
        out: Any = None, lse: Any = None, return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH",
        enable_pdl: bool | None = None, window_left: int | None = None, sinks: Any = None, kv_cache_sf: Any = None,
        skip_softmax_threshold_scale_factor: float | None = None, use_fp16_softmax: bool | None = None,
        uses_spcompress: bool | None = None,
    ) -> Any:  # fmt: skip
        """Attention of ``q [qo_indptr[-1], num_qo_heads, head_dim]`` over the paged cache -> ``o`` (``(o, lse)``
        with ``return_lse``). ``q_scale`` / ``k_scale`` other than 1 raise (FlashInfer folds them into sm_scale:
        do that at plan()); ``v_scale`` multiplies the output, as in FlashInfer. ``enable_pdl``: a launch hint."""
        qk = 1.0
        for s in (q_scale, k_scale):
            qk *= 1.0 if s is None else common.scalar(s)
        common.run_refusals(args, sinks, kv_cache_sf, skip_softmax_threshold_scale_factor)
        common.refuse(
            use_fp16_softmax=(use_fp16_softmax, bool(use_fp16_softmax), _TRTLLM_ONLY),
            uses_spcompress=(uses_spcompress, bool(uses_spcompress), _TRTLLM_ONLY),
            q_scale_k_scale=(qk, qk != 1.0, "cuinfer's prefill fixes sm_scale at plan(): pass "
                                            "sm_scale=sm_scale * q_scale * k_scale to plan() instead"),
        )  # fmt: skip
        self._check_run_window(window_left)
        kv = (common.expand_paged(paged_kv_cache, self._kv_layout),)
        return self._run(q, kv, out, lse, return_lse, lse_base, lse_layout, v_scale)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self, q: Any, paged_kv_cache: Any, causal: bool = False, pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False, k_scale: float | None = None, v_scale: float | None = None,
        window_left: int = -1, logits_soft_cap: float | None = None, sm_scale: float | None = None,
        rope_scale: float | None = None, rope_theta: float | None = None,
    ) -> Any:  # fmt: skip
        """Deprecated in FlashInfer (use ``run``): its options replace the plan's (cuinfer plans again if they
        differ; ``k_scale`` goes into that plan's sm_scale)."""
        return self._prefill_forward(locals(), False)

    def forward_return_lse(
        self, q: Any, paged_kv_cache: Any, causal: bool = False, pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False, k_scale: float | None = None, v_scale: float | None = None,
        window_left: int = -1, logits_soft_cap: float | None = None, sm_scale: float | None = None,
        rope_scale: float | None = None, rope_theta: float | None = None,
    ) -> Any:  # fmt: skip
        """Deprecated in FlashInfer (use ``run_return_lse``): ``forward`` returning ``(o, lse)``."""
        return self._prefill_forward(locals(), True)


class BatchPrefillWithRaggedKVCacheWrapper(PrefillWrapper):
    """FlashInfer's prefill / append wrapper on ragged K/V tensors, over ``cuinfer.BatchPrefill(paged=False)``.

    ``float_workspace_buffer`` gives the device (cuinfer keeps its own workspace); with ``use_cuda_graph`` the batch
    size is ``len(qo_indptr_buf) - 1`` as in FlashInfer. ``backend``: 'auto', 'fa2', 'fa3' (cuinfer's best kernel).
    """

    _API = "BatchPrefillWithRaggedKVCacheWrapper"
    _PAGED = False
    _RUN_ARRAYS = ("q", "k", "v")

    def __init__(
        self,
        float_workspace_buffer: Any,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: Any = None,
        kv_indptr_buf: Any = None,
        custom_mask_buf: Any = None,
        mask_indptr_buf: Any = None,
        backend: str = "auto",
        jit_args: Any = None,
        jit_kwargs: Any = None,
        variant_owns_mask: bool = False,
    ) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph)
        if use_cuda_graph:
            common.require_buffers("cuda graph", qo_indptr_buf=qo_indptr_buf, kv_indptr_buf=kv_indptr_buf)
            self._fixed_batch_size = common.length(qo_indptr_buf) - 1
            if common.length(kv_indptr_buf) != self._fixed_batch_size + 1:
                raise ValueError(
                    f"The length of kv_indptr_buf ({common.length(kv_indptr_buf)}) should be the same as "
                    f"qo_indptr_buf ({self._fixed_batch_size})."
                )
        self._custom_mask_buf, self._mask_indptr_buf = custom_mask_buf, mask_indptr_buf
        self._setup(backend, jit_args, jit_kwargs, variant_owns_mask)

    def plan(
        self,
        qo_indptr: Any,
        kv_indptr: Any,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: int | None = None,
        custom_mask: Any = None,
        packed_custom_mask: Any = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        o_data_type: Any = None,
        non_blocking: bool = True,
        prefix_len_ptr: Any = None,
        token_pos_in_items_ptr: Any = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: Any = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
        seq_lens: Any = None,
        seq_lens_q: Any = None,
        max_token_per_sequence: int | None = None,
        max_sequence_kv: int | None = None,
        v_indptr: Any = None,
        o_indptr: Any = None,
        uniform_q_len: int | None = None,
    ) -> None:
        """Plan one batch (FlashInfer's arguments). ``seq_lens``, ``seq_lens_q``, ``max_token_per_sequence``,
        ``max_sequence_kv``, ``v_indptr`` and ``o_indptr`` are read by FlashInfer's cuDNN backend only, and
        ``non_blocking`` / ``uniform_q_len`` are hints: as on FlashInfer's fa2 path they do not change results."""
        call = _plan_call(locals(), _RAGGED_POSITIONAL)
        common.plan_refusals(
            use_fp16_qk_reduction=use_fp16_qk_reduction, prefix_len_ptr=prefix_len_ptr,
            token_pos_in_items_ptr=token_pos_in_items_ptr, max_item_len_ptr=max_item_len_ptr,
        )  # fmt: skip
        batch = common.length(qo_indptr) - 1
        if common.length(kv_indptr) != batch + 1:
            raise ValueError("The kv_indptr length should be equal to mask_indptr length.")
        self._check_graph_batch(batch, qo_indptr)
        options = common.attention_options(call, num_qo_heads)
        self._core_plan(
            (qo_indptr, kv_indptr), num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
            page_size=1, head_dim_vo=head_dim_vo, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            causal=causal, options=options, q_data_type=q_data_type, kv_data_type=kv_data_type,
            o_data_type=o_data_type, fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
        )  # fmt: skip
        self._remember((qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk), call, options["window_left"])

    begin_forward = plan

    def run(
        self, q: Any, k: Any, v: Any, *args: Any, q_scale: float | None = None, k_scale: float | None = None,
        v_scale: float | None = None, o_scale: float | None = None, out: Any = None, lse: Any = None,
        return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH", enable_pdl: bool | None = None,
        kv_cache_sf: Any = None,
    ) -> Any:  # fmt: skip
        """Attention of ``q [qo_indptr[-1], num_qo_heads, head_dim_qk]`` over ragged ``k``, ``v``
        ``[kv_indptr[-1], num_kv_heads, head_dim]`` -> ``o`` (``(o, lse)`` with ``return_lse``).
        ``q_scale``, ``k_scale``, ``v_scale``, ``o_scale``: FlashInfer applies them on this path only to fp8 / NVFP4
        K/V, which cuinfer does not have, so with 16-bit K/V they leave the result unchanged in both libraries."""
        common.run_refusals(args, kv_cache_sf=kv_cache_sf)
        return self._run(q, (k, v), out, lse, return_lse, lse_base, lse_layout, None)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self, q: Any, k: Any, v: Any, causal: bool = False, pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False, window_left: int = -1, logits_soft_cap: float | None = None,
        sm_scale: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
    ) -> Any:  # fmt: skip
        """Deprecated in FlashInfer (use ``run``): its options replace the plan's (cuinfer plans again if they
        differ)."""
        return self._prefill_forward(locals(), False)

    def forward_return_lse(
        self, q: Any, k: Any, v: Any, causal: bool = False, pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False, window_left: int = -1, logits_soft_cap: float | None = None,
        sm_scale: float | None = None, rope_scale: float | None = None, rope_theta: float | None = None,
    ) -> Any:  # fmt: skip
        """Deprecated in FlashInfer (use ``run_return_lse``): ``forward`` returning ``(o, lse)``."""
        return self._prefill_forward(locals(), True)
