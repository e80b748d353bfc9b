"""Lab hooks into the runtime that patch nothing: A/B kernel specs, trace buffers, wrappers that take a kernel spec, a
kernel configuration, a work plan or a parameter of their own, and list schedules of work items.

A lab wrapper (``LabDecode``, ``LabPrefill``) is a ``BatchDecode`` / ``BatchPrefill`` whose experiment is given to its
constructor; every other wrapper in the process runs the shipped code. They override private hooks of the wrappers
(``_route``, ``_work``, ``_count_ctas``, ``_launch``): when the runtime changes those, the CPU tests in ``tests/lab``
fail here first. Lab wrappers are for timing and tracing on the GPU machine: no CUDA-graph mode.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from cuinfer.planner.workplan import WorkPlan

from cuinfer.decode import BatchDecode
from cuinfer.decode.launch import DecodeLaunch
from cuinfer.decode.specs import decode_spec
from cuinfer.jit import KernelSpec, get_kernel
from cuinfer.prefill import BatchPrefill
from cuinfer.prefill.launch import PrefillLaunch

# ``work(plan, num_ctas, default) -> WorkPlan``: a lab wrapper's work plan for the host plan ``plan`` on ``num_ctas``
# CTAs; ``default()`` is the plan the wrapper would have made.
WorkFn = Callable[[Any, int, Callable[[], WorkPlan]], WorkPlan]

ITEM_ARRAYS = ("item_req", "item_qo_tile", "item_kv_head", "item_kv_start", "item_kv_end", "item_partial")
MERGE_ARRAYS = ("merge_indptr", "merge_src", "merge_dst_token", "merge_dst_head")


def ab_spec(spec: KernelSpec, defines: Sequence[str], tag: str = "ab") -> KernelSpec:
    """``spec`` built with extra ``-D`` options (an A/B or trace build), under a name of its own (``lab-<tag>/...``)
    so that reports and the kernel cache keep it apart from the shipped build. No defines: ``spec`` itself."""
    defines = tuple(defines)
    bad = [d for d in defines if not d.startswith("-D")]
    if bad:
        raise ValueError(f"A/B options must be -D defines (-DNAME or -DNAME=value) but got {bad}")
    if not defines:
        return spec
    return dataclasses.replace(spec, name=f"lab-{tag}/{spec.name}", extra_options=(*spec.extra_options, *defines))


_SASS_CHECKED: dict[tuple[str, str], list[str]] = {}


def miscompiled_reads(spec: KernelSpec, arch: str) -> list[str]:
    """The instructions of ``spec``'s kernels on ``arch`` whose address or descriptor reads a uniform register that
    nothing writes (``cuinfer.jit.sass.unwritten_uniform_reads``: the ptxas miscompile that the H200 runs as an illegal
    instruction, which ends the process's CUDA context and every row a lab call would print after it). Empty where
    cuobjdump is missing. Registered specs are checked by tests/compile; lab builds and configurations are not."""
    from cuinfer.jit import get_compiled
    from cuinfer.jit.sass import disassemble_instructions, find_cuobjdump, unwritten_uniform_reads

    memo = (spec.name, arch)
    if memo not in _SASS_CHECKED:
        bad: list[str] = []
        if find_cuobjdump() is not None:
            for insns in disassemble_instructions(get_compiled(spec, arch).cubin).values():
                bad += unwritten_uniform_reads(insns)
        _SASS_CHECKED[memo] = bad
    return _SASS_CHECKED[memo]


def lab_kernel(spec: KernelSpec, name_expr: str, device_id: int) -> Any:
    """``get_kernel`` for a lab launch, refused (RuntimeError naming the spec and the first such instruction) when
    ``miscompiled_reads`` finds the miscompile in it."""
    from cuinfer.runtime.device import device_info

    bad = miscompiled_reads(spec, device_info(device_id).arch)
    if bad:
        raise RuntimeError(
            f"{spec.name}: not launched, its SASS reads unwritten uniform registers ({len(bad)}: {bad[0]})"
        )
    return get_kernel(spec, name_expr, device_id)


@dataclasses.dataclass(frozen=True)
class TraceBuffer:
    """Stands in for the lse output of a trace build: the kernels stamp where ``p.lse`` points (kernel_src/debug/
    trace.cuh). ``strides`` are the lse strides (rows, heads) the kernel gets: a prefill kernel still writes the lse of
    its unsplit rows there (see ``prefill_trace``)."""

    ptr: int
    strides: tuple[int, int] = (0, 0)


def prefill_trace(base_ptr: int, guard_floats: int, heads: int) -> TraceBuffer:
    """The trace buffer of a prefill trace build over a device buffer at ``base_ptr``: its first ``guard_floats``
    float32 words (at least tokens x query heads, even) take the lse the kernel writes (row r, head h at -(r * heads
    + h) from the stamps), the stamps start after them. Only (row 0, head 0) lands on a stamp: the low half of item 0's
    start time, which ``tune_sched trace`` leaves out."""
    if guard_floats % 2:
        raise ValueError(f"guard_floats must be even (the stamps are 8-byte words) but is {guard_floats}")
    return TraceBuffer(base_ptr + 4 * guard_floats, (-heads, -1))


def _lse_or_trace(tl: Any, trace: TraceBuffer | None) -> Any:
    """What a lab launch hands the kernel as lse: the trace buffer of a trace run (which runs without lse), else
    ``tl``."""
    if trace is None:
        return tl
    if tl is not None:
        raise ValueError("a trace run stamps where lse points: call run() without lse")
    return trace


class LabDecode(BatchDecode):
    """``BatchDecode`` with its experiment given here: ``spec_of(key) -> KernelSpec`` (an A/B or trace build of the
    kernel of ``key``), ``config`` (a ``DecodeConfig`` in place of the policy's: tiles, stages, CTAs per SM),
    ``work`` (a ``WorkFn``), ``evict_first`` (force the K/V copies' L2 policy) and ``trace`` (a ``TraceBuffer`` handed
    to the kernel as its lse; run() without lse then)."""

    def __init__(self, *, spec_of: Callable[[Any], KernelSpec] | None = None, config: Any = None,
                 work: WorkFn | None = None, evict_first: bool | None = None, trace: TraceBuffer | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        if kwargs.get("use_cuda_graph"):
            raise ValueError("lab wrappers do not run in CUDA-graph mode")
        super().__init__(**kwargs)
        self.lab_spec_of, self.lab_config, self.lab_work = spec_of, config, work
        self.lab_evict_first, self.lab_trace = evict_first, trace

    def _route(self, plan: Any, num_sms: int | None, device_id: int | None) -> tuple:
        if self.lab_config is not None:
            plan.config = self.lab_config  # (the plan's own copy of the static fields)
        return super()._route(plan, num_sms, device_id)

    def _work(self, plan: Any, route: tuple, fixed_split_size: int | None) -> WorkPlan:
        if self.lab_work is None:
            return super()._work(plan, route, fixed_split_size)
        work = self.lab_work(plan, route[0], lambda: super(LabDecode, self)._work(plan, route, fixed_split_size))
        work.merge_in_kernel = True  # (the decode kernels merge split requests themselves)
        return work

    def _launch(self, call: Any, plan: Any, tq: Any, kv: Any, to: Any, tl: Any, k_scale: Any, v_scale: Any) -> None:
        tl = _lse_or_trace(tl, self.lab_trace)
        st = self._launch_state
        want_lse = tl is not None and self.lab_trace is None
        if st is None or st.plan is not plan or st.device_id != call.device_id or st.want_lse != want_lse:
            key = plan.key(want_lse)
            spec = decode_spec(key) if self.lab_spec_of is None else self.lab_spec_of(key)
            kernel = lab_kernel(spec, key.name_expr(), call.device_id)  # (refused before DecodeLaunch loads one)
            st = self._launch_state = DecodeLaunch(self._buffers, plan, want_lse, call.device_id)
            if self.lab_spec_of is not None:
                st.kernel = kernel
            if self.lab_evict_first is not None:
                st.static["kv_evict_first"] = int(self.lab_evict_first)
        st.repack(tq, kv, to, tl, self._scales(call, plan, k_scale, v_scale))  # (every call: lab runs skip the memo)
        st.kernel.launch(st.num_ctas, st.threads, (st.params, st.vparams), smem_bytes=st.smem_bytes, stream=call.stream)


class LabPrefill(BatchPrefill):
    """``BatchPrefill`` with its experiment given here: ``spec_of(key) -> KernelSpec`` (an A/B or trace build; the
    grid is sized by its occupancy), ``work`` (a ``WorkFn``) and ``trace`` (a ``TraceBuffer`` handed to the kernel
    as its lse; run() without lse then, and split rows are not merged)."""

    def __init__(self, *, spec_of: Callable[[Any], KernelSpec] | None = None, work: WorkFn | None = None,
                 trace: TraceBuffer | None = None, **kwargs: Any) -> None:  # fmt: skip
        if kwargs.get("use_cuda_graph"):
            raise ValueError("lab wrappers do not run in CUDA-graph mode")
        super().__init__(**kwargs)
        self.lab_spec_of, self.lab_work, self.lab_trace = spec_of, work, trace

    def _count_ctas(self, plan: Any, num_sms: int | None, device_id: int | None) -> int:
        if self.lab_spec_of is None or device_id is None:
            return super()._count_ctas(plan, num_sms, device_id)
        from cuinfer.prefill.tiles import block_smem_bytes
        from cuinfer.runtime.device import device_info

        cfg, key = plan.config, plan.key(self.paged)
        kernel = lab_kernel(self.lab_spec_of(key), key.name_expr(), device_id)
        smem = block_smem_bytes(cfg, plan.head_dim, plan.head_dim_vo, self.paged, variant=plan.variant)
        per_sm = max(1, kernel.max_active_blocks(cfg.block_threads, smem)) * cfg.groups
        return per_sm * (device_info(device_id).sm_count if num_sms is None else int(num_sms))

    def _work(self, plan: Any, num_ctas: int, fixed_split_size: int | None) -> WorkPlan:
        if self.lab_work is None:
            return super()._work(plan, num_ctas, fixed_split_size)
        return self.lab_work(plan, num_ctas, lambda: super(LabPrefill, self)._work(plan, num_ctas, fixed_split_size))

    def _launch(self, call: Any, plan: Any, tq: Any, kv: Any, to: Any, tl: Any, k_scale: Any, v_scale: Any) -> None:
        tl = _lse_or_trace(tl, self.lab_trace)
        st = self._launch_state
        if st is None or not st.current(self._buffers, plan, call.device_id):
            st = self._launch_state = PrefillLaunch(self._buffers, plan, call.device_id, self.paged, plan.work.n_merge)
            if self.lab_spec_of is not None:
                key = plan.key(self.paged)
                st.kernel = lab_kernel(self.lab_spec_of(key), key.name_expr(), call.device_id)
            if self.lab_trace is not None:
                st.merge = None  # (the merge would write its lse over the stamps)
        st.launch(call.stream, tq, kv, to, tl)


# ---- work plans of the lab ------------------------------------------------------------------------------------------


def cta_major(owner: np.ndarray, rank: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray]:
    """``(items, work_indptr)`` of a schedule: item ``i`` runs on CTA ``owner[i]`` as its ``rank[i]``-th-ranked item;
    the items CTA-major, each CTA's in rank order (the form the persistent kernels read)."""
    items = np.lexsort((rank, owner))
    indptr = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=p), out=indptr[1:])
    return items, indptr


