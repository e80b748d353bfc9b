"""A stand-in GPU for CPU tests of the GPU route: the device, the buffers, the kernels and the caller's arrays are fakes
that record what a call enqueues (uploads, launches and their parameter structs), so CPU CI runs every check the GPU
route makes before a launch, and sees that nothing is launched when a check fails.

``install(monkeypatch)`` puts the fakes in place and returns ``(log, stream)``: the list of ``("upload", stream,
words)`` / ``("launch", kernel, stream, params)`` entries and a one-element list holding the stream run()'s calls
use. ``cuda(shape, dtype)`` is a fresh contiguous device array (a ``Tensor``); ``to_cuda(numpy array)`` the device
twin of a host array (same shape, dtype, strides and writability; tuples element-wise; anything else as it is).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from cuinfer.interop.arrays import Tensor, as_tensor
from cuinfer.interop.dtypes import DType
from cuinfer.planner import layout as plan_layout

import cuinfer.decode.launch as decode_launch
import cuinfer.decode.single as decode_single
import cuinfer.merge as merge
import cuinfer.prefill.launch as prefill_launch
import cuinfer.prefill.single as prefill_single
import cuinfer.prefill.sm90 as prefill_sm90
import cuinfer.prefill.wrapper as prefill_wrapper
import cuinfer.runtime.calls as calls
import cuinfer.runtime.device as device
import cuinfer.runtime.wrapper as wrapper

_NEXT = [1 << 20]


def _alloc(nbytes: int) -> int:
    p = _NEXT[0]
    _NEXT[0] += (int(nbytes) + 0xFFFF) & ~0xFFF
    return p


def cuda(shape: tuple, dtype: DType = DType.BFLOAT16) -> Tensor:
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return Tensor(_alloc(s * dtype.itemsize), tuple(shape), tuple(reversed(strides)), dtype, "cuda", 0, "cupy", None)


def to_cuda(a: Any) -> Any:
    if isinstance(a, tuple):
        return tuple(to_cuda(x) for x in a)
    if not isinstance(a, np.ndarray):
        return a
    t = as_tensor(a, "x")
    span = max(a.nbytes, 1) + sum(abs(s) * (n - 1) for s, n in zip(t.byte_strides, t.shape, strict=True) if n)
    return replace(t, ptr=_alloc(span), device_type="cuda", framework="cupy", obj=None)


class _Memory:
    def __init__(self, n: int) -> None:
        self.size = n
        self.data = type("Ptr", (), {"ptr": _alloc(4 * n)})()


class FakeBuffers:
    """``runtime.buffers.Buffers`` without CuPy: host buffers are NumPy, device addresses are made up."""

    def __init__(self, log: list, device_id: int, workspace_bytes: int, graph: bool) -> None:
        self.log, self.device_id, self.graph = log, device_id, graph
        self.workspace_bytes = int(workspace_bytes)
        self.workspace, self.merge_count = _Memory(self.workspace_bytes // 4 + 1), _Memory(2)
        self.device, self.pinned, self.turn, self.fixed_layout = None, [], 0, None

    def ensure_workspace(self, nbytes: int) -> None:
        if nbytes > self.workspace_bytes:
            self.workspace, self.workspace_bytes = _Memory(int(nbytes) // 4 + 1), int(nbytes)

    def merge_count_ptr(self) -> int:
        return self.merge_count.data.ptr

    def ensure(self, words: int) -> None:
        if self.device is None or self.device.size < words:
            n = max(words, 4096)
            self.device, self.pinned = _Memory(n), [np.zeros(n, np.int32) for _ in range(1 if self.graph else 2)]

    def next_host(self) -> np.ndarray:
        i = 0 if self.graph else self.turn
        self.turn ^= 1
        return self.pinned[i]

    def upload(self, host: np.ndarray, words: int, stream: int) -> None:
        self.log.append(("upload", stream, words))

    def ptr(self, word: int) -> int:
        return self.device.data.ptr + 4 * int(word)

    def partial_pointers(self, head_dim: int) -> tuple[int, int]:
        rows = self.workspace_bytes // (4 * head_dim + 4)
        return self.workspace.data.ptr, self.workspace.data.ptr + plan_layout.workspace_offsets(rows, head_dim)[0]


class FakeKernel:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def launch(self, grid, block, args, *, smem_bytes=0, stream=0) -> None:
        p = args[0]
        self.log.append(("launch", self.name.split("<")[0], stream, {n: p[n].item() for n in p.dtype.names},
                         args[1] if len(args) > 1 else None))  # fmt: skip

    def max_active_blocks(self, block_threads: int, smem_bytes: int = 0) -> int:
        return 1


class FakeCall:
    """``runtime.calls.Call`` on the fake device: device arrays (``Tensor``) pass as they are, anything else is
    imported as the real call would (so ``None`` or a list reads as the same error)."""

    framework, device_id, is_host = "cupy", 0, False

    def __init__(self, stream: int) -> None:
        self.stream = stream

    def tensor(self, x, name):
        return x if isinstance(x, Tensor) else as_tensor(x, name)

    def optional(self, x, name):
        return None if x is None else self.tensor(x, name)

    def empty(self, shape, dtype):
        return cuda(shape, dtype)

    def give(self, t):
        return t


def install(monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """Put the fake GPU in place (see the module docstring); returns ``(log, stream)``."""
    log, stream = [], [7]
    info = device.DeviceInfo(0, "fake", (9, 0), 132, 232448, 233472, 60 << 20, 65536, 2048)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "current_device_id", lambda: 0)
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)
    monkeypatch.setattr(decode_launch, "device_info", lambda device_id=None: info)
    kernel = lambda spec, name_expr, device_id: FakeKernel(log, name_expr)  # noqa: E731
    for mod in (decode_launch, prefill_launch, prefill_wrapper, prefill_sm90, merge):
        monkeypatch.setattr(mod, "get_kernel", kernel)
    # (the Hopper kernel's TMA maps: encoded by the driver, which this machine may not have)
    monkeypatch.setattr(prefill_sm90, "tensor_map", lambda ptr, *a: np.full((), ptr, prefill_sm90.TMA_DESC)[()])
    monkeypatch.setattr(prefill_sm90, "fp8_map", lambda ptr, *a, **kw: np.full((), ptr, prefill_sm90.TMA_DESC)[()])
    monkeypatch.setattr(wrapper, "Buffers", lambda *a: FakeBuffers(log, *a))
    real_begin = calls.begin

    def begin(anchor, name):
        if isinstance(anchor, Tensor) and anchor.is_cuda:
            return FakeCall(stream[0]), anchor
        return real_begin(anchor, name)  # (None, a CPU tensor, ...: the real route's errors)

    monkeypatch.setattr(calls, "begin", begin)
    monkeypatch.setattr(wrapper, "begin", begin)
    for single in (decode_single, prefill_single):
        monkeypatch.setattr(single, "_single_wrappers", {})  # (none of these fakes outlives the test)
    return log, stream
