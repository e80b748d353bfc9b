"""The plan's trip to the GPU: two pinned host buffers, one device buffer, one asynchronous copy per ``plan()``.

``plan()`` packs the ``WorkPlan`` into a pinned int32 buffer (``planner.pack``) and copies it to a device buffer of
the same ``PlanLayout`` with one ``cudaMemcpyAsync`` on the caller's stream. The device buffer never moves, so a
``run()`` captured in a CUDA graph keeps pointing at the live plan; counts come from the header, not from pointers.

Why two host buffers: the copy reads the pinned buffer asynchronously, so the next ``plan()`` must not overwrite it
until that copy has finished. Packing into the *other* buffer lets a plan be prepared while the previous copy is in
flight; a CUDA event recorded after each copy tells whether the buffer about to be reused is free, and we wait only
when it is not (two ``plan()`` calls in a row with the GPU behind).

The copy runs on the stream the kernels run on: stream order then guarantees that kernels launched before see the
old plan and kernels launched after see the new one.
"""

from __future__ import annotations

import numpy as np

from cuinfer.planner import PlanLayout, WorkPlan, pack, used_words


class PlanBuffer:
    """Pinned host staging (double buffered) and the fixed device copy of plans laid out by ``layout``."""

    def __init__(self, layout: PlanLayout, device_id: int | None = None) -> None:
        import cupy
        import cupyx

        self.layout = layout
        self._cupy = cupy
        with cupy.cuda.Device(device_id):
            self._host = [cupyx.empty_pinned((layout.total_words,), dtype=np.int32) for _ in range(2)]
            for h in self._host:
                h.fill(0)
            # An event per host buffer, recorded after the copy that last read it (None: never used).
            self._events: list = [None, None]
            self.device = cupy.zeros((layout.total_words,), dtype=cupy.int32)
        self._next = 0
        self.generation = 0

    @property
    def device_ptr(self) -> int:
        """Address of the device copy (int32 words at ``layout.offsets``); fixed for the buffer's lifetime."""
        return int(self.device.data.ptr)

    def upload(self, plan: WorkPlan, stream: int) -> np.ndarray:
        """Pack ``plan`` into the free pinned buffer and copy it to the device on ``stream`` (a ``cudaStream_t``).

        Returns the pinned host copy (read-only use: it is reused two ``upload`` calls later).
        """
        rt = self._cupy.cuda.runtime
        i = self._next
        event = self._events[i]
        if event is not None and not event.done:
            event.synchronize()  # the copy that read this buffer two plans ago is still running
        host = self._host[i]
        self.generation += 1
        pack(plan, self.layout, host, generation=self.generation & 0x7FFFFFFF)
        nbytes = 4 * used_words(plan, self.layout)  # header up to the end of the last array in use
        rt.memcpyAsync(self.device_ptr, host.ctypes.data, nbytes, rt.memcpyHostToDevice, int(stream))
        if event is None:
            event = self._cupy.cuda.Event(block=False, disable_timing=True)
            self._events[i] = event
        rt.eventRecord(event.ptr, int(stream))
        self._next = 1 - i
        return host
