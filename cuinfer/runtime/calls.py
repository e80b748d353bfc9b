"""The shape of every public call: import the caller's arrays without copies on the caller's stream, allocate
outputs in the caller's framework, hand them back. NumPy inputs take the same path to the CPU reference instead
(``HOST``): the same checks, in the same order, with the same messages; only the GPU's 16-byte alignment rule and
the launch are left out."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuinfer.interop import arrays, streams
from cuinfer.interop.arrays import Tensor


def is_host(x: Any) -> bool:
    """NumPy arrays (and Python sequences) run on the CPU reference backend."""
    return isinstance(x, (np.ndarray, list, tuple))


# JAX inputs of finished calls, kept alive until the stream has run past the call's work: [(event, tensors)].
_KEPT: deque = deque()


def _record_event(stream: int, device_id: int) -> Any:
    """A CUDA event recorded on ``stream`` now (``.done`` once the stream has passed it); None while the stream is
    being captured into a CUDA graph (nothing runs now; the graph's replays are the caller's to order)."""
    import cupy

    with cupy.cuda.Device(device_id):
        if stream not in (0, 1, 2) and cupy.cuda.runtime.streamIsCapturing(stream):
            return None
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(streams.cupy_stream(stream, device_id))
    return event


def _release_finished() -> None:
    while _KEPT and _KEPT[0][0].done:
        _KEPT.popleft()


@dataclass
class Call:
    """Where one public call runs: the anchor array's framework and device, and the stream work is enqueued on.

    JAX inputs are the one kind whose memory is not ordered on this stream: JAX frees a buffer as soon as its last
    reference (the user's array, or the DLPack capsule we hold) goes, and may hand the memory to its next
    allocation, written on JAX's own streams, while our kernels still read it. So the call holds them
    (``_held``), and when it ends (the object is dropped after the public function returns) it records an event on
    its stream and keeps them until the event is done; finished entries are released at the end of later calls."""

    framework: str
    device_id: int
    stream: int
    is_host = False  # (class constant: HostCall's is True)
    # run()'s variant arrays, checked: {(variant, param): Tensor} (cuinfer/variants/arrays.py); None without any
    variant_arrays: dict | None = None
    _held: list = field(default_factory=list, repr=False, compare=False)

    def tensor(self, x: Any, name: str) -> Tensor:
        """Import another input of this call (ordered on this call's stream, no copy)."""
        t = arrays.as_tensor(x, name, stream=self.stream, same_stream_framework=self.framework)
        if t.framework == "jax" and t.device_type == "cuda":
            self._held.append(t)
        return t

    def __del__(self) -> None:
        held, self._held = self._held, []
        if not held:
            return
        try:
            event = _record_event(self.stream, self.device_id)
        except Exception:  # interpreter shutdown, or no CUDA: nothing is running that could read them
            return
        if event is not None:
            _KEPT.append((event, held))
        _release_finished()

    def optional(self, x: Any, name: str) -> Tensor | None:
        return None if x is None else self.tensor(x, name)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Tensor:
        return arrays.empty(self.framework, shape, dtype, self.device_id)[1]

    def give(self, t: Tensor) -> Any:
        """The object to return to the user for an output written on this call's stream."""
        return arrays.wrap(t, stream=self.stream)


class HostCall:
    """A call on the CPU reference backend (NumPy arrays in and out; no GPU is touched). It quacks like ``Call`` so
    that both routes share their checks: ``tensor`` imports an input (a device array among NumPy inputs is imported
    too, so that the same-device check names it), ``empty`` allocates a NumPy output."""

    framework = "numpy"
    device_id = None
    stream = None
    is_host = True

    def tensor(self, x: Any, name: str) -> Tensor:
        return arrays.as_tensor(x, name)

    def optional(self, x: Any, name: str) -> Tensor | None:
        return None if x is None else self.tensor(x, name)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Tensor:
        return arrays.empty("numpy", shape, dtype)[1]

    def give(self, t: Tensor) -> Any:
        return t.obj


HOST = HostCall()


def start(anchor: Any, name: str) -> tuple[Call | HostCall, Tensor]:
    """The route of a public call from its main input (``q``, ``o``, ``o_a``): the CPU reference (``HOST``) for NumPy
    arrays, else ``begin``'s GPU call."""
    if is_host(anchor):
        return HOST, arrays.as_tensor(anchor, name)
    return begin(anchor, name)


def begin(anchor: Any, name: str) -> tuple[Call, Tensor]:
    """Start a GPU call from its main input (``q`` or ``o``): framework, device and stream all come from it.

    What is not an array, or not on a GPU, is refused as such before the GPU is looked for (so ``None`` or a CPU
    tensor on a machine without a GPU reads as the mistake it is, not as ``NoGPUError``). The stream is found before
    the array is exported: a DLPack export without a stream would order the producer's stream against the legacy
    default stream, which is illegal while the caller captures a CUDA graph.
    """
    from cuinfer.interop import dlpack
    from cuinfer.runtime.device import require_gpu

    if not hasattr(anchor, "__dlpack_device__"):
        arrays.as_tensor(anchor, name)  # raises the "must be an array" error
        raise ValueError(
            f"{name} has __dlpack__ but no __dlpack_device__, so where it lives is unknown; pass a torch, JAX, CuPy "
            "or NumPy array"
        )
    dev_type, dev_id = (int(x) for x in anchor.__dlpack_device__())
    if dlpack.DEVICE_KIND.get(dev_type) != "cuda":
        raise ValueError(
            f"{name} is on the CPU but GPU calls need CUDA arrays; move it to the GPU, or pass NumPy arrays "
            "to run on the CPU reference backend"
        )
    require_gpu()
    fw = arrays.framework_of(anchor)
    call = Call(fw, dev_id, streams.current_stream(fw, dev_id))
    return call, call.tensor(anchor, name)
