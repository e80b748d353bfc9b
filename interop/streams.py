"""Which CUDA stream work goes on: the caller's current stream, in the caller's framework.

- torch inputs: ``torch.cuda.current_stream(device)`` -- so ``with torch.cuda.stream(s):`` around a call works as torch
  users expect, and torch's caching allocator sees the same stream its tensors were made on.
- CuPy inputs: ``cupy.cuda.get_current_stream(device)`` (``with cupy.cuda.Stream():`` works the same way).
- JAX and anything else: CuPy's current stream. JAX exposes no public "current stream"; instead its arrays are
  ordered through DLPack: `as_tensor(x, name, stream=ptr)` calls ``x.__dlpack__(stream=ptr)``, which makes ``ptr``
  wait until JAX has finished writing ``x``, and `arrays.wrap` hands outputs back so that JAX waits for ``ptr``.

Stream handles are plain ints (``cudaStream_t``): 0 is the legacy default stream, as CuPy and torch report it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def current_stream(framework: str, device_id: int) -> int:
    """The ``cudaStream_t`` (as an int) that work for arrays of ``framework`` on ``device_id`` is enqueued on."""
    if framework == "numpy":
        raise ValueError(
            "NumPy arrays run on the CPU reference backend, which has no CUDA stream; pass GPU arrays to run on a GPU"
        )
    if framework == "torch":
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # ~0.3 us; the public path takes ~5 us
        if raw is not None:
            return int(raw(device_id))
        return int(torch.cuda.current_stream(device_id).cuda_stream)
    import cupy

    return int(cupy.cuda.get_current_stream(device_id).ptr)


class _StreamHandle:
    """A raw stream handle in the CUDA stream protocol (``__cuda_stream__``), for ``cupy.cuda.Stream.from_external``."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def cupy_stream(ptr: int, device_id: int | None = None) -> Any:
    """A ``cupy.cuda.Stream`` for a raw handle (not owned: CuPy will not destroy it)."""
    import cupy

    if ptr in (0, 1):  # 0: what torch / CuPy report for the null stream; 1: its DLPack spelling
        return cupy.cuda.Stream.null
    if ptr == 2:  # cudaStreamPerThread
        return cupy.cuda.Stream.ptds
    if hasattr(cupy.cuda.Stream, "from_external"):  # CuPy >= 14; ExternalStream is deprecated there
        return cupy.cuda.Stream.from_external(_StreamHandle(ptr))
    return cupy.cuda.ExternalStream(ptr, -1 if device_id is None else device_id)


@contextlib.contextmanager
def stream_context(ptr: int, device_id: int | None = None) -> Iterator[Any]:
    """Make ``ptr`` CuPy's current stream (on ``device_id``'s device) for the block; yields the CuPy stream.

    CuPy operations inside (copies, ``cupy.empty`` allocations, DLPack exports) are then ordered on ``ptr``. When
    ``ptr`` already is CuPy's current stream nothing changes.
    """
    import cupy

    device = cupy.cuda.Device(device_id) if device_id is not None else contextlib.nullcontext()
    with device:
        current = cupy.cuda.get_current_stream()
        if int(current.ptr) == int(ptr) or (ptr in (0, 1) and int(current.ptr) == 0):
            yield current
            return
        with cupy_stream(ptr, device_id) as stream:
            yield stream
