"""The arrays around a decode launch: views of the KV cache (any layout, 5-D or a (k, v) tuple, as base pointers and
strides) and the buffers a wrapper owns on the GPU (plan buffer, pinned host buffers, workspace)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.interop import validate
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType
from cuinfer.planner import layout as plan_layout


def buffer_settings(
    use_cuda_graph: bool, max_batch_size: int | None, workspace_bytes: int | None, default_workspace: int
) -> tuple[bool, int | None, int, bool]:
    """The plan/run wrappers' shared constructor rules -> (graph, max_batch_size, workspace bytes, may grow).

    CUDA graphs size every buffer once, so they need ``max_batch_size``; without an explicit ``workspace_bytes`` (and
    without graphs, whose pointers must stay fixed) the workspace grows as plans need.
    """
    graph = bool(use_cuda_graph)
    if graph and (max_batch_size is None or int(max_batch_size) < 1):
        raise ValueError(
            f"use_cuda_graph=True needs max_batch_size >= 1 (the plan buffers are sized once) but got {max_batch_size}"
        )
    ws = default_workspace if workspace_bytes is None else int(workspace_bytes)
    if ws < 0:
        raise ValueError(f"workspace_bytes must be >= 0 but is {workspace_bytes}")
    return graph, None if max_batch_size is None else int(max_batch_size), ws, workspace_bytes is None and not graph


def check_page_table(
    indptr: np.ndarray, kv_indices: Any, kv_last_page_len: Any, page_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate a CSR page table whose ``indptr`` is already checked -> (indices, last_page_len, pages per request)."""
    batch = indptr.shape[0] - 1
    indices = validate.check_index_array("kv_indices", kv_indices, min_len=int(indptr[-1]))
    last = validate.check_index_array(
        "kv_last_page_len", kv_last_page_len, length=batch, hint="one entry per request (len(kv_indptr) - 1)"
    )
    pages = np.diff(indptr)
    bad = (pages > 0) & ((last < 1) | (last > page_size))
    if np.any(bad):
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"kv_last_page_len[{b}] must be in [1, page_size={page_size}] for a request with pages but is "
            f"{int(last[b])}; it counts the tokens in the request's last page"
        )
    return indices, last, pages


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


class Buffers:
    """Device plan buffer, pinned host buffers (two, alternating, so plan() never overwrites a buffer whose copy is
    still pending; one in CUDA-graph mode, whose captured copy reads a fixed address) and the workspace."""

    def __init__(self, device_id: int, workspace_bytes: int, graph: bool) -> None:
        import cupy

        self.device_id = device_id
        self.graph = graph
        with cupy.cuda.Device(device_id):
            self.workspace = cupy.empty(int(workspace_bytes), dtype=np.uint8)
        self.workspace_bytes = int(workspace_bytes)
        self.merge_count = None
        self._new_merge_counters()
        self.device = None
        self.pinned: list[np.ndarray] = []
        self.events: list[Any] = []
        self.turn = 0
        self.fixed_layout = None  # graph mode: (PlanLayout, (heads, group, config), page-index capacity)

    def ensure_workspace(self, nbytes: int) -> None:
        """Grow the workspace to ``nbytes`` (a wrapper that was given no workspace_bytes grows as plans need)."""
        import cupy

        if nbytes <= self.workspace_bytes:
            return
        with cupy.cuda.Device(self.device_id):
            cupy.cuda.Device(self.device_id).synchronize()  # kernels in flight may still write the old partials
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


# ---- cache arrays --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KV:
    """K and V of a paged cache (or of one request): base pointers and element strides (page, slot, head)."""

    k: Tensor
    v: Tensor
    k_ptr: int
    v_ptr: int
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]
    num_pages: int
    page_size: int
    num_kv_heads: int
    head_dim: int


def check_aligned(name: str, t: Tensor, dims: tuple[int, ...]) -> None:
    """16-byte vector access: base address and the strides of ``dims`` must be multiples of 16 bytes."""
    validate.check_last_dim_contiguous(name, t)
    item = t.dtype.itemsize
    bad = False
    for d in dims:
        bad = bad or (t.shape[d] > 1 and (t.strides[d] * item) % 16 != 0)
    if t.ptr % 16 or bad:
        raise ValueError(
            f"{name} must start on a 16-byte boundary with rows 16-byte aligned (the kernels read 16-byte vectors) "
            f"but starts at 0x{t.ptr:x} with strides {t.strides} (elements); pass a contiguous copy of {name}"
        )


def check_cache_matches(kv: KV, plan: Any, layout: str) -> None:
    """Raise unless the parsed paged cache ``kv`` has the page size, KV heads and head dim ``plan`` was made for
    (decode and prefill plans both carry ``page_size``, ``num_kv_heads``, ``head_dim``)."""
    got = (kv.page_size, kv.num_kv_heads, kv.head_dim)
    want = (plan.page_size, plan.num_kv_heads, plan.head_dim)
    if got != want:
        raise ValueError(
            f"kv_cache has (page_size, num_kv_heads, head_dim) = {got} ({layout}) but plan() was made for "
            f"{want}; pass the cache the plan describes (or check kv_layout)"
        )