def list_schedule(costs: np.ndarray, order: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Items ``order`` (in that order), each to the least-loaded of ``p`` CTAs: ``(owner, rank, balance)`` with the
    balance mean / max of the CTAs' loads."""
    heap = [(0.0, c) for c in range(p)]
    owner = np.empty(order.shape[0], dtype=np.int64)
    for i in order.tolist():
        load, c = heapq.heappop(heap)
        owner[i] = c
        heapq.heappush(heap, (load + float(costs[i]), c))
    loads = np.bincount(owner, weights=costs, minlength=p)
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0])
    return owner, rank, float(loads.mean() / loads.max())


def reassigned(work: WorkPlan, owner: np.ndarray, rank: np.ndarray, mode: str) -> WorkPlan:
    """``work``'s items (its CTA-major order: ``owner[i]``, ``rank[i]`` for item ``i``) on other CTAs: the same items
    and merges, no shared tail."""
    items, indptr = cta_major(owner, rank, work.num_ctas)
    arrays = {name: getattr(work, name)[items] for name in ITEM_ARRAYS}
    merge = {name: getattr(work, name) for name in MERGE_ARRAYS}
    out = WorkPlan.from_items(work.num_ctas, indptr, arrays, merge, work.num_partial_rows, work.chunk_size, mode)
    out.num_kv_heads = work.num_kv_heads
    return out


