"""The shape of every public GPU call: import the caller's arrays without copies on the caller's stream, allocate
outputs in the caller's framework, hand them back. NumPy inputs go to the CPU reference instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cuinfer.interop import arrays, streams
from cuinfer.interop.arrays import Tensor


def is_host(x: Any) -> bool:
    """NumPy arrays (and Python sequences) run on the CPU reference backend."""
    return isinstance(x, (np.ndarray, list, tuple))


@dataclass
class Call:
    """Where one public call runs: the anchor array's framework and device, and the stream work is enqueued on."""

    framework: str
    device_id: int
    stream: int

    def tensor(self, x: Any, name: str) -> Tensor:
        """Import another input of this call (ordered on this call's stream, no copy)."""
        return arrays.as_tensor(x, name, stream=self.stream)

    def optional(self, x: Any, name: str) -> Tensor | None:
        return None if x is None else self.tensor(x, name)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Tensor:
        return arrays.empty(self.framework, shape, dtype, self.device_id)[1]

    def give(self, t: Tensor) -> Any:
        """The object to return to the user for an output written on this call's stream."""
        return arrays.wrap(t, stream=self.stream)


def begin(anchor: Any, name: str) -> tuple[Call, Tensor]:
    """Start a GPU call from its main input (``q`` or ``o``): framework, device and stream all come from it."""
    from cuinfer.device import require_gpu

    require_gpu()
    fw = arrays.framework_of(anchor)
    probe = arrays.as_tensor(anchor, name)
    if not probe.is_cuda:
        raise ValueError(
            f"{name} is on {probe.device} but GPU calls need CUDA arrays; move it to the GPU, or pass NumPy arrays "
            "to run on the CPU reference backend"
        )
    stream = streams.current_stream(fw, probe.device_id)
    call = Call(fw, probe.device_id, stream)
    return call, call.tensor(anchor, name)
