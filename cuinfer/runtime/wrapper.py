"""The plan/run lifecycle of every attention wrapper: ``PlanRunWrapper``, which ``BatchDecode`` and ``BatchPrefill``
subclass, and so will later wrappers (cascade, block-sparse, a mixed prefill + decode batch, another kernel backend
such as Hopper's): a subclass supplies what is its own (arguments, checks, kernels), the base keeps the rest.

``plan()`` runs on the host once per batch / step. The subclass validates its arguments and builds a plan (a
``PlanState`` subclass holding its facts and the ``WorkPlan``), then ``_commit`` checks the workspace, packs the plan
into the next pinned host buffer (on a GPU) and records where its words are. ``run()`` runs per layer: ``_run`` checks
q and the KV arrays against the plan, allocates or checks the outputs, uploads the plan words (once per plan and
stream; every time in CUDA-graph mode, so a captured graph replays whatever the latest plan() wrote) and launches, all
on the caller's current stream; run() never synchronises. A serving loop calls run() every layer: its host path does
no work beyond the hooks it calls.

Hooks (a subclass's public ``plan()``, ``run()`` and ``workspace_size()`` name the arguments, then call the base):

planning
  ``plan(...)``                                  build the plan with its ``work``, then ``self._commit(plan, device)``
  ``workspace_size(...)``                        the same plan, then ``self._workspace_need(plan)``
  ``_words_layout(plan, holder)``                -> ``(PlanLayout, {array: word offset}, words in use)`` of the plan
                                                 buffer (``holder.fixed_layout`` keeps a graph-mode layout)
  ``_fill_words(plan, host, layout, offsets, generation)``  pack the plan and its index arrays into ``host``
running
  ``run(...)``                                   its own argument checks, then ``self._run(q, kv, ...)``
  ``_check_q(plan, tq)``                         q against the plan
  ``_kv_view(call, plan, kv)``                   run()'s KV argument(s) (opaque to the base) as a checked ``KV``
  ``_launch(call, plan, tq, kv, to, tl, k_scale, v_scale)``  enqueue the kernel(s) on ``call.stream``
  ``_reference(plan, tq, kv, kvt, k_scale, v_scale, arrays)``  -> float64 ``(o, lse)`` of NumPy inputs (the CPU
                                                 reference), after the checks run() makes on both routes
                                                 (``_run_host``); ``arrays``: run()'s variant arrays, checked
class constants
  ``_NAME`` (messages), ``_PLAN_CALL`` (the plan() call run() asks for without a plan), ``_RUN_ARRAY_NAMES`` (q, K,
  V and out in device-mismatch messages), ``_DEFAULT_WORKSPACE_BYTES`` (private like the hooks: the wrappers' public
  surface is their constructor, plan(), run() and workspace_size())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cuinfer.formats.kv import KV, check_aligned
from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.planner import layout as plan_layout
from cuinfer.planner.work import WorkPlan
from cuinfer.runtime.buffers import Buffers, HostLayoutHolder, buffer_settings, fit_workspace, partial_rows_capacity
from cuinfer.runtime.cache_views import CacheViews
from cuinfer.runtime.calls import HOST, Call, begin, is_host
from cuinfer.runtime.options import kv_layout_name
from cuinfer.runtime.outputs import host_outputs, prepare_outputs, replan_hint
from cuinfer.variants import host as variant_host
from cuinfer.variants.arrays import device_arrays, host_arrays


def check_q_dtype(plan: Any, tq: Tensor) -> None:
    """q's dtype against the plan's ``q_dtype``, its contiguous last dimension and, on the GPU, the 16-byte alignment
    of its rows."""
    if tq.dtype is not plan.q_dtype:
        raise ValueError(
            f"q has dtype {tq.dtype.value} but plan() was made for q_dtype={plan.q_dtype.value}; cast q with "
            f"{validate.cast_fix('q', tq.framework, plan.q_dtype)}{replan_hint('q_dtype', tq.dtype)}"
        )
    check_aligned("q", tq, (0, 1))


def array_counts(plan: Any) -> dict[str, int]:
    """What a variant's array parameters have one element of, in ``plan`` (cuinfer/variants/arrays.py)."""
    return {"qo_head": plan.num_qo_heads, "kv_head": plan.num_kv_heads, "request": plan.batch}


@dataclass(kw_only=True)
class PlanState:
    """What the lifecycle reads and records on every plan; a wrapper's plan subclasses it with the facts of its
    kernels (and carries ``o_dtype``, the dtype of ``o``)."""

    out_shape: tuple[int, ...] = ()  # shape of o
    partial_dim: int = 0  # elements of one split-KV partial row (the output head dim)
    work: WorkPlan | None = None
    # GPU side (None for a host-only plan)
    words: np.ndarray | None = None  # the pinned buffer this plan was packed into
    words_used: int = 0
    offsets: dict | None = None  # word offsets of the plan arrays and of the index arrays
    device_id: int | None = None
    uploaded_on: int | None = None  # stream the current device copy was made on