def item_tiles(work: WorkPlan, tile_kv: int) -> np.ndarray:
    """KV tiles of each item (CTA-major, int64)."""
    return -(-(work.item_kv_end.astype(np.int64) - work.item_kv_start) // tile_kv)


def natural_index(work: WorkPlan) -> np.ndarray:
    """Each item's place in the natural (head-major) order: ``head * groups + group`` (CTA-major, int64)."""
    n, g = work.n_items, work.n_groups
    if work.item_group is None:
        return np.arange(n, dtype=np.int64)
    return np.asarray(work.item_head, dtype=np.int64) * g + np.asarray(work.item_group, dtype=np.int64)


# ---- lab wrappers planned for the standard cases (bench.inputs) ----------------------------------------------------


def planned_decode(inp: Any, *, use_tensor_cores: bool | None = None, fixed_split_size: int | None = None,
                   **lab: Any) -> tuple[LabDecode, Callable[[], Any]]:  # fmt: skip
    """``(wrapper, run)``: a ``LabDecode(**lab)`` planned for a decode case's inputs (``bench.inputs.decode_inputs``)
    and its ``run()`` on them."""
    s, t = inp.case.shape, inp.kv.table
    w = LabDecode(kv_layout=s.kv_layout, use_tensor_cores=use_tensor_cores, **lab)
    w.plan(t.kv_indptr, t.kv_indices, t.kv_last_page_len, num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads,
           head_dim=s.head_dim, page_size=s.page_size, q_dtype=s.dtype, kv_dtype=inp.case.kv_dtype,
           fixed_split_size=fixed_split_size)  # fmt: skip
    return w, lambda: w.run(inp.q, inp.kv.cache)


def planned_prefill(inp: Any, *, tile_sizes: tuple | None = None, **lab: Any) -> tuple[LabPrefill, Callable[[], Any]]:
    """``(wrapper, run)``: a ``LabPrefill(**lab)`` (the fa2 kernel) planned for a prefill case's inputs
    (``bench.inputs.prefill_inputs``), ``tile_sizes`` forced when given, and its ``run()`` on them."""
    case, s = inp.case, inp.case.shape
    kw = dict(num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, causal=case.causal,
              q_dtype=s.dtype, kv_dtype=case.kv_dtype or s.dtype, tile_sizes=tile_sizes)  # fmt: skip
    paged = case.layout == "paged"
    w = LabPrefill(paged=paged, kv_layout=s.kv_layout, backend="fa2", **lab)
    if paged:
        t = inp.kv.table
        w.plan(inp.qo_indptr, t.kv_indptr, t.kv_indices, t.kv_last_page_len, page_size=s.page_size, **kw)
        return w, lambda: w.run(inp.q, inp.kv.cache)
    w.plan(inp.qo_indptr, inp.qo_indptr, **kw)
    return w, lambda: w.run(inp.q, inp.k, inp.v)
