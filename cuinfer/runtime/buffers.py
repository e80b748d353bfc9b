"""The buffers a plan/run wrapper owns on the GPU (plan buffer, pinned host buffers, workspace) and the constructor and
workspace rules they follow."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.planner import layout as plan_layout
from cuinfer.runtime.options import check_int


def buffer_settings(
    use_cuda_graph: bool, max_batch_size: int | None, workspace_bytes: int | None, default_workspace: int
) -> tuple[bool, int | None, int, bool]:
    """The plan/run wrappers' shared constructor rules -> (graph, max_batch_size, workspace bytes, may grow).

    CUDA graphs size every buffer once, so they need ``max_batch_size``; without an explicit ``workspace_bytes`` (and
    without graphs, whose pointers must stay fixed) the workspace grows as plans need.
    """
    graph = bool(use_cuda_graph)
    if graph and max_batch_size is None:
        raise ValueError(
            f"use_cuda_graph=True needs max_batch_size >= 1 (the plan buffers are sized once) but got {max_batch_size}"
        )
    if max_batch_size is not None:
        max_batch_size = check_int("max_batch_size", max_batch_size)
    ws = (
        default_workspace
        if workspace_bytes is None
        else check_int("workspace_bytes", workspace_bytes, lo=0, hi=2**62, rule="an integer >= 0")
    )
    return graph, max_batch_size, ws, workspace_bytes is None and not graph


def fit_workspace(wrapper: str, current: int, need: int, rows: int, *, can_grow: bool) -> int:
    """Workspace bytes to use for a plan needing ``need``: ``current`` when it fits, else a larger size when the
    wrapper may grow (no workspace_bytes given, no CUDA graph), else a ValueError with the exact figure."""
    if need <= current:
        return current
    if can_grow:
        return max(need, 2 * current)
    raise ValueError(
        f"the plan needs {need} bytes of workspace for {rows} split-KV partial rows but the wrapper has "
        f"workspace_bytes={current}; build {wrapper}(workspace_bytes={need}) or larger "
        "(workspace_size(...) gives the exact figure)"
    )


def partial_rows_capacity(workspace_bytes: int, head_dim: int) -> int:
    """Split-KV partial rows (fp32 o row + lse) a workspace holds; fixing this fixes where partial_lse starts, so
    the kernel's pointers never move between plans."""
    rows = int(workspace_bytes) // (4 * head_dim + 4)
    while rows > 0 and plan_layout.workspace_offsets(rows, head_dim)[1] > workspace_bytes:
        rows -= 1
    return rows


# ---- GPU buffers of one wrapper ---------------------------------------------------------------------------------


@contextlib.contextmanager
def allocating(device_id: int, nbytes: int, what: str) -> Iterator[None]:
    """Turn a failed device or pinned-host allocation of plan() into a MemoryError that names what was allocated and
    its size (CuPy says "out of memory" for the device and a bare CUDA error for pinned memory)."""
    import cupy

    try:
        yield
    except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError) as exc:
        raise MemoryError(
            f"plan() needs {nbytes} bytes ({nbytes / 2**30:.2f} GiB) for the {what} on cuda:{device_id} but they "
            f"cannot be allocated ({exc}); plan a smaller batch, or free device memory (workspace_size(...) gives "
            "the workspace a plan needs)"
        ) from exc


