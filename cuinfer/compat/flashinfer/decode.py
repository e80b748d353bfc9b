"""FlashInfer's decode API on cuinfer: ``BatchDecodeWithPagedKVCacheWrapper`` (and its CUDA-graph subclass) over
``cuinfer.BatchDecode``, ``single_decode_with_kv_cache`` over ``cuinfer.single_decode``.

FlashInfer 0.7.2's names, positional order, defaults and return conventions; the LSE is base 2 in both libraries,
so it passes through unchanged. Options that change results and that cuinfer does not implement raise
``NotImplementedError`` naming them (docs/compat.md lists every argument).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

from cuinfer.compat.flashinfer import common
from cuinfer.compat.flashinfer.wrapper import CompatWrapper
from cuinfer.decode import BatchDecode, single_decode

# FlashInfer's order of the optional plan() arguments that may still be passed positionally (deprecated).
PLAN_LEGACY_POSITIONAL = (
    "pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "o_data_type", "data_type",
    "sm_scale", "rope_scale", "rope_theta", "non_blocking", "block_tables", "seq_lens", "fixed_split_size",
    "disable_split_kv", "q_len_per_req",
)  # fmt: skip
_MULTI_TOKEN = (
    "multi-token decode rows are not in cuinfer's decode kernels; use BatchPrefillWithPagedKVCacheWrapper with "
    "qo_indptr = arange(batch_size + 1) * q_len_per_req and causal=True"
)


class BatchDecodeWithPagedKVCacheWrapper(CompatWrapper):
    """FlashInfer's batch decode wrapper over ``cuinfer.BatchDecode``.

    ``float_workspace_buffer`` gives the device (cuinfer keeps its own workspace); ``use_tensor_cores`` picks
    cuinfer's tensor-core or CUDA-core decode kernel as it picks FlashInfer's (``None``, not a FlashInfer value, lets
    cuinfer choose by the GQA group); ``use_cuda_graph`` fixes the batch size at ``len(paged_kv_last_page_len_buffer)``
    as in FlashInfer (cuinfer does not write the buffers: its page table lives in its own plan buffer).
    """

    _API = "BatchDecodeWithPagedKVCacheWrapper"
    _RUN_ARRAYS = ("q", "paged_kv_cache")

    def __init__(
        self,
        float_workspace_buffer: Any,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: Any = None,
        paged_kv_indices_buffer: Any = None,
        paged_kv_last_page_len_buffer: Any = None,
        backend: str = "auto",
        jit_args: Any = None,
    ) -> None:
        common.backend(backend)  # (decode has one kernel family: 'auto', 'fa2' and 'fa3' all run it)
        common.check_no_jit(jit_args)
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph)
        if use_cuda_graph:
            common.require_buffers(
                "cudagraph",
                paged_kv_indptr_buffer=paged_kv_indptr_buffer, paged_kv_indices_buffer=paged_kv_indices_buffer,
                paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer,
            )  # fmt: skip
            self._fixed_batch_size = common.length(paged_kv_last_page_len_buffer)
            if common.length(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._use_tensor_cores = use_tensor_cores
        self._backend = backend
        self._batch_size = 0
        self._core = BatchDecode(
            kv_layout=self._kv_layout, use_tensor_cores=None if use_tensor_cores is None else bool(use_tensor_cores),
            **self._core_settings(),
        )  # fmt: skip

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    # -- planning ----------------------------------------------------------------------------------------------------

    def plan(
        self, indptr: Any, indices: Any, last_page_len: Any, num_qo_heads: int, num_kv_heads: int, head_dim: int,
        page_size: int, *deprecated_positional_args: Any, **kwargs: Any,
    ) -> None:  # fmt: skip
        """Plan one decode step (FlashInfer's arguments; the options after ``page_size`` are keywords, see
        ``_plan_impl``; passing them positionally is deprecated, as in FlashInfer)."""
        if deprecated_positional_args:
            kwargs = common.merge_legacy_positional(self._API, deprecated_positional_args, PLAN_LEGACY_POSITIONAL,
                                                    kwargs)  # fmt: skip
        self._plan_impl(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs)

    begin_forward = plan

    def _plan_impl(
        self, indptr: Any, indices: Any, last_page_len: Any, num_qo_heads: int, num_kv_heads: int, head_dim: int,
        page_size: int, *, pos_encoding_mode: str = "NONE", window_left: int = -1, window_right: int = 0,
        logits_soft_cap: float | None = None, q_data_type: Any = "float16", kv_data_type: Any = None,
        o_data_type: Any = None, data_type: Any = None, sm_scale: float | None = None,
        rope_scale: float | None = None, rope_theta: float | None = None, non_blocking: bool = True,
        block_tables: Any = None, seq_lens: Any = None, fixed_split_size: int | None = None,
        disable_split_kv: bool = False, q_len_per_req: int = 1, is_causal: bool | None = None,
    ) -> None:  # fmt: skip
        # non_blocking (copies), block_tables and seq_lens (planning inputs of FlashInfer's other backends) do not
        # change results: cuinfer reads the CSR page table, as FlashInfer's fa2 path does.
        call = {k: v for k, v in locals().items() if k not in _PLAN_POSITIONAL}
        if window_right != 0:
            raise NotImplementedError(
                "BatchDecodeWithPagedKVCacheWrapper only supports window_right != 0 with FlashInfer's cute-dsl "
                "backend, which cuinfer.compat.flashinfer does not cover; leave window_right=0"
            )
        if q_len_per_req < 1:
            raise ValueError(f"q_len_per_req must be >= 1, got {q_len_per_req}")
        if is_causal is not None and bool(is_causal) != (q_len_per_req > 1):
            raise NotImplementedError(
                "the decode mask derives from q_len_per_req; an explicit is_causal override is not supported"
            )
        common.refuse(q_len_per_req=(q_len_per_req, q_len_per_req > 1, _MULTI_TOKEN))
        if data_type is not None:
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        if fixed_split_size is not None and not self._use_tensor_cores:
            raise ValueError("fixed_split_size is only supported by tensor core decode for now.")
        batch = common.length(last_page_len)
        self._check_graph_batch(batch)
        if self._use_cuda_graph and common.length(indices) > common.length(self._paged_kv_indices_buf):
            raise ValueError("The size of indices should be less than or equal to the allocated buffer")
        opts = common.attention_options(call, num_qo_heads)
        q_dtype = common.data_type(q_data_type)
        self._core.plan(
            indptr, indices, last_page_len, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            page_size=page_size, q_dtype=q_dtype, kv_dtype=common.kv_data_type(kv_data_type),
            o_dtype=common.data_type(o_data_type),
            fixed_split_size=common.split_options(fixed_split_size, disable_split_kv, page_size), **opts,
        )  # fmt: skip
        self._batch_size = batch
        self._remember((indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size), call,
                       opts["window_left"])  # fmt: skip

    # -- running -----------------------------------------------------------------------------------------------------

    def run(
        self, q: Any, paged_kv_cache: Any, *args: Any, q_scale: float | None = None, k_scale: float | None = None,
        v_scale: float | None = None, out: Any = None, lse: Any = None, return_lse: bool = False,
        enable_pdl: bool | None = None, window_left: int | None = None, sinks: Any = None,
        q_len_per_req: int | None = None, skip_softmax_threshold_scale_factor: float | None = None,
        kv_cache_sf: Any = None,
    ) -> Any:  # fmt: skip
        """Decode ``q [batch_size, num_qo_heads, head_dim]`` against the paged cache -> ``o`` (``(o, lse)`` with
        ``return_lse``; lse base 2 ``[batch_size, num_qo_heads]``). ``enable_pdl`` is a launch hint (no effect)."""
        common.run_refusals(args, sinks, kv_cache_sf, skip_softmax_threshold_scale_factor)
        if q_len_per_req is not None:
            warnings.warn(
                "Passing `q_len_per_req` to BatchDecodeWithPagedKVCacheWrapper.run() is deprecated; pass it to "
                "plan() instead. Scheduled for removal in a future release.",
                DeprecationWarning,
                stacklevel=2,
            )
            expected = self._batch_size * int(q_len_per_req)
            if q.shape[0] != expected:
                raise ValueError(
                    f"q.shape[0] ({q.shape[0]}) does not match batch_size * q_len_per_req ({self._batch_size} * "
                    f"{q_len_per_req} = {expected}). For batch decode, q must have shape "
                    "[batch_size * q_len_per_req, num_heads, head_dim]."
                )
        self._check_run_window(window_left)
        k_eff = None
        for s in (q_scale, k_scale):  # (both multiply sm_scale in FlashInfer; cuinfer's k_scale does the same)
            if s is not None:
                k_eff = (1.0 if k_eff is None else k_eff) * common.scalar(s)
        result = self._core.run(
            q, common.expand_paged(paged_kv_cache, self._kv_layout), out=out, lse=lse,
            return_lse=return_lse or lse is not None, k_scale=k_eff, v_scale=common.scalar(v_scale),
        )  # fmt: skip
        return self._finish(result, return_lse, None)  # (v_scale applied in the kernel)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self, q: Any, paged_kv_cache: Any, pos_encoding_mode: str = "NONE", q_scale: float | None = None,
        k_scale: float | None = None, v_scale: float | None = None, window_left: int = -1,
        logits_soft_cap: float | None = None, sm_scale: float | None = None, rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> Any:  # fmt: skip
        """Deprecated in FlashInfer (use ``run``): its options replace the plan's (cuinfer plans again if they
        differ)."""
        return self._forward(locals(), False, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(
        self, q: Any, paged_kv_cache: Any, pos_encoding_mode: str = "NONE", q_scale: float | None = None,
        k_scale: float | None = None, v_scale: float | None = None, window_left: int = -1,
        logits_soft_cap: float | None = None, sm_scale: float | None = None, rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> Any:  # fmt: skip
        """Deprecated in FlashInfer (use ``run_return_lse``): ``forward`` returning ``(o, lse)``."""
        return self._forward(locals(), True, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)


_PLAN_POSITIONAL = frozenset(
    ("self", "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size")
)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph decode wrapper: ``BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True)`` with the
    three buffers."""

    def __init__(
        self, workspace_buffer: Any, indptr_buffer: Any, indices_buffer: Any, last_page_len_buffer: Any,
        kv_layout: str = "NHD", use_tensor_cores: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(
            workspace_buffer, kv_layout, use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=indptr_buffer, paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=last_page_len_buffer,
        )  # fmt: skip


def single_decode_with_kv_cache(
    q: Any,
    k: Any,
    v: Any,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    sm_scale: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    return_lse: bool = False,
) -> Any:
    """FlashInfer's single-request decode: ``q [num_qo_heads, head_dim]``, ``k``/``v`` ``[kv_len, num_kv_heads,
    head_dim]`` (NHD) -> ``o`` (, lse base 2 ``[num_qo_heads]``). ``use_tensor_cores`` only picks a kernel in
    FlashInfer (same result); cuinfer's ``single_decode`` picks its own. ``q_scale`` and ``k_scale`` multiply
    ``sm_scale``, ``v_scale`` the output, as in FlashInfer."""
    opts = common.attention_options(locals(), q.shape[-2])
    scale = opts.pop("sm_scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    for s in (q_scale, k_scale):
        if s is not None:
            scale *= common.scalar(s)
    result = single_decode(
        q, k, v, kv_layout=common.kv_layout(kv_layout), sm_scale=scale, return_lse=return_lse, **opts
    )  # fmt: skip
    if not return_lse:
        return common.scale_output(result, v_scale)
    return common.scale_output(result[0], v_scale), result[1]
