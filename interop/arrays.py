"""`Tensor`: a caller's array seen through DLPack, and the functions that bring arrays in (`as_tensor`) and out
(`empty`, `wrap`).

Nothing here copies data. Inputs are read from the producer's DLPack capsule (or, for NumPy, from the array itself,
because NumPy's DLPack export refuses bfloat16 and fp8); outputs are allocated in the caller's framework so the user
gets back the kind of array they passed in. torch, JAX and CuPy are imported lazily, only when an array of theirs
is seen, so `import cuinfer.interop` stays light and works where none of them is installed.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import dlpack
from .dtypes import DType, as_dtype

FRAMEWORKS = ("torch", "jax", "cupy", "numpy", "other")
# Top-level module of an array's class -> framework. jax.Array's concrete class lives in jaxlib.
_MODULE_FRAMEWORK = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "cupy": "cupy", "numpy": "numpy"}


@dataclass(frozen=True, eq=False)
class Tensor:
    """A view of a caller's array: where its elements are, how they are laid out, and what keeps them alive.

    ``strides`` are in elements (DLPack's unit), ``ptr`` is the byte address of element 0. ``obj`` is the caller's
    object and ``capsule`` the producer's DLPack capsule; holding them keeps the memory alive for as long as this
    view lives.
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType
    device_type: str  # "cuda" or "cpu"
    device_id: int
    framework: str  # one of FRAMEWORKS
    obj: Any = field(repr=False)
    readonly: bool = False
    capsule: Any = field(default=None, repr=False)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (not of the span a strided view covers)."""
        return self.size * self.dtype.itemsize

    @property
    def is_cuda(self) -> bool:
        return self.device_type == "cuda"

    @property
    def device(self) -> str:
        """``"cuda:0"`` / ``"cpu"``, for messages."""
        return f"cuda:{self.device_id}" if self.is_cuda else "cpu"

    @property
    def byte_strides(self) -> tuple[int, ...]:
        return tuple(s * self.dtype.itemsize for s in self.strides)

    @property
    def last_dim_contiguous(self) -> bool:
        """The last dimension has stride 1 (an empty array, or a length-1 last dimension, has no stride that
        matters: CuPy reports stride 0 for empty arrays)."""
        return self.ndim == 0 or self.shape[-1] <= 1 or self.size == 0 or self.strides[-1] == 1

    @property
    def is_contiguous(self) -> bool:
        """Compact row-major (strides of size-1 dimensions ignored, as torch and NumPy do)."""
        expected = dlpack.compact_strides(self.shape)
        return all(n <= 1 or s == e for n, s, e in zip(self.shape, self.strides, expected, strict=True))

    def reinterpret(self, dtype: Any) -> Tensor:
        """The same bytes read as another dtype of the same size: a CuPy ``uint8`` cache as fp8, for instance.

        CuPy has no fp8 dtype, so fp8 KV caches held in CuPy are ``uint8`` arrays; the caller says what they hold.
        """
        new = as_dtype(dtype)
        if new.itemsize != self.dtype.itemsize:
            raise ValueError(
                f"cannot read a {self.dtype} array as {new}: the element sizes differ "
                f"({self.dtype.itemsize} vs {new.itemsize} bytes); only same-size reinterpretation is a view"
            )
        return replace(self, dtype=new)

    def numpy(self) -> np.ndarray:
        """A zero-copy NumPy view of a host tensor (ml_dtypes for bfloat16 / fp8), keeping this tensor alive."""
        if self.is_cuda:
            raise ValueError(f"numpy() needs a host array but this one is on {self.device}; copy it to the host first")
        if isinstance(self.obj, np.ndarray) and self.obj.dtype == self.dtype.numpy:
            return self.obj
        if self.size == 0:
            return np.empty(self.shape, self.dtype.numpy)
        # NumPy cannot describe ml_dtypes types in __array_interface__: expose raw bytes ("V<n>"), then view them.
        raw = np.asarray(_HostBuffer(self))
        return raw.view(self.dtype.numpy)


class _HostBuffer:
    """Exposes a host `Tensor` through ``__array_interface__``; the array made from it keeps this (and so the
    tensor, its capsule and its owner) alive as its ``base``."""

    def __init__(self, t: Tensor) -> None:
        self.tensor = t
        typestr = "|b1" if t.dtype is DType.BOOL else f"|V{t.dtype.itemsize}"
        self.__array_interface__ = {
            "version": 3,
            "shape": t.shape,
            "typestr": typestr,
            "data": (t.ptr, t.readonly),
            "strides": t.byte_strides,
        }


def framework_of(x: Any) -> str:
    """``"torch"``, ``"jax"``, ``"cupy"``, ``"numpy"`` or ``"other"``, from the modules of the array's classes.

    Subclasses count as their framework (a ``torch.nn.Parameter`` or a user subclass of ``torch.Tensor`` is torch).
    No framework is imported.
    """
    for cls in type(x).__mro__:
        fw = _MODULE_FRAMEWORK.get(cls.__module__.split(".")[0])
        if fw is not None:
            return fw
    return "other"


def _not_an_array(name: str, x: Any) -> ValueError:
    return ValueError(
        f"{name} must be an array (torch.Tensor, jax.Array, cupy.ndarray, numpy.ndarray or any object with "
        f"__dlpack__) but is a {type(x).__name__}; convert it with numpy.asarray({name}) or your framework's asarray"
    )


def as_tensor(x: Any, name: str, *, stream: int | None = None, same_stream_framework: str | None = None) -> Tensor:
    """Import ``x`` without copying.

    ``stream`` is the ``cudaStream_t`` our work will run on; CUDA producers are asked (through
    ``__dlpack__(stream=...)``) to order their pending writes to ``x`` before it. None leaves the producer's default
    (torch: no synchronisation). NumPy arrays are read directly so bfloat16 / fp8 (ml_dtypes) arrays work.

    ``same_stream_framework``: the caller states that ``stream`` is this framework's current stream. For a CUDA
    torch tensor or CuPy array of that framework the DLPack round trip (which would order the stream against
    itself: a no-op) is skipped and the metadata is read from the array directly -- the same pointer, shape and
    strides, in ~2 us instead of ~30 us. This is the hot path of every ``run()``.
    """
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        return _from_numpy(x, name)
    fw = framework_of(x)
    if fw == same_stream_framework:
        fast = _FAST.get(fw)
        t = fast(x) if fast is not None else None
        if t is not None:
            return t
    if not hasattr(x, "__dlpack__"):
        raise _not_an_array(name, x)
    exporter = x
    if fw == "torch" and getattr(x, "requires_grad", False):
        # DLPack refuses tensors that require grad; an inference kernel never needs the graph, and detach() is a view.
        exporter = x.detach()
    dev_type, dev_id = _dlpack_device(x)
    cuda = dev_type is not None and dlpack.DEVICE_KIND.get(dev_type) == "cuda"
    try:
        with _producer_device(fw, dev_id if cuda else None):
            capsule = dlpack.request_capsule(exporter, stream if cuda else None)
    except (BufferError, RuntimeError) as exc:
        raise ValueError(f"{name} could not be exported through DLPack: {exc}") from exc
    try:
        view = dlpack.read_capsule(capsule)
        kind = dlpack.device_kind(view.device_type, view.device_id)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return Tensor(
        ptr=view.ptr,
        shape=view.shape,
        strides=view.strides,
        dtype=view.dtype,
        device_type=kind,
        device_id=view.device_id if kind == "cuda" else 0,
        framework=fw,
        obj=x,
        # JAX arrays are immutable even when their (legacy) capsule does not say so: never write into one.
        readonly=view.read_only or fw == "jax",
        capsule=capsule,
    )


_TORCH_DTYPES: dict[Any, DType] = {}


def _torch_fast(x: Any) -> Tensor | None:
    dev = x.device
    if dev.type != "cuda":
        return None
    dt = _TORCH_DTYPES.get(x.dtype)
    if dt is None:
        try:
            dt = _TORCH_DTYPES[x.dtype] = as_dtype(x.dtype)
        except ValueError:
            return None  # the DLPack path raises the proper error
    return Tensor(int(x.data_ptr()), tuple(x.shape), tuple(x.stride()), dt, "cuda", dev.index, "torch", x)


def _cupy_fast(x: Any) -> Tensor | None:
    try:
        dt = as_dtype(x.dtype)
    except ValueError:
        return None
    item = x.itemsize
    if any(s % item for s in x.strides):
        return None
    return Tensor(int(x.data.ptr), x.shape, tuple(s // item for s in x.strides), dt, "cuda", x.device.id, "cupy", x)


_FAST = {"torch": _torch_fast, "cupy": _cupy_fast}


def _dlpack_device(x: Any) -> tuple[int | None, int]:
    if not hasattr(x, "__dlpack_device__"):
        return None, 0
    dev_type, dev_id = x.__dlpack_device__()
    return int(dev_type), int(dev_id)


def _producer_device(fw: str, device_id: int | None):
    """Make the array's GPU current while it exports: torch refuses to export a tensor of another device, and CuPy
    orders streams on the current device."""
    if device_id is None:
        return contextlib.nullcontext()
    if fw == "torch":
        import torch

        return torch.cuda.device(device_id)
    if fw == "cupy":
        import cupy

        return cupy.cuda.Device(device_id)
    return contextlib.nullcontext()


def _from_numpy(x: np.ndarray, name: str) -> Tensor:
    try:
        dtype = as_dtype(x.dtype)
    except ValueError as exc:
        raise ValueError(f"{name} has dtype {x.dtype} which cuinfer does not handle: {exc}") from None
    if any(s % x.itemsize for s in x.strides):
        raise ValueError(
            f"{name} has byte strides {x.strides} that are not multiples of its itemsize {x.itemsize}; "
            f"pass numpy.ascontiguousarray({name})"
        )
    return Tensor(
        ptr=int(x.__array_interface__["data"][0]),
        shape=tuple(int(n) for n in x.shape),
        strides=tuple(int(s) // x.itemsize for s in x.strides),
        dtype=dtype,
        device_type="cpu",
        device_id=0,
        framework="numpy",
        obj=x,
        readonly=not x.flags.writeable,
    )


def empty(framework: str, shape: tuple[int, ...], dtype: Any, device_id: int | None = None) -> tuple[Any, Tensor]:
    """Allocate an output in the caller's framework; returns ``(user_object, Tensor)``.

    - ``"torch"``: ``torch.empty`` on ``cuda:<device_id>`` (on the CPU when ``device_id`` is None).
    - ``"cupy"`` / ``"other"``: ``cupy.empty`` on the device. CuPy has no fp8 dtype, so an fp8 output is a ``uint8``
      CuPy array that the `Tensor` describes as fp8.
    - ``"jax"``: the buffer is allocated with CuPy and the returned user object is that CuPy array, *not yet* a JAX
      array: call `wrap` after the kernels that write it are enqueued. JAX arrays are immutable and JAX has no public
      stream, so handing the buffer over before our writes would let JAX read it unordered; `wrap` hands it over
      with ``jax.dlpack.from_dlpack``, which makes JAX's stream wait for ours. An fp8 JAX output is a ``uint8``
      buffer that `wrap` reinterprets (``jax.lax.bitcast_convert_type``: JAX makes that an fp8 copy on its stream).
    - ``"numpy"``: ``numpy.empty`` (the CPU reference backend).

    Always finish with ``wrap(tensor, stream=...)`` to get the object to return to the user: it is the identity for
    every framework but JAX.
    """
    dtype = as_dtype(dtype)
    shape = tuple(int(n) for n in shape)
    if framework == "numpy":
        arr = np.empty(shape, dtype.numpy)
        return arr, as_tensor(arr, "out")
    if framework == "torch":
        import torch

        device = torch.device("cpu") if device_id is None else torch.device("cuda", device_id)
        out = torch.empty(shape, dtype=getattr(torch, dtype.value), device=device)
        # a fresh allocation has no pending writes to order against: the direct (non-DLPack) read is exact
        return out, as_tensor(out, "out", same_stream_framework="torch")
    if framework in ("cupy", "jax", "other"):
        if device_id is None:
            raise ValueError(f"empty({framework!r}, ...) allocates on a GPU: pass device_id")
        import cupy

        with cupy.cuda.Device(device_id):
            arr = cupy.empty(shape, dtype=np.uint8 if dtype.is_float8 else dtype.numpy)
        t = Tensor(
            ptr=int(arr.data.ptr),
            shape=shape,
            strides=tuple(int(s) // dtype.itemsize for s in arr.strides),
            dtype=dtype,
            device_type="cuda",
            device_id=device_id,
            framework="jax" if framework == "jax" else "cupy",
            obj=arr,
        )
        return arr, t
    raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)} but is {framework!r}")


def wrap(t: Tensor, *, stream: int | None = None) -> Any:
    """The object to give back to the user for an output made by `empty`, once its writes are enqueued on ``stream``.

    The identity (``t.obj``) except for JAX, where the CuPy buffer is handed to ``jax.dlpack.from_dlpack`` inside a
    CuPy stream context for ``stream``: JAX then asks CuPy for the capsule with JAX's own stream, and CuPy makes that
    stream wait for ``stream``. Zero copy: JAX keeps CuPy's DLPack deleter, which holds the CuPy memory until the JAX
    array dies.
    """
    if t.framework != "jax" or framework_of(t.obj) == "jax":
        return t.obj
    import jax.dlpack

    from .streams import stream_context

    ctx = stream_context(stream, t.device_id) if stream is not None else contextlib.nullcontext()
    with ctx:
        arr = jax.dlpack.from_dlpack(t.obj)
    if t.dtype.is_float8:  # (CuPy allocated uint8 bytes: JAX sees them as its fp8 type)
        import jax.numpy as jnp

        arr = jax.lax.bitcast_convert_type(arr, getattr(jnp, t.dtype.value))
    return arr