class Buffers:
    """Device plan buffer, pinned host buffers (two, alternating, so plan() never overwrites a buffer whose copy is
    still pending; one in CUDA-graph mode, whose captured copy reads a fixed address) and the workspace."""

    def __init__(self, device_id: int, workspace_bytes: int, graph: bool) -> None:
        import cupy

        self.device_id = device_id
        self.graph = graph
        with cupy.cuda.Device(device_id), allocating(device_id, int(workspace_bytes), "workspace"):
            self.workspace = cupy.empty(int(workspace_bytes), dtype=np.uint8)
        self.workspace_bytes = int(workspace_bytes)
        self.merge_count = None
        self._new_merge_counters()
        self.device = None
        self.pinned: list[np.ndarray] = []
        self.events: list[Any] = []
        self.turn = 0
        self.fixed_layout: FixedLayout | None = None  # graph mode: what the first plan packed here fixed

    def ensure_workspace(self, nbytes: int) -> None:
        """Grow the workspace to ``nbytes`` (a wrapper that was given no workspace_bytes grows as plans need)."""
        import cupy

        if nbytes <= self.workspace_bytes:
            return
        with cupy.cuda.Device(self.device_id):
            cupy.cuda.Device(self.device_id).synchronize()  # kernels in flight may still write the old partials
            with allocating(self.device_id, int(nbytes), "workspace"):
                self.workspace = cupy.empty(int(nbytes), dtype=np.uint8)
        self.workspace_bytes = int(nbytes)
        self._new_merge_counters()

    def _new_merge_counters(self) -> None:
        """Zeroed arrival counters of the decode kernels' in-kernel merge (decode.cuh ``merge_split``), one per partial
        row the workspace can hold at the smallest head dim (a unit's counter is its first partial row); a prefill
        wrapper's kernel, which merges in a second launch, keeps its shared-tail counters in words 0-1 (prefill.cuh).
        The kernels return every counter they use to 0, so they are zeroed only here, at plan time (never inside a graph
        capture), and the device is synchronised so no stream can see them before the zeros land."""
        import cupy

        n = max(2, self.workspace_bytes // (4 * 64 + 4))  # (at least the prefill tail's two)
        with cupy.cuda.Device(self.device_id):
            self.merge_count = cupy.zeros(n, dtype=np.int32)
            cupy.cuda.Device(self.device_id).synchronize()

    def merge_count_ptr(self) -> int:
        return int(self.merge_count.data.ptr)

    def ensure(self, words: int) -> None:
        """Room for ``words`` int32 on both sides (never shrinks; in graph mode sized once)."""
        import cupy
        import cupyx

        if self.device is not None and self.device.size >= words:
            return
        if self.graph and self.device is not None:
            raise ValueError(
                f"the plan needs {words} words of plan buffer but the CUDA-graph buffers hold {self.device.size}; "
                "build the wrapper with a larger max_batch_size"
            )
        n = max(words, 2 * (self.device.size if self.device is not None else 0), 4096)
        with cupy.cuda.Device(self.device_id):
            if self.device is not None:
                # Growing (rare: the first plans of a wrapper): kernels and copies in flight may still read the old
                # buffers, on any stream; wait for them before the memory goes back to the pools.
                cupy.cuda.Device(self.device_id).synchronize()
            with allocating(self.device_id, 4 * n, "plan buffer (plan and page table)"):
                self.device = cupy.empty(n, dtype=np.int32)
                self.pinned = [cupyx.empty_pinned((n,), dtype=np.int32) for _ in range(1 if self.graph else 2)]
            self.events = [None] * len(self.pinned)

    def next_host(self) -> np.ndarray:
        """The pinned buffer to pack the next plan into, once its previous copy has left it."""
        i = 0 if self.graph else self.turn
        self.turn ^= 1
        ev = self.events[i]
        if ev is not None:
            ev.synchronize()  # normally long done: the copy was enqueued at least one plan() ago
        return self.pinned[i]

    def upload(self, host: np.ndarray, words: int, stream: int) -> None:
        import cupy

        from cuinfer.interop.streams import cupy_stream

        s = cupy_stream(stream, self.device_id)
        cupy.cuda.runtime.memcpyAsync(self.device.data.ptr, host.ctypes.data, 4 * words, 1, s.ptr)
        if not self.graph:
            i = next(j for j, p in enumerate(self.pinned) if p is host)
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record(s)
            self.events[i] = ev

    def ptr(self, word: int) -> int:
        return int(self.device.data.ptr) + 4 * int(word)

    def partial_pointers(self, head_dim: int) -> tuple[int, int]:
        """Device addresses of partial_o and partial_lse (fixed for a given head dim)."""
        ws = int(self.workspace.data.ptr)
        rows = partial_rows_capacity(self.workspace_bytes, head_dim)
        return ws, ws + plan_layout.workspace_offsets(rows, head_dim)[0]


@dataclass(frozen=True, eq=False)
class FixedLayout:
    """CUDA-graph mode: what the first plan fixed. A captured run() keeps reading the plan buffer at these offsets and
    launches the kernel of the first plan, so every later plan must keep ``signature`` and fit the capacities."""

    layout: plan_layout.PlanLayout
    signature: tuple  # what later plans must keep: heads, and the kernel (its configuration or key)
    page_cap: int  # page-table entries the buffer holds
    mask_cap: int = 0  # custom-mask bytes the buffer holds (prefill)
    config: Any = None  # the tile configuration later plans keep instead of choosing their own (prefill)
    backend: str = ""  # the kernel later plans keep ("fa2" / "sm90": BatchPrefill's "auto" resolved by the first plan)
    values: Any = None  # the option and variant-parameter values later plans keep (the captured launch holds them)


def check_fixed_values(fixed: FixedLayout, options: Any, variant_values: dict | None) -> None:
    """CUDA-graph mode: a later plan's option values (sm_scale, the soft cap, the window, ...) and the scalar
    parameters of its variants (``variant_params``) must be the first plan's. The kernel's parameters are its launch
    arguments, which a captured graph holds by value: a replay after a plan with other values would run the first
    plan's values (and kernel) without a word. Raises ValueError naming what changed."""
    first_options, first_variants = fixed.values
    if options == first_options and variant_values == first_variants:
        return
    changed = [
        f"{f.name}: {getattr(first_options, f.name)!r} -> {getattr(options, f.name)!r}"
        for f in dataclasses.fields(options)
        if getattr(first_options, f.name) != getattr(options, f.name)
    ]
    if variant_values != first_variants:
        changed.append(f"variant_params: {first_variants!r} -> {variant_values!r}")
    raise ValueError(
        "with use_cuda_graph=True every plan() must keep the option values of the first (a captured launch holds "
        f"them by value; a replay would run the first plan's): {'; '.join(changed)}. Build a wrapper per set of "
        "options"
    )


class HostLayoutHolder:
    """Where plans packed without a GPU (``_pack_host``: tests, benchmarks) keep their graph-mode layout, as
    ``Buffers`` does on a GPU."""

    fixed_layout: FixedLayout | None = None
