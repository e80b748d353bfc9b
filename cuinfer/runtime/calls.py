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
    # run()'s variant arrays, checked: {(variant, param): Tensor} (cuinfer/variants/arrays.py); None without any
    variant_arrays: dict | None = None

    def tensor(self, x: Any, name: str) -> Tensor:
        """Import another input of this call (ordered on this call's stream, no copy)."""
        return arrays.as_tensor(x, name, stream=self.stream, same_stream_framework=self.framework)

    def optional(self, x: Any, name: str) -> Tensor | None:
        return None if x is None else self.tensor(x, name)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Tensor:
        return arrays.empty(self.framework, shape, dtype, self.device_id)[1]

    def give(self, t: Tensor) -> Any:
        """The object to return to the user for an output written on this call's stream."""
        return arrays.wrap(t, stream=self.stream)


def begin(anchor: Any, name: str) -> tuple[Call, Tensor]:
    """Start a GPU call from its main input (``q`` or ``o``): framework, device and stream all come from it.

    The stream is found before the array is exported: a DLPack export without a stream would order the producer's
    stream against the legacy default stream, which is illegal while the caller captures a CUDA graph.
    """
    from cuinfer.interop import dlpack
    from cuinfer.runtime.device import require_gpu

    require_gpu()
    fw = arrays.framework_of(anchor)
    if not hasattr(anchor, "__dlpack_device__"):
        arrays.as_tensor(anchor, name)  # raises the "must be an array" error
    dev_type, dev_id = (int(x) for x in anchor.__dlpack_device__())
    if dlpack.DEVICE_KIND.get(dev_type) != "cuda":
        raise ValueError(
            f"{name} is on the CPU but GPU calls need CUDA arrays; move it to the GPU, or pass NumPy arrays "
            "to run on the CPU reference backend"
        )
    call = Call(fw, dev_id, streams.current_stream(fw, dev_id))
    return call, call.tensor(anchor, name)