class PlanRunWrapper:
    """The shared plan/run lifecycle (see the module docstring for the hooks a subclass supplies)."""

    _NAME: ClassVar[str] = "PlanRunWrapper"
    _PLAN_CALL: ClassVar[str] = "plan(...)"
    _RUN_ARRAY_NAMES: ClassVar[tuple[str, str, str, str]] = ("q", "k", "v", "out")
    _DEFAULT_WORKSPACE_BYTES: ClassVar[int] = 128 << 20

    def __init__(
        self, *, kv_layout: Any, use_cuda_graph: bool, max_batch_size: int | None, workspace_bytes: int | None,
        device: int | None,
    ) -> None:  # fmt: skip
        self.kv_layout = kv_layout_name(kv_layout)
        self.use_cuda_graph, self.max_batch_size, self.workspace_bytes, self._grow_workspace = buffer_settings(
            use_cuda_graph, max_batch_size, workspace_bytes, self._DEFAULT_WORKSPACE_BYTES
        )
        self.device = device
        self._plan: Any = None
        self._buffers: Buffers | None = None
        self._host_holder = HostLayoutHolder()  # graph-mode layout of host-only packs (_pack_host without a GPU)
        self._generation = 0
        self._device_id: int | None | bool = False  # False: not asked yet
        self._static: dict = {}  # the memo of what plan()'s arguments other than the index arrays fix
        self._rows_memo: tuple | None = None
        self._offsets: dict = {}  # word offsets of plan + index arrays, by layout and capacities
        self._pack_memo: dict = {}  # id(host buffer) -> (buffer, layout, planner.pack memo, ...)
        self._launch_state: Any = None  # what run() launches for the current plan (the subclass's)
        self._kv_views = CacheViews()  # the checked view of the last paged cache

    # -- planning --------------------------------------------------------------------------------------------------

    def _device_or_none(self) -> int | None:
        """The GPU plans are made for (None without one); asked once per wrapper, so plan() stays cheap."""
        if self._device_id is False:
            from cuinfer.runtime.device import current_device_id, gpu_available

            gpu = gpu_available()
            self._device_id = None if not gpu else int(self.device) if self.device is not None else current_device_id()
        return self._device_id

    def _partial_capacity(self, dim: int) -> int:
        """Partial rows the workspace holds (memoised per size)."""
        key = (self.workspace_bytes, dim)
        memo = self._rows_memo
        if memo is None or memo[0] != key:
            memo = self._rows_memo = (key, partial_rows_capacity(*key))
        return memo[1]

    def _workspace_need(self, plan: PlanState) -> int:
        """Exact workspace bytes of ``plan``'s split-KV partial states (``workspace_size()``)."""
        return plan_layout.workspace_bytes(plan.work, plan.partial_dim)

    def _fit_workspace(self, plan: PlanState) -> None:
        """Raise, or grow the workspace (a wrapper given no workspace_bytes), when ``plan``'s partials do not fit."""
        rows = plan.work.num_partial_rows
        if rows and rows > self._partial_capacity(plan.partial_dim):
            self.workspace_bytes = fit_workspace(
                self._NAME, self.workspace_bytes, self._workspace_need(plan), rows, can_grow=self._grow_workspace
            )

    def _commit(self, plan: PlanState, device_id: int | None, *, fit_on_host: bool = True) -> None:
        """Make ``plan`` (with its work) the current plan: the workspace checked (also without a GPU unless
        ``fit_on_host`` is False), the words packed on a GPU. Raises before anything reaches the GPU."""
        if device_id is not None:
            grown_from = self.workspace_bytes
            self._fit_workspace(plan)
            try:
                self._pack(plan, device_id)
            except MemoryError:  # (Buffers names what could not be allocated; a smaller plan may still fit)
                self.workspace_bytes = grown_from
                raise
        elif fit_on_host:
            self._fit_workspace(plan)
        self._plan = plan

    def _pack(self, plan: PlanState, device_id: int) -> None:
        """Pack ``plan`` into the next pinned host buffer and record where (the upload waits for run())."""
        buf = self._buffers
        if buf is None or buf.device_id != device_id:
            buf = self._buffers = Buffers(device_id, self.workspace_bytes, self.use_cuda_graph)
        buf.ensure_workspace(self.workspace_bytes)
        lay, off, total = self._words_layout(plan, buf)
        buf.ensure(total)
        host = buf.next_host()
        self._generation += 1
        self._fill_words(plan, host, lay, off, self._generation)
        plan.words, plan.words_used, plan.offsets, plan.device_id = host, total, off, device_id
        plan.uploaded_on = None

    def _pack_host(self, host: np.ndarray | None = None) -> np.ndarray:
        """Pack the current plan into ``host`` (a NumPy int32 buffer, allocated when None) exactly as plan() packs
        it into the pinned buffer on a GPU: the plan-side packing without a device (tests, benchmarks). Like the
        pinned buffers, ``host`` must not be written by anything else between packs (fields the shape of the plan
        fixes are not rewritten when it already holds them): pass None for a fresh buffer."""
        plan = self._plan
        holder = self._buffers if self._buffers is not None else self._host_holder
        lay, off, total = self._words_layout(plan, holder)
        if host is None or host.shape[0] < total:
            host = np.zeros(total, dtype=np.int32)
        self._fill_words(plan, host, lay, off, self._generation + 1)
        return host

    def _words_layout(self, plan: Any, holder: Any) -> tuple:
        raise NotImplementedError

    def _fill_words(self, plan: Any, host: np.ndarray, lay: Any, off: dict, generation: int) -> None:
        raise NotImplementedError

    # -- running ---------------------------------------------------------------------------------------------------

    def _run(
        self, q: Any, kv: Any, out: Any, lse: Any, want_lse: bool, k_scale: Any, v_scale: Any,
        variant_arrays: Any = None,
    ) -> Any:  # fmt: skip
        """run()'s skeleton: ``o``, or ``(o, lse)`` when ``want_lse``; the caller's ``out`` / ``lse`` when given.
        ``variant_arrays``: the array parameters of the plan's variants (checked here, handed to the launch on
        ``call.variant_arrays``)."""
        plan = self._plan
        if plan is None:
            raise ValueError(f"run() needs a plan: call {self._PLAN_CALL} first")
        if is_host(q):
            return self._run_host(plan, q, kv, out, lse, want_lse, k_scale, v_scale, variant_arrays)
        call, tq = begin(q, "q")
        self._check_q(plan, tq)
        kvt = self._kv_view(call, plan, kv)
        if variant_arrays is not None or plan.variant.array_params:
            call.variant_arrays = device_arrays(plan.variant, variant_arrays, array_counts(plan), call)
        if plan.device_id is None or plan.device_id != call.device_id:
            raise ValueError(
                f"q is on cuda:{call.device_id} but plan() was made for "
                f"{'no GPU' if plan.device_id is None else f'cuda:{plan.device_id}'}; call plan() with "
                f"{self._NAME}(device={call.device_id})"
            )
        to, tl = prepare_outputs(call, plan.out_shape, plan.o_dtype, out, lse, want_lse)
        validate.check_same_device(self._RUN_ARRAY_NAMES, (tq, kvt.k, kvt.v, to))
        if plan.work.n_items:
            buf = self._buffers  # (_enqueue, inlined: run() is on the per-layer host path)
            if self.use_cuda_graph or plan.uploaded_on != call.stream or buf.device_id != plan.device_id:
                buf.upload(plan.words, plan.words_used, call.stream)
                plan.uploaded_on = call.stream
            self._launch(call, plan, tq, kvt, to, tl, k_scale, v_scale)
        o_user = out if out is not None else call.give(to)
        if not want_lse:
            return o_user
        return o_user, (lse if lse is not None else call.give(tl))

    def _run_host(
        self, plan: Any, q: Any, kv: Any, out: Any, lse: Any, want_lse: bool, k_scale: Any, v_scale: Any,
        variant_arrays: Any = None,
    ) -> Any:  # fmt: skip
        """run() on the CPU reference backend: the GPU route's checks (q, the KV arrays, the variant arrays, out /
        lse, one device), by the same hooks in the same order, then the float64 reference, returned in the GPU's dtypes
        (o in o_dtype, lse float32) and written into out / lse when given. A user variant without the NumPy functions
        its snippets need raises ``NotImplementedError`` naming them."""
        tq = as_tensor(q, "q")
        self._check_q(plan, tq)
        kvt = self._kv_view(HOST, plan, kv)
        arrays = host_arrays(plan.variant, variant_arrays, array_counts(plan))
        to, tl = prepare_outputs(HOST, plan.out_shape, plan.o_dtype, out, lse, want_lse)
        validate.check_same_device(self._RUN_ARRAY_NAMES, (tq, kvt.k, kvt.v, to))
        variant_host.check_numpy(plan.variant)
        o64, lse64 = self._reference(plan, tq, kv, kvt, k_scale, v_scale, arrays)
        return host_outputs(o64, lse64, to, tl)

    def _enqueue(
        self, call: Call, plan: Any, tq: Tensor, kv: KV, to: Tensor, tl: Tensor | None, k_scale: Any, v_scale: Any
    ) -> None:
        """Upload ``plan``'s words when the device copy is not current on this stream (always in CUDA-graph mode),
        then launch: for callers that prepare their own arrays (``single_decode``)."""
        buf = self._buffers
        if self.use_cuda_graph or plan.uploaded_on != call.stream or buf.device_id != plan.device_id:
            buf.upload(plan.words, plan.words_used, call.stream)
            plan.uploaded_on = call.stream
        self._launch(call, plan, tq, kv, to, tl, k_scale, v_scale)

    def _check_q(self, plan: Any, tq: Tensor) -> None:
        raise NotImplementedError

    def _kv_view(self, call: Call, plan: Any, kv: Any) -> KV:
        raise NotImplementedError

    def _launch(
        self, call: Call, plan: Any, tq: Tensor, kv: KV, to: Tensor, tl: Tensor | None, k_scale: Any, v_scale: Any
    ) -> None:
        raise NotImplementedError

    def _reference(
        self, plan: Any, tq: Tensor, kv: Any, kvt: KV, k_scale: Any, v_scale: Any, arrays: dict
    ) -> tuple:  # fmt: skip
        raise NotImplementedError