def paged_kv(tensor: Callable[[Any, str], Tensor], kv_cache: Any, layout: str, *, gpu: bool) -> KV:
    """Parse a 5-D cache or a (k_cache, v_cache) tuple of ``layout`` (imported with ``tensor``); ``gpu`` adds the
    16-byte alignment checks the kernels need."""
    nhd = layout == "NHD"
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise ValueError(f"a tuple kv_cache must be (k_cache, v_cache) but has {len(kv_cache)} entries")
        k, v = tensor(kv_cache[0], "k_cache"), tensor(kv_cache[1], "v_cache")
        expect = (
            "[num_pages, page_size, num_kv_heads, head_dim]"
            if nhd
            else "[num_pages, num_kv_heads, page_size, head_dim]"
        )
        for name, t in (("k_cache", k), ("v_cache", v)):
            validate.check_ndim(name, t, 4, hint=f"a ({layout}) cache is {expect}")
            if gpu:
                check_aligned(name, t, (0, 1, 2))
        validate.check_shape("v_cache", v, k.shape, hint="it must match k_cache")
        slot, head = (1, 2) if nhd else (2, 1)
        ks = (k.strides[0], k.strides[slot], k.strides[head])
        vs = (v.strides[0], v.strides[slot], v.strides[head])
        shape, kt, vt, kp, vp = k.shape, k, v, k.ptr, v.ptr
    else:
        c = tensor(kv_cache, "kv_cache")
        expect = (
            "[num_pages, 2, page_size, num_kv_heads, head_dim]"
            if nhd
            else "[num_pages, 2, num_kv_heads, page_size, head_dim]"
        )
        validate.check_ndim(
            "kv_cache", c, 5, hint=f"a ({layout}) cache is {expect}, or pass a (k_cache, v_cache) tuple"
        )
        if c.shape[1] != 2:
            raise ValueError(
                f"kv_cache must have shape {expect} ({layout}) but has shape {c.shape}; dim 1 holds K and V"
            )
        if gpu:
            check_aligned("kv_cache", c, (0, 1, 2, 3))
        slot, head = (2, 3) if nhd else (3, 2)
        ks = vs = (c.strides[0], c.strides[slot], c.strides[head])
        shape = (c.shape[0],) + c.shape[2:]
        kt = vt = c
        kp, vp = c.ptr, c.ptr + c.strides[1] * c.dtype.itemsize
    validate.check_same_dtype(("k_cache", "v_cache"), (kt, vt))
    page_size, heads = (shape[1], shape[2]) if nhd else (shape[2], shape[1])
    return KV(kt, vt, kp, vp, ks, vs, shape[0], page_size, heads, shape[3])


# ---- outputs ---------------------------------------------------------------------------------------------------------


def check_out_dtype(o_dtype: DType, to: Tensor) -> None:
    if to.dtype is not o_dtype:
        raise ValueError(
            f"out has dtype {to.dtype.value} but plan() was made for o_dtype={o_dtype.value}; pass an "
            f"out of dtype {o_dtype.value} or call plan() with o_dtype='{to.dtype.value}'"
        )


def prepare_outputs(call: Any, shape: tuple[int, int, int], o_dtype: DType, out: Any, lse: Any, want_lse: bool):
    """(o, lse or None) Tensors for a run(): the caller's ``out`` / ``lse`` checked, or new arrays in its framework."""
    if out is None:
        to = call.empty(shape, o_dtype)
    else:
        to = call.tensor(out, "out")
        validate.check_shape("out", to, shape)
        check_out_dtype(o_dtype, to)
        validate.check_writable("out", to)
        check_aligned("out", to, (0, 1))
    tl = None
    if want_lse:
        if lse is None:
            tl = call.empty(shape[:2], DType.FLOAT32)
        else:
            tl = call.tensor(lse, "lse")
            validate.check_shape("lse", tl, shape[:2])
            validate.check_dtype("lse", tl, (DType.FLOAT32,))
            validate.check_writable("lse", tl)
    return to, tl


def host_outputs(o64: np.ndarray, lse64: np.ndarray, o_dtype: DType, out, lse, want_lse: bool):
    """Reference results in the dtypes the GPU path returns (o in o_dtype, lse float32), written into out / lse."""
    o = o64.astype(o_dtype.numpy)
    lse32 = lse64.astype(np.float32)
    if out is not None:
        out[...] = o
        o = out
    if lse is not None:
        lse[...] = lse32
        lse32 = lse
    return (o, lse32) if want_lse else o
