"""``BatchDecode``: batch decode on a paged KV cache, on the plan/run lifecycle of ``cuinfer.runtime.wrapper``.

``plan()`` runs on the host once per generation step, from the page table alone: it picks the kernel and its tiles
(``cuinfer.decode.policy``), sizes the persistent grid from the kernel's occupancy, balances the work items over it
(``cuinfer.planner``) and packs plan + page table into one pinned int32 buffer. ``run()`` only validates and
enqueues, on the caller's current stream: the async copy of that buffer (once per plan and stream; every time in
CUDA-graph mode, so a captured graph replays whatever the latest ``plan()`` wrote) and the decode kernel, which also
merges the split-KV partial states of a request (the last of its pieces to finish does it). ``run()`` never
synchronises.

NumPy inputs to ``run()`` run the float64 CPU reference and return NumPy arrays in the output dtypes the GPU would
produce (o in ``o_dtype``, lse float32).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.decode.launch import DecodeLaunch
from cuinfer.decode.plan import DecodePlan, host_plan
from cuinfer.decode.policy import ctas_per_sm
from cuinfer.formats.kv import KV
from cuinfer.formats.paged import check_cache_matches, check_pages_in_cache, paged_kv
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor
from cuinfer.planner import layout as plan_layout
from cuinfer.planner.cost import kv_itemsize_cost
from cuinfer.planner.decode_plan import decode_planner
from cuinfer.planner.work import WorkPlan, plan_work
from cuinfer.reference import variants as ref_variants
from cuinfer.runtime.buffers import FixedLayout, check_fixed_values
from cuinfer.runtime.calls import Call
from cuinfer.runtime.fp8 import (
    KVScales,
    check_scale_args,
    check_scales,
    host_cache,
    match_cache_dtype,
    reference_scales,
)
from cuinfer.runtime.options import check_int
from cuinfer.runtime.outputs import replan_hint
from cuinfer.runtime.wrapper import PlanRunWrapper, check_q_dtype
from cuinfer.variants import host as variant_host
from cuinfer.variants.select import check_user_values

DEFAULT_WORKSPACE_BYTES = 128 << 20
# Host-side occupancy estimate when no GPU is present (H200: 228 KB of shared memory and 132 SMs).
_DEFAULT_SMEM_PER_SM = 233472
_DEFAULT_SMS = 132


def _align4(x: int) -> int:
    return (x + 3) & ~3


def _plain(x: Any) -> bool:
    """A scale run() keys its parameter memo on by value: None or a Python number."""
    return x is None or type(x) is float or type(x) is int


class BatchDecode(PlanRunWrapper):
    """Decode attention for a batch of requests over a paged KV cache: ``plan()`` once per step, ``run()`` per layer.

    ``use_tensor_cores``: None picks by the GQA group (``cuinfer.decode.policy``); True / False force a kernel.
    ``use_cuda_graph``: fixes every device pointer at the first ``plan()`` (capacities from ``max_batch_size``), so a
    ``run()`` captured in a CUDA graph stays valid across later ``plan()`` calls. Do not re-plan while a replay is
    in flight (the graph reads the one pinned plan buffer).
    ``workspace_bytes``: device memory for split-KV partial states. Given (or with CUDA graphs: default 128 MiB), a
    plan that needs more raises; left out, the workspace grows as plans need.
    """

    _NAME = "BatchDecode"
    _PLAN_CALL = "plan(kv_indptr, kv_indices, kv_last_page_len, ...)"
    _RUN_ARRAY_NAMES = ("q", "k_cache", "v_cache", "out")
    _DEFAULT_WORKSPACE_BYTES = DEFAULT_WORKSPACE_BYTES
    _plan: DecodePlan | None
    _launch_state: DecodeLaunch | None

    def __init__(
        self,
        *,
        kv_layout: str = "NHD",
        use_tensor_cores: bool | None = None,
        use_cuda_graph: bool = False,
        max_batch_size: int | None = None,
        workspace_bytes: int | None = None,
        device: int | None = None,
    ) -> None:
        super().__init__(
            kv_layout=kv_layout, use_cuda_graph=use_cuda_graph, max_batch_size=max_batch_size,
            workspace_bytes=workspace_bytes, device=device,
        )  # fmt: skip
        self.use_tensor_cores = use_tensor_cores
        self._ctas: dict = {}
        self._ctas_memo: tuple | None = None
        self._route_memo: tuple | None = None
        self._words_memo: tuple | None = None  # the last (layout, batch capacity, offsets)

    # -- planning --------------------------------------------------------------------------------------------------

    def plan(
        self, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, *, num_qo_heads: int, num_kv_heads: int,
        head_dim: int, page_size: int, q_dtype: Any, kv_dtype: Any = None, o_dtype: Any = None,
        sm_scale: float | None = None, logits_soft_cap: float = 0.0, window_left: int = -1,
        pos_encoding: str = "none", rope_scale: float = 1.0, rope_theta: float = 1e4, variant: Any = None,
        variant_params: dict | None = None, custom_mask: Any = None, packed_custom_mask: Any = None,
        num_sms: int | None = None, fixed_split_size: int | None = None,
    ) -> None:  # fmt: skip
        """Plan one decode step. Index arrays may be lists, NumPy arrays, host tensors or device arrays (one
        device-to-host copy). ``variant``: a ``cuinfer.Variant``, a registered name or a sequence of them, applied
        after the built-in options; ``variant_params``: their parameters, ``{variant name: {param: value}}``.
        ``custom_mask``: each request's ``kv_len`` bools (True = keep), concatenated (or ``packed_custom_mask``, as
        ``segment_packbits(..., bitorder="little")`` gives).
        Raises before anything reaches the GPU when the inputs or the workspace do not fit."""
        static = (num_qo_heads, num_kv_heads, head_dim, page_size, q_dtype, kv_dtype, o_dtype, sm_scale,
                  logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant)  # fmt: skip
        plan = host_plan(
            static, self._static, self.use_tensor_cores, kv_indptr, kv_indices, kv_last_page_len,
            self.max_batch_size if self.use_cuda_graph else None, custom_mask, packed_custom_mask,
        )  # fmt: skip
        plan.variant_values = check_user_values(plan.variant, variant_params)
        device_id = self._device_id
        if device_id is False:  # (asked once per wrapper)
            device_id = self._device_or_none()
        plan.work = self._work(plan, self._route(plan, num_sms, device_id), fixed_split_size)
        self._commit(plan, device_id)

    def workspace_size(
        self, kv_indptr: Any, kv_indices: Any, kv_last_page_len: Any, *, num_qo_heads: int, num_kv_heads: int,
        head_dim: int, page_size: int, q_dtype: Any, kv_dtype: Any = None, o_dtype: Any = None,
        sm_scale: float | None = None, logits_soft_cap: float = 0.0, window_left: int = -1,
        pos_encoding: str = "none", rope_scale: float = 1.0, rope_theta: float = 1e4, variant: Any = None,
        variant_params: dict | None = None, custom_mask: Any = None, packed_custom_mask: Any = None,
        num_sms: int | None = None, fixed_split_size: int | None = None,
    ) -> int:  # fmt: skip
        """Exact workspace bytes ``plan()`` with these arguments needs for its split-KV partial states."""
        static = (num_qo_heads, num_kv_heads, head_dim, page_size, q_dtype, kv_dtype, o_dtype, sm_scale,
                  logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant)  # fmt: skip
        plan = host_plan(
            static, self._static, self.use_tensor_cores, kv_indptr, kv_indices, kv_last_page_len,
            self.max_batch_size if self.use_cuda_graph else None,
        )  # fmt: skip
        plan.work = self._work(plan, self._route(plan, num_sms, self._device_or_none()), fixed_split_size)
        return self._workspace_need(plan)

    def _num_ctas(self, plan: DecodePlan, num_sms: int | None, device_id: int | None) -> int:
        """The persistent grid: CTAs per SM from shared memory and threads (registers are bounded at compile time by
        the same count, ``DecodeConfig.min_blocks``), times the SM count; no kernel is compiled to plan."""
        memo = self._ctas_memo  # the last answer, compared by identity (hashing the config costs a microsecond)
        if memo is not None and memo[0] is plan.config and memo[1] == num_sms and memo[2] == device_id:
            return memo[3]
        key = (plan.config, num_sms, device_id)
        n = self._ctas.get(key)
        if n is None:
            n = self._ctas[key] = self._count_ctas(plan, num_sms, device_id)
        self._ctas_memo = (plan.config, num_sms, device_id, n)
        return n

    @staticmethod
    def _count_ctas(plan: DecodePlan, num_sms: int | None, device_id: int | None) -> int:
        if device_id is None:
            smem, threads, sms = _DEFAULT_SMEM_PER_SM, 2048, _DEFAULT_SMS
        else:
            from cuinfer.runtime.device import device_info

            info = device_info(device_id)
            smem, threads, sms = info.smem_per_sm, info.max_threads_per_sm, info.sm_count
        per_sm = min(ctas_per_sm(plan.config, smem_per_sm=smem, max_threads_per_sm=threads), plan.config.min_blocks)
        return per_sm * (sms if num_sms is None else check_int("num_sms", num_sms))

    def _route(self, plan: DecodePlan, num_sms: int | None, device_id: int | None) -> tuple:
        """``(num_ctas, decode planner or None)``: the grid and, with one query tile per request, the decode planner
        of this configuration (plan_work would pick the same one after checking its arguments). Memoised by
        identity: ``config`` and ``options`` come from the static memo, one pair per set of static arguments."""
        if num_sms is not None and type(num_sms) is not int:
            check_int("num_sms", num_sms)  # (before the memos, where 4.0 == 4)
        memo = self._route_memo
        if (
            memo is not None and memo[0] is plan.config and memo[1] is plan.options and memo[2] == num_sms
            and memo[3] == device_id
        ):  # fmt: skip
            return memo[4]
        num_ctas = self._num_ctas(plan, num_sms, device_id)
        planner = None
        g = plan.num_qo_heads // plan.num_kv_heads
        if g <= plan.config.rows_per_tile:
            planner = decode_planner(
                plan.num_kv_heads, g, plan.config.rows_per_tile, num_ctas, plan.config.tile_kv,
                plan.options.window_left, cost=kv_itemsize_cost(plan.config.kv_itemsize),
            )  # fmt: skip
        route = (num_ctas, planner)
        self._route_memo = (plan.config, plan.options, num_sms, device_id, route)
        return route

    def _work(self, plan: DecodePlan, route: tuple, fixed_split_size: int | None) -> WorkPlan:
        """The work plan on the grid of ``route`` (``_route``): the decode planner's, else the tile pipeline's."""
        if fixed_split_size is not None:
            fixed_split_size = check_int("fixed_split_size", fixed_split_size, rule="a positive number of KV tokens")
        num_ctas, planner = route
        if fixed_split_size is None and planner is not None and plan.batch:
            work = planner.plan(plan.kv_lens, *plan.kv_range)
            if work is not None:
                work.merge_in_kernel = True  # the decode kernels merge split requests themselves (merge_split)
                return work
        tile = plan.config.tile_kv
        granule = math.gcd(int(fixed_split_size), tile) if fixed_split_size is not None else tile
        work = plan_work(
            None, plan.kv_lens, num_kv_heads=plan.num_kv_heads, group_size=plan.num_qo_heads // plan.num_kv_heads,
            tile_rows=plan.config.rows_per_tile, num_ctas=num_ctas, kv_granule=granule,
            window_left=plan.options.window_left,
            fixed_split_size=None if fixed_split_size is None else int(fixed_split_size), kv_range=plan.kv_range,
            cost=kv_itemsize_cost(plan.config.kv_itemsize),
        )  # fmt: skip
        work.merge_in_kernel = True
        return work

    def _words_layout(self, plan: DecodePlan, holder: Any) -> tuple:
        """``(plan layout, word offsets of the plan arrays and the page table, words in use)``. CUDA-graph mode fixes
        the layout at the first plan (kept on ``holder.fixed_layout``); otherwise it follows each plan (cached)."""
        batch, nnz = plan.batch, plan.nnz
        n_mask = 0 if plan.mask_bytes is None else plan.mask_bytes.shape[0]
        if self.use_cuda_graph:
            heads = (plan.num_kv_heads, plan.num_qo_heads // plan.num_kv_heads, plan.config)
            if holder.fixed_layout is None:
                cap = plan_layout.capacity_bound(
                    self.max_batch_size, self.max_batch_size, plan.num_kv_heads, heads[1], plan.config.rows_per_tile,
                    plan.work.num_ctas,
                )  # fmt: skip
                # Page indices (and mask bytes): room for twice the first plan's (at least 64 Ki pages), fixed then.
                lay = plan_layout.PlanLayout.for_capacity(**cap.__dict__)
                holder.fixed_layout = FixedLayout(
                    lay, heads, max(2 * nnz, 1 << 16), 2 * max(n_mask, 4), values=(plan.options, plan.variant_values)
                )
            fixed = holder.fixed_layout
            lay, page_cap, mask_cap = fixed.layout, fixed.page_cap, fixed.mask_cap
            if n_mask > mask_cap:
                raise ValueError(
                    f"the plan's custom mask has {n_mask} bytes but the CUDA-graph buffer holds {mask_cap} (twice the "
                    "first plan's, fixed then); plan the largest batch first or build a new wrapper"
                )
            if heads != fixed.signature:
                raise ValueError(
                    "with use_cuda_graph=True every plan() must keep the head configuration and kernel of the first "
                    f"(num_kv_heads, group, kernel) = {fixed.signature[:2]}, but this plan has {heads[:2]}"
                )
            check_fixed_values(fixed, plan.options, plan.variant_values)
            if nnz > page_cap:
                raise ValueError(
                    f"the plan reads {nnz} page indices but the CUDA-graph page table holds {page_cap} (twice the "
                    "first plan's, fixed then); plan the largest batch first or build a new wrapper"
                )
            b_cap = self.max_batch_size
        else:
            lay = plan_layout.PlanLayout.for_plan(plan.work)
            page_cap, b_cap, mask_cap = nnz, batch, n_mask
        last = self._words_memo  # the previous answer (a serving loop mostly keeps its layout)
        if last is not None and last[0] is lay and last[1] == b_cap:
            off = last[2]
        else:
            key = (id(lay), b_cap)  # the layout is kept in the value: its id stays unique while the entry lives
            hit = self._offsets.get(key)
            if hit is None or hit[0] is not lay:
                off = dict(lay.offsets)
                off["page_indptr"] = pos = lay.total_words
                off["kv_lens"] = pos = _align4(pos + b_cap + 1)
                off["page_indices"] = _align4(pos + b_cap)
                if len(self._offsets) >= 64:
                    self._offsets.clear()
                hit = self._offsets[key] = (lay, off)
            off = hit[1]
            self._words_memo = (lay, b_cap, off)
        end = _align4(off["page_indices"] + max(page_cap, 1))
        if mask_cap:  # (after the page table: plans without a mask keep their offsets)
            off = dict(off, mask_indptr=end, mask=_align4(end + b_cap + 1))
            end = _align4(off["mask"] + -(-mask_cap // 4))
        return lay, off, end

    def _fill_words(self, plan: DecodePlan, host: np.ndarray, lay: Any, off: dict, generation: int) -> None:
        """Pack the work plan and the page table into ``host`` at the word offsets ``off``; ``_pack_memo`` keeps the
        memo of ``planner.pack`` per host buffer and layout."""
        memos = self._pack_memo
        memo = memos.get(id(host))
        if memo is None or memo[0] is not host or memo[1] is not lay:
            if len(memos) >= 8:
                memos.clear()
            memo = memos[id(host)] = (host, lay, {})
        plan_layout.pack(plan.work, lay, host, generation=generation, memo=memo[2])
        b = plan.batch
        o = off["page_indptr"]
        host[o : o + b + 1] = plan.kv_indptr
        o = off["kv_lens"]
        host[o : o + b] = plan.kv_lens
        nnz, indices = plan.nnz, plan.kv_indices
        o = off["page_indices"]
        host[o : o + nnz] = indices if indices.shape[0] == nnz else indices[:nnz]
        if plan.mask_bytes is not None:
            o = off["mask_indptr"]
            host[o : o + b + 1] = plan.mask_indptr
            words = np.zeros(-(-plan.mask_bytes.shape[0] // 4) * 4, dtype=np.uint8)
            words[: plan.mask_bytes.shape[0]] = plan.mask_bytes
            o = off["mask"]
            host[o : o + words.shape[0] // 4] = words.view(np.int32)

    # -- running ---------------------------------------------------------------------------------------------------

    def run(
        self, q: Any, kv_cache: Any, *, out: Any = None, lse: Any = None, return_lse: bool = False,
        k_scale: float | None = None, v_scale: float | None = None, variant_arrays: dict | None = None,
    ) -> Any:  # fmt: skip
        """Decode ``q [batch, num_qo_heads, head_dim]`` against ``kv_cache`` -> ``o`` (or ``(o, lse)``; lse base 2).
        ``variant_arrays``: the array parameters of the plan's variants, ``{param: array}`` (e.g. ``{"sinks": s}``
        for the ``sinks`` variant: float32 ``[num_qo_heads]``), arrays of any framework on q's device.

        fp8 caches: ``k_scale`` / ``v_scale`` dequantise them (the cache holds ``k / k_scale``, ``v / v_scale``):
        numbers, or float32 arrays of 1 or ``num_kv_heads`` values on the GPU (cuinfer.runtime.fp8); a ``uint8`` cache
        (CuPy's fp8) is read as the plan's ``kv_dtype``. A 16-bit cache takes numbers: ``k_scale`` multiplies
        ``sm_scale``, ``v_scale`` the output."""
        if (k_scale is not None or v_scale is not None) and self._plan is not None:
            check_scale_args(self._plan.kv_dtype, k_scale, v_scale, numbers_16bit=True)
        return self._run(q, kv_cache, out, lse, return_lse or lse is not None, k_scale, v_scale, variant_arrays)

    def _kv_view(self, call: Call, plan: DecodePlan, kv_cache: Any) -> KV:
        return self._kv_views.view(kv_cache, call, plan, self._paged_kv)

    def _paged_kv(self, call: Call, plan: DecodePlan, kv_cache: Any) -> KV:
        """The cache's view, validated (``CacheViews`` reuses it while the same cache object comes back)."""
        kv = match_cache_dtype(paged_kv(call.tensor, kv_cache, self.kv_layout), plan.kv_dtype)
        self._check_kv(plan, kv)
        return kv

    def _check_q(self, plan: DecodePlan, tq: Tensor) -> None:
        validate.check_ndim("q", tq, 3, hint="q is [batch_size, num_qo_heads, head_dim]")
        validate.check_shape(
            "q", tq, (plan.batch, plan.num_qo_heads, plan.head_dim),
            hint=f"plan() was made for batch_size={plan.batch}, num_qo_heads={plan.num_qo_heads}, "
            f"head_dim={plan.head_dim}",
        )  # fmt: skip
        check_q_dtype(plan, tq)

    def _check_kv(self, plan: DecodePlan, kv: KV) -> None:
        check_cache_matches(kv, plan, self.kv_layout)
        if kv.k.dtype is not plan.kv_dtype:
            got = kv.k.dtype
            raise ValueError(
                f"kv_cache has dtype {got.value} but plan() was made for kv_dtype={plan.kv_dtype.value}; cast it with "
                f"{validate.cast_fix('kv_cache', kv.k.framework, plan.kv_dtype)}{replan_hint('kv_dtype', got)}"
            )
        check_pages_in_cache(plan.max_page, kv)

    def _launch(
        self, call: Call, plan: DecodePlan, tq: Tensor, kv: KV, to: Tensor, tl: Tensor | None, k_scale: Any,
        v_scale: Any,
    ) -> None:  # fmt: skip
        # The host path of run() is on the critical path of every decode step: everything fixed by the plan (kernels,
        # plan-buffer pointers, options, grids) is prepared once per plan, and the parameter structs are rebuilt
        # only when an array pointer, a stride, a scale or the stream changes.
        st = self._launch_state
        want_lse = tl is not None
        if st is None or st.plan is not plan or st.want_lse != want_lse or st.device_id != call.device_id:
            st = self._launch_state = DecodeLaunch(self._buffers, plan, want_lse, call.device_id)
        scales = None
        if _plain(k_scale) and _plain(v_scale):
            scale_key: tuple = (k_scale, v_scale)
        else:  # arrays: resolved every run (their pointers are the parameters)
            scales = self._scales(call, plan, k_scale, v_scale)
            scale_key = scales.key
        dyn = (
            tq.ptr, tq.strides, kv.k_ptr, kv.v_ptr, kv.k_strides, kv.v_strides, to.ptr, to.strides,
            None if tl is None else (tl.ptr, tl.strides), scale_key,
        )  # fmt: skip
        if dyn != st.dyn:
            st.repack(tq, kv, to, tl, scales if scales is not None else self._scales(call, plan, k_scale, v_scale))
            st.dyn = dyn
        if st.array_slots:
            st.set_arrays(call.variant_arrays)
        st.kernel.launch(st.num_ctas, st.threads, (st.params, st.vparams), smem_bytes=st.smem_bytes, stream=call.stream)

    @staticmethod
    def _scales(call: Call | None, plan: DecodePlan, k_scale: Any, v_scale: Any) -> KVScales:
        return check_scales(plan.kv_dtype, k_scale, v_scale, num_kv_heads=plan.num_kv_heads, call=call,
                            gpu=call is not None, numbers_16bit=True)  # fmt: skip

    def _reference(
        self, plan: DecodePlan, tq: Tensor, kv_cache: Any, kvt: KV, k_scale: Any, v_scale: Any, arrays: dict
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        kv_cache = host_cache(kv_cache, plan.kv_dtype)  # (a uint8 cache read as the plan's fp8 format)
        scales = reference_scales(self._scales(None, plan, k_scale, v_scale))
        if variant_host.needs_steps(plan.variant):
            return self._reference_steps(plan, tq.numpy(), kv_cache, arrays, scales)
        if plan.mask_bytes is None:
            return reference.batch_decode_paged(
                tq.numpy(), kv_cache, plan.kv_indptr, plan.kv_indices, plan.kv_last_page_len, kv_layout=self.kv_layout,
                **plan.options.reference_kwargs(), **scales,
            )  # fmt: skip
        # one query row per request: the prefill reference with its custom mask
        qo = np.arange(plan.batch + 1, dtype=np.int32)
        kv_tok = np.concatenate([[0], np.cumsum(plan.kv_lens)])
        mask = reference.unpack_custom_mask(plan.mask_bytes, qo, kv_tok)
        return reference.batch_prefill_paged(
            tq.numpy(), kv_cache, qo, plan.kv_indptr, plan.kv_indices, plan.kv_last_page_len, kv_layout=self.kv_layout,
            custom_mask=mask, **plan.options.reference_kwargs(), **scales,
        )  # fmt: skip

    def _reference_steps(
        self, plan: DecodePlan, q: np.ndarray, kv_cache: Any, arrays: dict, scales: dict
    ) -> tuple[np.ndarray, np.ndarray]:
        """The float64 reference of a plan whose chain holds variants given as ``variant=``: one query row per
        request through the chain's reference steps (cuinfer/variants/host.py); ``scales``: the k_scale / v_scale
        keywords (``reference_scales``)."""
        masks = None
        if plan.mask_bytes is not None:
            qo = np.arange(plan.batch + 1, dtype=np.int32)
            flat = reference.unpack_custom_mask(plan.mask_bytes, qo, np.concatenate([[0], np.cumsum(plan.kv_lens)]))
            ends = np.cumsum(plan.kv_lens)
            masks = [flat[e - n : e].reshape(1, n) for e, n in zip(ends, plan.kv_lens, strict=True)]
        steps = variant_host.steps(
            plan.variant, plan.options, num_qo_heads=plan.num_qo_heads, user_values=plan.variant_values,
            arrays=arrays, masks=masks,
        )  # fmt: skip
        table = reference.page_table(kv_cache, plan.kv_indptr, plan.kv_indices, plan.kv_last_page_len, self.kv_layout)
        o = np.zeros((plan.batch, plan.num_qo_heads, plan.head_dim))
        lse = np.full((plan.batch, plan.num_qo_heads), -np.inf)
        for b in range(plan.batch):
            k, v = table.request_kv(b)
            o[b : b + 1], lse[b : b + 1] = ref_variants.attend(
                q[b : b + 1], k, v, steps, batch=b, sm_scale=plan.options.sm_scale, **scales
            )  # fmt: skip
        return o, lse
