"""``BatchPrefill``: batch prefill / append attention on a ragged KV tensor or a paged cache, on the plan/run lifecycle
of ``cuinfer.runtime.wrapper``.

``plan()`` runs on the host once per batch: it validates the index arrays, picks the tiles (``prefill.policy``: the
smallest query tile >= the average packed query length, the KV tile with the best occupancy), sizes the persistent
grid from the kernel's real occupancy, balances (query tile x KV chunk) work items over it (``cuinfer.planner``) and
packs plan + index arrays into one pinned int32 buffer. ``run()`` validates the arrays against the plan and enqueues,
on the caller's current stream: the async copy of that buffer (once per plan and stream; every time in CUDA-graph
mode), the FA2-class kernel (``kernel_src/attention/prefill.cuh``), and the merge of split-KV partial states when the
plan split anything. ``run()`` never synchronises.

NumPy inputs to ``run()`` run the float64 CPU reference and return NumPy arrays in the output
dtypes the GPU would produce (o in ``o_dtype``, lse float32). Every bad input raises before any launch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cuinfer import reference
from cuinfer.formats.kv import KV
from cuinfer.formats.paged import check_cache_matches, check_pages_in_cache, paged_kv
from cuinfer.formats.ragged import ragged_kv
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor
from cuinfer.jit import get_kernel
from cuinfer.planner import assign as plan_assign
from cuinfer.planner import compact as plan_compact
from cuinfer.planner import layout as plan_layout
from cuinfer.planner.cost import DEFAULT_COST
from cuinfer.planner.split_kv import DEFAULT_MIN_CHUNK
from cuinfer.planner.work import WorkPlan, plan_checked, plan_work
from cuinfer.prefill import sm90
from cuinfer.prefill.launch import PrefillLaunch
from cuinfer.prefill.plan import PrefillPlan, host_plan, plan_of, positive
from cuinfer.prefill.policy import DeviceLimits, ctas_per_sm
from cuinfer.prefill.specs import prefill_spec
from cuinfer.prefill.tiles import block_smem_bytes
from cuinfer.reference import variants as ref_variants
from cuinfer.runtime.buffers import FixedLayout, check_fixed_values
from cuinfer.runtime.calls import Call
from cuinfer.runtime.fp8 import (
    as_kv_dtype,
    check_scale_args,
    check_scales,
    host_cache,
    match_cache_dtype,
    reference_scales,
)
from cuinfer.runtime.outputs import replan_hint
from cuinfer.runtime.wrapper import PlanRunWrapper, check_q_dtype
from cuinfer.variants import host as variant_host
from cuinfer.variants.select import check_user_values

DEFAULT_WORKSPACE_BYTES = 128 << 20
BACKENDS = ("auto", "fa2", "sm90")
_DEFAULT_SMS = 132


def _align4(x: int) -> int:
    return (x + 3) & ~3


class BatchPrefill(PlanRunWrapper):
    """Prefill / append attention for a batch of requests: ``plan()`` once per batch, ``run()`` per layer.

    ``paged=True``: ``run(q, kv_cache)`` over a paged cache (5-D array or ``(k_cache, v_cache)``, ``kv_layout`` NHD /
    HND); ``paged=False``: ``run(q, k, v)`` over ragged ``k``, ``v`` (``[nnz_kv, num_kv_heads, head_dim]`` NHD,
    ``[num_kv_heads, nnz_kv, head_dim]`` HND). ``backend``: "fa2" (the FA2-class kernel, any sm_80+ GPU), "sm90" (the
    Hopper wgmma / TMA kernel on an sm_90 GPU: 16-bit K/V, head_dim 128, softmax variants of logits, key ranges and
    masks; ``cuinfer.prefill.sm90`` lists its limits), "auto" (per plan: "sm90" where it runs the plan and its 128-row
    items are well filled, ``sm90.auto_picks``; otherwise "fa2"; the plan's choice is ``wrapper.plan_backend``; in
    CUDA-graph mode the first plan's choice holds for every later plan).
    ``use_cuda_graph``: every device pointer and the grid are fixed by the first ``plan()`` (capacities: twice its
    query tokens and page-table entries, ``max_batch_size`` requests), so a captured ``run()`` stays valid across
    later plans that fit; the tiles of the first plan are kept.
    """

    _NAME = "BatchPrefill"
    _PLAN_CALL = "plan(qo_indptr, kv_indptr, ...)"
    _RUN_ARRAY_NAMES = ("q", "k", "v", "out")
    _DEFAULT_WORKSPACE_BYTES = DEFAULT_WORKSPACE_BYTES
    _plan: PrefillPlan | None
    _launch_state: PrefillLaunch | None

    def __init__(
        self, *, paged: bool = True, kv_layout: str = "NHD", backend: str = "auto", use_cuda_graph: bool = False,
        max_batch_size: int | None = None, workspace_bytes: int | None = None, device: int | None = None,
    ) -> None:  # fmt: skip
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)} but is {backend!r}")
        self.paged = bool(paged)
        super().__init__(
            kv_layout=kv_layout, use_cuda_graph=use_cuda_graph, max_batch_size=max_batch_size,
            workspace_bytes=workspace_bytes, device=device,
        )  # fmt: skip
        self.backend = backend
        self._ctas: dict = {}
        self._fixed: FixedLayout | None = None  # graph mode: the layout, tiles and capacities of the first plan
        self._limits_memo: tuple | None = None
        self._ctas_memo: tuple | None = None
        # (_pack_memo: id(host buffer) -> (buffer, layout, planner.pack memo, [views of the index arrays]))

    # -- planning --------------------------------------------------------------------------------------------------

    def _host_plan(self, *args: Any, **kwargs: Any) -> PrefillPlan:
        graph = self.use_cuda_graph
        return host_plan(
            self.paged, *args, **kwargs, max_batch_size=self.max_batch_size if graph else None,
            fixed_config=None if self._fixed is None else self._fixed.config, memo=self._static,
        )  # fmt: skip

    def _num_ctas(self, plan: PrefillPlan, num_sms: int | None, device_id: int | None) -> int:
        # The last answer, compared by identity (building the kernel key costs microseconds): same memoised
        # arguments, tiles, mask presence, SM count and device.
        if num_sms is not None and type(num_sms) is not int:
            positive("num_sms", num_sms)  # (before the memos, where 4.0 == 4)
        memo = self._ctas_memo
        has_mask = plan.mask_bytes is not None
        if (
            memo is not None and plan.static is not None and memo[0] is plan.static and memo[1] is plan.config
            and memo[2] == (has_mask, num_sms, device_id, plan.backend)
        ):  # fmt: skip
            return memo[3]
        n = self._count_ctas(plan, num_sms, device_id)
        self._ctas_memo = (plan.static, plan.config, (has_mask, num_sms, device_id, plan.backend), n)
        return n

    def _count_ctas(self, plan: PrefillPlan, num_sms: int | None, device_id: int | None) -> int:
        if plan.backend == "sm90":  # one persistent CTA per SM
            if num_sms is not None:
                return positive("num_sms", num_sms)
            if device_id is None:
                return _DEFAULT_SMS
            from cuinfer.runtime.device import device_info

            return device_info(device_id).sm_count
        key = (plan.key(self.paged), num_sms, device_id)
        n = self._ctas.get(key)
        if n is None:
            cfg = plan.config
            if device_id is None:
                per_sm = max(1, ctas_per_sm(cfg, plan.head_dim, plan.head_dim_vo, self.paged, DeviceLimits()))
                per_sm = max(cfg.groups, per_sm // cfg.groups * cfg.groups)  # whole blocks
                sms = _DEFAULT_SMS
            else:
                from cuinfer.runtime.device import device_info

                k = plan.key(self.paged)
                kernel = get_kernel(prefill_spec(k), k.name_expr(), device_id)
                smem = block_smem_bytes(cfg, plan.head_dim, plan.head_dim_vo, self.paged, variant=plan.variant)
                # (a paired block holds cfg.groups CTAs of the plan)
                per_sm = max(1, kernel.max_active_blocks(cfg.block_threads, smem)) * cfg.groups
                sms = device_info(device_id).sm_count
            n = self._ctas[key] = per_sm * (sms if num_sms is None else positive("num_sms", num_sms))
        return n

    def _work(self, plan: PrefillPlan, num_ctas: int, fixed_split_size: int | None) -> WorkPlan:
        if fixed_split_size is not None:
            fixed_split_size = positive("fixed_split_size", fixed_split_size)
        cfg = plan.config
        tile = cfg.tile_kv
        granule = math.gcd(fixed_split_size, tile) if fixed_split_size is not None else tile
        opts = plan.options
        qo_lens = plan.qo_lens
        chain = plan.variant
        no_split = not chain.prefill_splits  # (softmax=False, output transforms: cuinfer/variants/render.py)
        if no_split and fixed_split_size is not None:
            raise ValueError(
                f"fixed_split_size={fixed_split_size}: the variants of this plan ({chain.name}) are never split in "
                "prefill (without softmax, or with an output transform, split pieces do not merge by the softmax "
                "merge); leave fixed_split_size out"
            )
        if plan.backend == "sm90":
            return self._work_sm90(plan, num_ctas, fixed_split_size, no_split)
        if qo_lens is None:
            work = plan_work(
                np.diff(plan.qo_indptr), plan.kv_lens, num_kv_heads=plan.num_kv_heads,
                group_size=plan.num_qo_heads // plan.num_kv_heads, tile_rows=cfg.tile_q, num_ctas=num_ctas,
                kv_granule=granule, causal=opts.causal, window_left=opts.window_left,
                fixed_split_size=fixed_split_size, disable_split=no_split, pool_share=plan_assign.POOL_SHARE,
            )  # fmt: skip
        else:
            # host_plan checked the lengths (1-D, non-negative) and gave their ranges; the rest are positive ints and
            # fixed_split_size is a multiple of the granule (their gcd): plan_work's checks would only repeat that.
            (qo_lo, qo_hi), (kv_lo, kv_hi) = plan.qo_range, plan.kv_range
            work = plan_checked(
                qo_lens, plan.kv_lens, plan.num_kv_heads, plan.num_qo_heads // plan.num_kv_heads, cfg.tile_q,
                num_ctas, granule, opts.causal, opts.window_left, fixed_split_size, no_split, DEFAULT_COST,
                DEFAULT_MIN_CHUNK, kv_lo, kv_hi, qo_lo, qo_hi, plan_assign.POOL_SHARE,
            )  # fmt: skip
        if chain.has_sink and work.n_merge:
            # The sink is folded once per row: by the row's first piece of a split tile, which the kernel finds by
            # its merge unit (item_merge, planner/units.py), into that piece's partial state.
            work.merge_in_kernel = True
        return work

    @staticmethod
    def _work_sm90(plan: PrefillPlan, num_ctas: int, fixed_split_size: int | None, no_split: bool) -> WorkPlan:
        """The Hopper kernel's work: items of 128 query rows of one query head (the planner sees num_qo_heads KV heads
        of group 1), KV granules of 128 keys (cuinfer/prefill/sm90.py)."""
        if fixed_split_size is not None and fixed_split_size % sm90.TILE_KV:
            raise ValueError(
                f"fixed_split_size={fixed_split_size}: backend='sm90' splits KV in multiples of its {sm90.TILE_KV}-key "
                f"tiles; pass a multiple of {sm90.TILE_KV}"
            )
        opts = plan.options
        return plan_work(
            np.diff(plan.qo_indptr), plan.kv_lens, num_kv_heads=plan.num_qo_heads, group_size=1,
            tile_rows=sm90.TILE_Q, num_ctas=num_ctas, kv_granule=sm90.TILE_KV, causal=opts.causal,
            window_left=opts.window_left, fixed_split_size=fixed_split_size, disable_split=no_split,
            pool_share=sm90.POOL_SHARE, always_sort=sm90.SORTED_DEAL,
        )  # fmt: skip

    def _limits(self, device_id: int | None) -> DeviceLimits:
        memo = self._limits_memo
        if memo is None or memo[0] != device_id:
            memo = self._limits_memo = (device_id, self._device_limits(device_id))
        return memo[1]

    @staticmethod
    def _device_limits(device_id: int | None) -> DeviceLimits:
        if device_id is None:
            return DeviceLimits()
        from cuinfer.runtime.device import device_info

        info = device_info(device_id)
        return DeviceLimits(
            smem_per_sm=info.smem_per_sm, smem_per_block_optin=info.smem_per_block_optin,
            regs_per_sm=info.regs_per_sm, max_threads_per_sm=info.max_threads_per_sm,
        )  # fmt: skip

    def workspace_size(self, qo_indptr: Any, kv_indptr: Any, kv_indices: Any = None, kv_last_page_len: Any = None,
                       **kwargs: Any) -> int:  # fmt: skip
        """Exact workspace bytes ``plan()`` with the same arguments needs for its split-KV partial states."""
        num_sms, fixed = kwargs.pop("num_sms", None), kwargs.pop("fixed_split_size", None)
        device_id = self._device_or_none()
        kw = self._plan_kwargs(kwargs)
        kw.pop("variant_params")  # (no effect on the workspace)
        plan = self._host_plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, **kw,
                               limits=self._limits(device_id))  # fmt: skip
        self._choose_backend(plan, device_id, fixed)
        plan.work = self._work(plan, self._num_ctas(plan, num_sms, device_id), fixed)
        return self._workspace_need(plan)

    @staticmethod
    def _plan_kwargs(kw: dict) -> dict:
        defaults = dict(
            page_size=1, causal=False, custom_mask=None, packed_custom_mask=None, head_dim_vo=None, kv_dtype=None,
            o_dtype=None, sm_scale=None, logits_soft_cap=0.0, window_left=-1, pos_encoding="none", rope_scale=1.0,
            rope_theta=1e4, variant=None, variant_params=None, tile_sizes=None,
        )  # fmt: skip
        for req in ("num_qo_heads", "num_kv_heads", "head_dim", "q_dtype"):
            if req not in kw:
                raise TypeError(f"plan() missing required keyword argument {req!r}")
        unknown = set(kw) - set(defaults) - {"num_qo_heads", "num_kv_heads", "head_dim", "q_dtype"}
        if unknown:
            raise TypeError(f"plan() got unexpected keyword arguments {sorted(unknown)}")
        return {**defaults, **kw}

    def plan(
        self, qo_indptr: Any, kv_indptr: Any, kv_indices: Any = None, kv_last_page_len: Any = None, *,
        num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int = 1, causal: bool = False,
        custom_mask: Any = None, packed_custom_mask: Any = None, head_dim_vo: int | None = None, q_dtype: Any,
        kv_dtype: Any = None, o_dtype: Any = None, sm_scale: float | None = None, logits_soft_cap: float = 0.0,
        window_left: int = -1, pos_encoding: str = "none", rope_scale: float = 1.0, rope_theta: float = 1e4,
        variant: Any = None, variant_params: dict | None = None, num_sms: int | None = None,
        fixed_split_size: int | None = None, tile_sizes: tuple[int, ...] | None = None,
    ) -> None:  # fmt: skip
        """Plan one batch. Index arrays may be lists, NumPy arrays, host tensors or device arrays (one device-to-host
        copy). ``variant``: a ``cuinfer.Variant``, a registered name or a sequence of them, applied after the built-in
        options; ``variant_params``: their parameters, ``{variant name: {param: value}}``.
        ``tile_sizes=(query_tile, kv_tile[, stages[, groups]])`` overrides the tile policy (tests, tuning; groups 2
        pairs two CTAs per block).
        Raises before anything reaches the GPU when the inputs or the workspace do not fit."""
        device_id = self._device_id if self._device_id is not False else self._device_or_none()
        memo = self._limits_memo  # (_limits, inlined)
        limits = memo[1] if memo is not None and memo[0] == device_id else self._limits(device_id)
        # host_plan's arguments in one tuple, in its order (STATIC_ARGS, see plan_of)
        static = (
            self.paged, num_qo_heads, num_kv_heads, head_dim, page_size, causal, head_dim_vo, q_dtype, kv_dtype,
            o_dtype, sm_scale, logits_soft_cap, window_left, pos_encoding, rope_scale, rope_theta, variant, tile_sizes,
            limits,
        )  # fmt: skip
        plan = plan_of(
            static, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, custom_mask, packed_custom_mask,
            self.max_batch_size if self.use_cuda_graph else None, None if self._fixed is None else self._fixed.config,
            self._static,
        )  # fmt: skip
        plan.variant_values = check_user_values(plan.variant, variant_params)
        self._choose_backend(plan, device_id, fixed_split_size)
        plan.work = self._work(plan, self._num_ctas(plan, num_sms, device_id), fixed_split_size)
        # (prefill has only ever checked the workspace of plans it packs for a GPU)
        self._commit(plan, device_id, fit_on_host=False)

    def _choose_backend(self, plan: PrefillPlan, device_id: int | None, fixed_split_size: Any) -> None:
        """Set ``plan.backend``: the wrapper's backend, "auto" resolved for this plan on this device
        (``sm90.auto_picks``; a ``fixed_split_size`` that is not a multiple of the Hopper kernel's KV tile keeps the
        FA2-class kernel); an explicit "sm90" checks that it runs the plan."""
        if self.backend == "auto":
            if self._fixed is not None:  # CUDA-graph mode: the captured kernel is the first plan's
                plan.backend = self._fixed.backend
                return
            if isinstance(fixed_split_size, int) and fixed_split_size % sm90.TILE_KV:
                plan.backend = "fa2"
                return
            arch = None
            if device_id is not None:
                from cuinfer.runtime.device import device_info

                arch = device_info(device_id).arch
            picks = sm90.auto_picks(plan, arch)
            plan.backend = "sm90" if picks else "fa2"
            return
        plan.backend = self.backend
        if self.backend == "sm90":
            why = sm90.unsupported(plan)
            if why is not None:
                raise ValueError(f"backend='sm90' does not run {why}; use backend='fa2' or 'auto'")
            sm90.check_device(device_id)

    @property
    def plan_backend(self) -> str | None:
        """The kernel the current plan runs on: "fa2" or "sm90" (None before ``plan()``)."""
        return None if self._plan is None else self._plan.backend

    def _words_layout(self, plan: PrefillPlan, holder: Any = None) -> tuple:
        """``(plan layout, word offsets of the plan arrays and the index arrays, words in use)``. CUDA-graph mode fixes
        the layout and capacities at the first plan (kept on the wrapper, ``_fixed``, whatever ``holder``);
        otherwise they follow each plan."""
        work = plan.work
        n_pages = plan.n_pages
        n_mask = 0 if plan.mask_bytes is None else plan.mask_bytes.shape[0]
        if self.use_cuda_graph:
            # (the kernel, plan.backend, cannot change: explicit per wrapper, and "auto" keeps _fixed.backend)
            heads = (plan.num_qo_heads, plan.num_kv_heads, plan.key(self.paged))
            if self._fixed is None:
                qo_cap = 2 * max(plan.nnz_qo, self.max_batch_size)
                if plan.backend == "sm90":  # (items of one query head: the planner's heads of group 1)
                    heads_g_rows = (plan.num_qo_heads, 1, sm90.TILE_Q)
                else:
                    heads_g_rows = (plan.num_kv_heads, plan.num_qo_heads // plan.num_kv_heads, plan.config.tile_q)
                cap = plan_layout.capacity_bound(
                    self.max_batch_size, qo_cap, *heads_g_rows, work.num_ctas, disable_split=False
                )  # fmt: skip
                lay = plan_layout.PlanLayout.for_capacity(cap.max_items, cap.max_ctas, cap.max_merge, cap.max_merge_src)
                self._fixed = FixedLayout(
                    lay, heads, 2 * max(n_pages, 1), 2 * max(n_mask, 4), plan.config, backend=plan.backend,
                    values=(plan.options, plan.variant_values),
                )  # fmt: skip
            fixed = self._fixed
            lay, fixed_heads, page_cap, mask_cap = fixed.layout, fixed.signature, fixed.page_cap, fixed.mask_cap
            if heads != fixed_heads:
                raise ValueError(
                    "with use_cuda_graph=True every plan() must keep the heads, dtypes and options of the first (the "
                    f"captured kernel is fixed): first {fixed_heads[:2]} {fixed_heads[2].short_name()}, now "
                    f"{heads[:2]} {heads[2].short_name()}"
                )
            check_fixed_values(fixed, plan.options, plan.variant_values)
            if n_pages > page_cap or n_mask > mask_cap:
                raise ValueError(
                    f"the plan reads {n_pages} page indices and {n_mask} mask bytes but the CUDA-graph buffers hold "
                    f"{page_cap} and {mask_cap} (twice the first plan's); plan the largest batch first or build a new "
                    "wrapper"
                )
            b_cap = self.max_batch_size
        else:
            lay = plan_layout.PlanLayout.for_plan(work)
            page_cap, mask_cap, b_cap = n_pages, n_mask, plan.batch
        # The index arrays follow the plan arrays.
        key = (id(lay), b_cap, page_cap, mask_cap)  # (the layout is kept in the value: its id stays unique)
        hit = self._offsets.get(key)
        if hit is None or hit[0] is not lay:
            off = dict(lay.offsets)
            pos = lay.total_words
            for name, size in (("qo_indptr", b_cap + 1), ("kv_indptr", b_cap + 1), ("kv_last_page_len", b_cap),
                               ("mask_indptr", b_cap + 1), ("kv_indices", max(page_cap, 1)),
                               ("mask", max(-(-mask_cap // 4), 1))):  # fmt: skip
                off[name] = pos
                pos = _align4(pos + size)
            if len(self._offsets) >= 64:
                self._offsets.clear()
            hit = self._offsets[key] = (lay, off, pos)
        return hit

    def _index_views(self, host: np.ndarray, off: dict, batch: int) -> tuple:
        """``host``'s slices for qo_indptr, kv_indptr and kv_last_page_len."""
        o_q, o_k, o_l = off["qo_indptr"], off["kv_indptr"], off["kv_last_page_len"]
        return host[o_q : o_q + batch + 1], host[o_k : o_k + batch + 1], host[o_l : o_l + batch]

    def _fill_words(self, plan: PrefillPlan, host: np.ndarray, lay, off: dict, generation: int) -> None:
        """Pack the work plan and the index arrays (and the packed mask) into ``host`` at the word offsets ``off``."""
        memo = self._pack_memo.get(id(host))  # see planner.pack: per host buffer and layout
        if memo is None or memo[0] is not host or memo[1] is not lay:
            if len(self._pack_memo) >= 8:
                self._pack_memo.clear()
            memo = self._pack_memo[id(host)] = (host, lay, {}, [None])
        # Natural-order plans with nothing split (most prefill plans) go in the compact form: G group entries per item
        # array instead of G x H items, the kernel deriving the rest (not with CUDA graphs: the captured kernel
        # arguments, G among them, are those of the first plan).
        g = 0 if self.use_cuda_graph else plan_compact.compact_groups(plan.work)
        if g:
            memo[2].clear()  # (the memo describes what pack wrote into host; the compact words are not that)
            plan_compact.pack_compact(plan.work, lay, host, generation=generation, groups=g)
        else:
            plan_layout.pack(plan.work, lay, host, generation=generation, memo=memo[2])
        plan.compact_groups = g
        batch, n_pages = plan.batch, plan.n_pages
        # The views of the per-request arrays in host, kept while the offsets and the batch size stay (a serving loop's
        # batch); the page table, whose length changes with nearly every new batch, is written through a slice.
        views = memo[3][0]
        if views is None or views[0] is not off or views[1] != batch:
            views = memo[3][0] = (off, batch, *self._index_views(host, off, batch))
        views[2][...] = plan.qo_indptr
        views[3][...] = plan.kv_indptr
        if self.paged:
            views[4][...] = plan.kv_last_page_len
            indices, o_i = plan.kv_indices, off["kv_indices"]
            host[o_i : o_i + n_pages] = indices if indices.shape[0] == n_pages else indices[:n_pages]
        if plan.mask_bytes is not None:
            n_mask = plan.mask_bytes.shape[0]
            host[off["mask_indptr"] : off["mask_indptr"] + batch + 1] = plan.mask_indptr
            words = np.zeros(-(-n_mask // 4) * 4, dtype=np.uint8)
            words[:n_mask] = plan.mask_bytes
            host[off["mask"] : off["mask"] + words.shape[0] // 4] = words.view(np.int32)

    # -- running ---------------------------------------------------------------------------------------------------

    def run(
        self, q: Any, *kv: Any, out: Any = None, lse: Any = None, return_lse: bool = False,
        k_scale: float | None = None, v_scale: float | None = None, variant_arrays: dict | None = None,
    ) -> Any:  # fmt: skip
        """``run(q, kv_cache)`` (paged) or ``run(q, k, v)`` (ragged) -> ``o [nnz_qo, num_qo_heads, head_dim_vo]``
        (or ``(o, lse)``, lse base 2 ``[nnz_qo, num_qo_heads]`` float32). ``variant_arrays``: the array parameters
        of the plan's variants, ``{param: array}`` (e.g. ``{"sinks": s}``, float32 ``[num_qo_heads]``).

        fp8 caches: ``k_scale`` / ``v_scale`` dequantise them (numbers, or float32 arrays of 1 or ``num_kv_heads``
        values on the GPU: cuinfer.runtime.fp8); ``uint8`` arrays (CuPy's fp8) are read as the plan's ``kv_dtype``.
        A 16-bit cache takes no scales (1.0 is let by): rescale its logits with plan(sm_scale=...)."""
        if self._plan is not None:  # (without a plan, _run says so first)
            want = 1 if self.paged else 2
            if len(kv) != want:
                usage = "run(q, kv_cache)" if self.paged else "run(q, k, v)"
                raise TypeError(f"a BatchPrefill(paged={self.paged}) runs as {usage} but got {1 + len(kv)} arrays")
            if k_scale is not None or v_scale is not None:
                check_scale_args(self._plan.kv_dtype, k_scale, v_scale)
        return self._run(q, kv, out, lse, return_lse or lse is not None, k_scale, v_scale, variant_arrays)

    def _check_q(self, plan: PrefillPlan, tq: Tensor) -> None:
        validate.check_ndim("q", tq, 3, hint="q is [nnz_qo, num_qo_heads, head_dim] (ragged: rows of qo_indptr)")
        if tq.shape[0] != plan.nnz_qo:
            raise ValueError(
                f"q has {tq.shape[0]} rows but qo_indptr[-1] = {plan.nnz_qo}; q holds the query tokens of every "
                "request, request b in rows qo_indptr[b]:qo_indptr[b+1]"
            )
        validate.check_shape(
            "q", tq, (plan.nnz_qo, plan.num_qo_heads, plan.head_dim),
            hint=f"plan() was made for num_qo_heads={plan.num_qo_heads}, head_dim={plan.head_dim}",
        )  # fmt: skip
        check_q_dtype(plan, tq)

    def _kv_view(self, call: Call, plan: PrefillPlan, kv: tuple) -> KV:
        if self.paged:
            return self._kv_views.view(kv[0], call, plan, self._paged_kv)
        tk = as_kv_dtype(call.tensor(kv[0], "k"), plan.kv_dtype, "k")
        tv = as_kv_dtype(call.tensor(kv[1], "v"), plan.kv_dtype, "v")
        c = ragged_kv(tk, tv, self.kv_layout, plan)
        self._check_kv_dtype(plan, c)
        return c

    def _paged_kv(self, call: Call, plan: PrefillPlan, cache: Any) -> KV:
        c = match_cache_dtype(paged_kv(call.tensor, cache, self.kv_layout), plan.kv_dtype)
        check_cache_matches(c, plan, self.kv_layout)
        if plan.head_dim_vo != plan.head_dim:
            raise ValueError(
                f"plan() was made for head_dim={plan.head_dim}, head_dim_vo={plan.head_dim_vo} but a paged cache "
                "holds K and V of one head dim; use BatchPrefill(paged=False) with separate k and v"
            )
        if c.k_strides != c.v_strides:
            raise ValueError(
                f"k_cache and v_cache must have the same strides (the kernel finds a page's K and V rows with one "
                f"offset) but have {c.k_strides} and {c.v_strides} (page, slot, head; elements); pass contiguous "
                "caches"
            )
        check_pages_in_cache(plan.max_page, c)
        self._check_kv_dtype(plan, c)
        return c

    @staticmethod
    def _check_kv_dtype(plan: PrefillPlan, c: KV) -> None:
        if c.k.dtype is not plan.kv_dtype:
            got = c.k.dtype
            # (plan() takes k/v of q's 16-bit type or fp8: re-plan with kv_dtype, or for other 16-bit k/v with q_dtype)
            fp8 = got.is_float8 or plan.kv_dtype.is_float8
            replan = f" or call plan() with kv_dtype='{got.value}'" if got.is_float8 or got is plan.q_dtype else ""
            raise ValueError(
                f"k/v have dtype {got.value} but plan() was made for kv_dtype={plan.kv_dtype.value} (the prefill "
                f"kernel takes q, k and v of one 16-bit type{', or fp8 k and v' if fp8 else ''}); cast them with "
                f"{validate.cast_fix('k', c.k.framework, plan.kv_dtype)}"
                f"{replan if fp8 else replan_hint('q_dtype', got)}"
            )

    def _launch(
        self, call: Call, plan: PrefillPlan, tq: Tensor, kv: KV, to: Tensor, tl: Tensor | None, k_scale: Any,
        v_scale: Any,
    ) -> None:  # fmt: skip
        # Everything fixed by the plan is prepared once per plan (prefill/launch.py); the parameter struct is rebuilt
        # only when an array pointer or stride changes.
        st = self._launch_state
        buf = self._buffers
        if st is None or not st.current(buf, plan, call.device_id):
            # (a graph-mode merge launch is sized for the fixed layout's capacity: it covers every later plan)
            max_merge = self._fixed.layout.capacity.max_merge if self.use_cuda_graph else plan.work.n_merge
            kind = sm90.Sm90Launch if plan.backend == "sm90" else PrefillLaunch
            st = self._launch_state = kind(buf, plan, call.device_id, self.paged, max_merge)
        scales = check_scales(plan.kv_dtype, k_scale, v_scale, num_kv_heads=plan.num_kv_heads, call=call, gpu=True)
        st.launch(call.stream, tq, kv, to, tl, scales, call.variant_arrays if st.array_slots else None)

    def _reference(
        self, plan: PrefillPlan, tq: Tensor, kv: tuple, kvt: KV, k_scale: Any, v_scale: Any, arrays: dict
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        kv = host_cache(tuple(kv), plan.kv_dtype)  # (uint8 arrays read as the plan's fp8 format)
        scales = reference_scales(
            check_scales(plan.kv_dtype, k_scale, v_scale, num_kv_heads=plan.num_kv_heads, gpu=False)
        )
        if variant_host.needs_steps(plan.variant):
            return self._reference_steps(plan, tq.numpy(), kv, kvt, arrays, scales)
        opts = plan.options
        kw = dict(causal=opts.causal, **opts.reference_kwargs(), **scales)
        mask = None
        if plan.mask_bytes is not None:
            kv_tok = np.concatenate([[0], np.cumsum(plan.kv_lens)])
            mask = reference.unpack_custom_mask(plan.mask_bytes, plan.qo_indptr, kv_tok)
        if self.paged:
            return reference.batch_prefill_paged(
                tq.numpy(), kv[0], plan.qo_indptr, plan.kv_indptr, plan.kv_indices, plan.kv_last_page_len,
                kv_layout=self.kv_layout, custom_mask=mask, **kw,
            )  # fmt: skip
        k, v = self._ragged_kv(kvt)
        qo, kvi = plan.qo_indptr, plan.kv_indptr
        return reference.batch_attention_ragged(tq.numpy(), k, v, qo, kvi, custom_mask=mask, **kw)

    def _ragged_kv(self, kvt: KV) -> tuple[np.ndarray, np.ndarray]:
        """The ragged K and V as NumPy arrays in NHD order (shapes were checked by the shared validation)."""
        k, v = kvt.k.numpy(), kvt.v.numpy()
        if self.kv_layout == "HND":
            k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
        return k, v

    def _reference_steps(
        self, plan: PrefillPlan, q: np.ndarray, kv: tuple, kvt: KV, arrays: dict, scales: dict
    ) -> tuple:  # fmt: skip
        """The float64 reference of a plan whose chain holds variants given as ``variant=``: each request through the
        chain's reference steps (cuinfer/variants/host.py); ``scales``: the k_scale / v_scale keywords
        (``reference_scales``)."""
        qo = plan.qo_indptr
        masks = None
        if plan.mask_bytes is not None:
            kv_tok = np.concatenate([[0], np.cumsum(plan.kv_lens)])
            flat = reference.unpack_custom_mask(plan.mask_bytes, qo, kv_tok)
            sizes = np.diff(qo) * plan.kv_lens
            ends = np.cumsum(sizes)
            masks = [flat[e - n : e].reshape(-1, kl) if kl else np.zeros((ql, 0), bool)
                     for e, n, ql, kl in zip(ends, sizes, np.diff(qo), plan.kv_lens, strict=True)]  # fmt: skip
        steps = variant_host.steps(
            plan.variant, plan.options, num_qo_heads=plan.num_qo_heads, user_values=plan.variant_values,
            arrays=arrays, masks=masks,
        )  # fmt: skip
        if self.paged:
            table = reference.page_table(kv[0], plan.kv_indptr, plan.kv_indices, plan.kv_last_page_len, self.kv_layout)
            kv_of = table.request_kv
        else:
            k, v = self._ragged_kv(kvt)
            ind = plan.kv_indptr

            def kv_of(b: int) -> tuple:
                return k[ind[b] : ind[b + 1]], v[ind[b] : ind[b + 1]]

        o = np.zeros((q.shape[0], plan.num_qo_heads, plan.head_dim_vo))
        lse = np.full((q.shape[0], plan.num_qo_heads), -np.inf)
        for b in range(plan.batch):
            kb, vb = kv_of(b)
            rows = slice(qo[b], qo[b + 1])
            o[rows], lse[rows] = ref_variants.attend(
                q[rows], kb, vb, steps, batch=b, sm_scale=plan.options.sm_scale, **scales
            )  # fmt: skip
        return o, lse
