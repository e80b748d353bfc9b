"""The launch side of ``BatchPrefill.run()``: what one plan launches, prepared once.

run() is on the host path of every prefill / append step. Everything fixed by a plan (the kernel, its shared memory,
plan-buffer pointers, options, the merge launch's grid) is worked out here once per plan, and the parameter struct is
rebuilt only when an array pointer, a stride or the lse output changes: the host side of a run() drops from ~100-180
us to decode's level on the GPU machine's host (FlashInfer's prefill run(): 20-50 us there).
"""

from __future__ import annotations

import math
from typing import Any

from cuinfer.formats.kv import KV
from cuinfer.interop.arrays import Tensor
from cuinfer.jit import get_kernel
from cuinfer.prefill.specs import PrefillParams, fast_div_magic, prefill_spec
from cuinfer.prefill.tiles import block_smem_bytes
from cuinfer.runtime.buffers import Buffers
from cuinfer.runtime.fp8 import NO_SCALES, KVScales
from cuinfer.variants.select import chain_values

_LOG2E = 1.0 / math.log(2.0)

# Plan-buffer arrays the kernel reads, by their PrefillParams field names (== plan offset names).
_PLAN_ARRAYS = (
    "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "work_indptr",
    "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial",
)  # fmt: skip


class PrefillLaunch:
    """What run() launches for one plan: the kernel, its grid and shared memory, the static part of the parameter
    struct, and the merge launch's arguments (split plans)."""

    def __init__(self, buf: Buffers, plan: Any, device_id: int, paged: bool, max_merge: int) -> None:
        """``max_merge``: the merge targets the merge launch is sized for (the plan's; in CUDA-graph mode the
        capacity of the fixed layout, so a captured launch covers every later plan)."""
        from cuinfer.merge import merge_partials_rows_per_block
        from cuinfer.runtime.device import device_info

        self.plan, self.device_id, self.dyn, self.params = plan, device_id, None, None
        off, opts = plan.offsets, plan.options
        self.buffers, self.stamp = buf, _stamp(buf)
        self.chain = plan.variant
        # the variant's parameters (fixed by the plan; a custom mask's bits are in the plan buffer): the second argument
        # (before _configure: a backend may pick its kernel by them)
        self.vvalues = chain_values(
            self.chain, opts, num_qo_heads=plan.num_qo_heads, user_values=plan.variant_values,
            mask_ptrs=(buf.ptr(off["mask"]), buf.ptr(off["mask_indptr"])), raw=True,
        )  # fmt: skip
        self._configure(plan, paged, device_id)
        dvo = plan.head_dim_vo
        partial_o, partial_lse = buf.partial_pointers(dvo)
        g = plan.num_qo_heads // plan.num_kv_heads
        g_mul, g_shift = fast_div_magic(g)
        p_mul, p_shift = fast_div_magic(plan.page_size)
        self.static = dict(
            partial_o=partial_o, partial_lse=partial_lse, pool_count=buf.merge_count_ptr(),
            **{name: buf.ptr(off[name]) for name in _PLAN_ARRAYS},
            item_merge=buf.ptr(off["item_merge"]),
            group_size=g, page_size=plan.page_size, natural_groups=plan.compact_groups,
            group_mul=g_mul, group_shift=g_shift, page_mul=p_mul, page_shift=p_shift,
        )  # fmt: skip
        self.sm_scale = opts.sm_scale
        self.vparams = self.chain.pack(self.vvalues)
        # array parameters given at run() (variant_arrays): their slots, and the addresses vparams holds
        self.array_slots = tuple((v, q.name) for v, q in self.chain.array_params)
        self.array_ptrs: tuple | None = None
        # Split plans merge their partial states in a second launch (sized for max_merge).
        self.merge = None
        if max_merge:
            per_block = merge_partials_rows_per_block(plan.o_dtype, dvo)
            grid = max(1, min(16 * device_info(device_id).sm_count, -(-max_merge // per_block)))
            self.merge = dict(
                num_targets_ptr=buf.ptr(1), merge_indptr_ptr=buf.ptr(off["merge_indptr"]),
                merge_src_ptr=buf.ptr(off["merge_src"]), merge_dst_token_ptr=buf.ptr(off["merge_dst_token"]),
                merge_dst_head_ptr=buf.ptr(off["merge_dst_head"]), partial_o_ptr=partial_o,
                partial_lse_ptr=partial_lse, grid=grid,
            )  # fmt: skip

    def _configure(self, plan: Any, paged: bool, device_id: int) -> None:
        """The kernel, its grid, block and shared memory: the FA2-class kernel of the plan's tiles. A paired block
        (cfg.groups == 2) runs two CTAs of the plan: half the blocks, twice the threads and smem."""
        key, cfg = plan.key(paged), plan.config
        self.kernel = get_kernel(prefill_spec(key), key.name_expr(), device_id)
        self.num_ctas, self.threads = plan.work.num_ctas // cfg.groups, cfg.block_threads
        self.smem_bytes = block_smem_bytes(cfg, plan.head_dim, plan.head_dim_vo, paged, variant=key.variant)

    def _extra_args(self, tq: Tensor, kv: KV) -> tuple:
        """Kernel arguments after the parameter structs, made when an array pointer or stride changes (none here)."""
        return ()

    def current(self, buf: Buffers, plan: Any, device_id: int) -> bool:
        """Still valid for ``plan`` on this device with the wrapper's current buffers ``buf`` (a grown workspace moves
        the partial-state and plan-buffer pointers)."""
        return self.plan is plan and self.device_id == device_id and self.buffers is buf and self.stamp == _stamp(buf)

    def launch(
        self, stream: Any, tq: Tensor, kv: KV, to: Tensor, tl: Tensor | None, scales: KVScales = NO_SCALES,
        arrays: dict | None = None,
    ) -> None:  # fmt: skip
        """Enqueue the kernel (and the merge of split plans). ``scales`` (fp8 caches): numbers folded into sm_scale /
        v_scale, arrays read by the kernel; ``arrays``: run()'s checked variant arrays."""
        if self.array_slots:
            ptrs = tuple(arrays[s].ptr for s in self.array_slots)
            if ptrs != self.array_ptrs:
                self.vparams = self.chain.pack(self.vvalues, dict(zip(self.array_slots, ptrs, strict=True)))
                self.array_ptrs = ptrs
        dyn = (tq.ptr, tq.strides, kv.k_ptr, kv.v_ptr, kv.k_strides, kv.v_strides, to.ptr, to.strides,
               None if tl is None else (tl.ptr, tl.strides), scales.key)  # fmt: skip
        if dyn != self.dyn:
            self.scales = scales  # (keeps the scale arrays' Tensors alive with the parameters that point at them)
            sm = self.sm_scale * scales.k
            self.params = PrefillParams.pack(
                **self.static, sm_scale=sm, sm_scale_log2=sm * _LOG2E, v_scale=scales.v, k_scales=scales.k_ptr,
                v_scales=scales.v_ptr, k_scales_stride=scales.k_stride, v_scales_stride=scales.v_stride,
                q=tq.ptr, k=kv.k_ptr, v=kv.v_ptr, o=to.ptr, lse=0 if tl is None else tl.ptr,
                q_stride_n=tq.strides[0], q_stride_h=tq.strides[1],
                k_stride_n=kv.k_strides[1], k_stride_h=kv.k_strides[2], k_stride_page=kv.k_strides[0],
                v_stride_n=kv.v_strides[1], v_stride_h=kv.v_strides[2],
                o_stride_n=to.strides[0], o_stride_h=to.strides[1],
                lse_stride_n=0 if tl is None else tl.strides[0], lse_stride_h=0 if tl is None else tl.strides[1],
            )  # fmt: skip
            self.extra = self._extra_args(tq, kv)
            self.dyn = dyn
        self.kernel.launch(self.num_ctas, self.threads, (self.params, self.vparams, *self.extra),
                           smem_bytes=self.smem_bytes, stream=stream)  # fmt: skip
        if self.merge is not None:
            from cuinfer.merge import launch_merge_partials

            launch_merge_partials(device_id=self.device_id, stream=stream, o=to, lse=tl, **self.merge)


def _stamp(buf: Any) -> tuple[int, int]:
    """The device addresses a launch state bakes in: plan buffer and workspace (both move when they grow)."""
    return int(buf.device.data.ptr), int(buf.workspace.data.ptr)
