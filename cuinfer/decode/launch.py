"""The launch side of ``BatchDecode.run()``: what one plan launches, prepared once.

run() is on the critical path of every decode step; everything fixed by a plan (kernels, plan-buffer pointers, options,
grids) is prepared here once, and the parameter structs are rebuilt only when an array pointer, a stride or a scale
changes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cuinfer.decode.policy import kv_evict_first
from cuinfer.decode.specs import DecodeParams, decode_spec
from cuinfer.formats.kv import KV
from cuinfer.interop.arrays import Tensor
from cuinfer.jit import get_kernel
from cuinfer.runtime.buffers import Buffers
from cuinfer.runtime.device import device_info
from cuinfer.runtime.fp8 import KVScales
from cuinfer.variants.select import chain_values

_LOG2E = 1.0 / math.log(2.0)


class DecodeLaunch:
    """What run() launches for one plan: kernels, grids and the static part of the parameter structs."""

    def __init__(self, buf: Buffers, plan: Any, want_lse: bool, device_id: int) -> None:
        self.plan, self.want_lse, self.device_id, self.dyn = plan, want_lse, device_id, None
        off, opts, work = plan.offsets, plan.options, plan.work
        key = plan.key(want_lse)
        self.kernel = get_kernel(decode_spec(key), key.name_expr(), device_id)
        self.num_ctas, self.threads, self.smem_bytes = work.num_ctas, plan.config.threads, plan.config.smem_bytes
        d = plan.head_dim
        partial_o, partial_lse = buf.partial_pointers(d)
        self.sm_scale = opts.sm_scale
        # the variant's parameters (fixed by the plan): the kernel's second argument
        masked = plan.mask_bytes is not None
        self.chain = plan.variant
        self.vvalues = chain_values(
            plan.variant, opts, num_qo_heads=plan.num_qo_heads, user_values=plan.variant_values,
            mask_ptrs=(buf.ptr(off["mask"]), buf.ptr(off["mask_indptr"])) if masked else None, raw=True,
        )  # fmt: skip
        self.vparams = self.chain.pack(self.vvalues)
        # array parameters given at run() (variant_arrays): their slots, and the addresses vparams holds
        self.array_slots = tuple((v, q.name) for v, q in self.chain.array_params)
        self.array_ptrs: tuple | None = None
        kv_bytes = int(plan.kv_lens.sum(dtype=np.int64)) * plan.num_kv_heads * d * 2 * plan.config.kv_itemsize
        self.static = dict(
            partial_o=partial_o, partial_lse=partial_lse,
            page_indptr=buf.ptr(off["page_indptr"]), page_indices=buf.ptr(off["page_indices"]),
            kv_lens=buf.ptr(off["kv_lens"]),
            **{name: buf.ptr(off[name]) for name in (
                "work_indptr", "item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end",
                "item_partial", "item_merge", "item_pieces")},
            merge_count=buf.merge_count_ptr(),
            # the plan and page table (one buffer): the kernel's prologue prefetches it into L2 (decode_pipeline.cuh)
            plan_words=buf.ptr(0), plan_bytes=4 * int(plan.words_used), page_size=plan.page_size,
            kv_evict_first=int(kv_evict_first(kv_bytes, device_info(device_id).l2_bytes)),
        )  # fmt: skip
        # (split requests merge inside the kernel, decode.cuh merge_split: one launch per step)

    def set_arrays(self, arrays: dict) -> None:
        """Point ``vparams`` at run()'s variant arrays (``{(variant, param): Tensor}``, checked), repacked only when
        an address changes."""
        ptrs = tuple(arrays[s].ptr for s in self.array_slots)
        if ptrs != self.array_ptrs:
            self.vparams = self.chain.pack(self.vvalues, dict(zip(self.array_slots, ptrs, strict=True)))
            self.array_ptrs = ptrs

    def repack(self, tq: Tensor, kv: KV, to: Tensor, tl: Tensor | None, scales: KVScales) -> None:
        """The parameter struct for these arrays (q may be a view of one request with a batch stride of 0) and fp8
        scales (numbers folded into sm_scale / v_scale; arrays read by the kernels per item)."""
        self.scales = scales  # (keeps the scale arrays' Tensors alive with the parameters that point at them)
        scale = self.sm_scale * scales.k
        self.params = DecodeParams.pack(
            **self.static,
            q=tq.ptr, k=kv.k_ptr, v=kv.v_ptr, o=to.ptr, lse=0 if tl is None else tl.ptr,
            q_stride_b=tq.strides[0], q_stride_h=tq.strides[1],
            k_stride_page=kv.k_strides[0], k_stride_slot=kv.k_strides[1], k_stride_head=kv.k_strides[2],
            v_stride_page=kv.v_strides[0], v_stride_slot=kv.v_strides[1], v_stride_head=kv.v_strides[2],
            o_stride_b=to.strides[0], o_stride_h=to.strides[1],
            lse_stride_b=0 if tl is None else tl.strides[0], lse_stride_h=0 if tl is None else tl.strides[1],
            sm_scale=scale, logits_scale=scale * _LOG2E, v_scale=scales.v,
            k_scales=scales.k_ptr, v_scales=scales.v_ptr, k_scales_stride=scales.k_stride,
            v_scales_stride=scales.v_stride,
        )  # fmt: skip
