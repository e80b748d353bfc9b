"""DLPack capsules read with ctypes: the C structs of dlpack.h (0.x legacy and 1.x versioned) and a capsule reader.

We read the capsule ourselves instead of going through a framework's ``from_dlpack`` because no single framework
imports everything we need: CuPy rejects fp8, NumPy rejects bfloat16 and fp8, and torch or JAX may not be installed.

Lifetime: a consumer may "consume" a capsule (rename it ``used_dltensor`` and call the deleter itself later). We do not:
the capsule keeps its producer name, so its own destructor calls the producer's deleter when the capsule is garbage
collected. Whoever holds the capsule (the `Tensor`) therefore keeps the memory alive, and dropping it frees it -- no
copy, no leak, and no deleter bookkeeping of ours.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from .dtypes import DType, from_dlpack_code

# dlpack.h DLDeviceType values.
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_OPENCL, DL_VULKAN, DL_METAL, DL_VPI, DL_ROCM = 1, 2, 3, 4, 7, 8, 9, 10
DL_ROCM_HOST, DL_EXT_DEV, DL_CUDA_MANAGED, DL_ONEAPI = 11, 12, 13, 14

# Host-visible kinds read as "cpu", device-visible CUDA kinds as "cuda". Pinned host memory (CUDA_HOST) is host memory
# to us (the CPU reference reads it; kernels must not be handed it as a device array); managed memory is a valid device
# pointer.
DEVICE_KIND = {DL_CPU: "cpu", DL_CUDA_HOST: "cpu", DL_CUDA: "cuda", DL_CUDA_MANAGED: "cuda"}
_DEVICE_NAMES = {
    DL_OPENCL: "OpenCL",
    DL_VULKAN: "Vulkan",
    DL_METAL: "Metal",
    DL_VPI: "VPI",
    DL_ROCM: "ROCm",
    DL_ROCM_HOST: "ROCm host",
    DL_EXT_DEV: "an extension device",
    DL_ONEAPI: "oneAPI",
}

# DLManagedTensorVersioned.flags bits (DLPack 1.0+).
FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1
FLAG_IS_SUBBYTE_TYPE_PADDED = 1 << 2

LEGACY_NAME = b"dltensor"
VERSIONED_NAME = b"dltensor_versioned"
# The highest DLPack version we read: 1.1 is the release that added the fp8 type codes.
MAX_VERSION = (1, 1)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # NULL = compact row-major (allowed before 1.0 only)
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]


# A private handle on the Python C API, so setting argtypes here never changes ctypes.pythonapi for anyone else.
_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class CapsuleView:
    """What a DLPack capsule describes. ``ptr`` already includes ``byte_offset``; strides are in elements."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType
    device_type: int  # DLDeviceType
    device_id: int
    read_only: bool
    is_copied: bool
    version: tuple[int, int] | None  # None for a legacy (unversioned) capsule


def capsule_name(capsule: Any) -> bytes | None:
    if type(capsule).__name__ != "PyCapsule":
        return None
    return _api.PyCapsule_GetName(capsule)


def compact_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (elements) of a compact array of this shape."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def device_kind(device_type: int, device_id: int) -> str:
    """``"cuda"`` or ``"cpu"`` for a DLPack device type; ValueError for devices cuinfer cannot use."""
    try:
        return DEVICE_KIND[int(device_type)]
    except KeyError:
        where = _DEVICE_NAMES.get(int(device_type), f"DLPack device type {int(device_type)}")
        raise ValueError(
            f"the array is on {where} (device {device_id}) but cuinfer runs on CUDA GPUs and on the CPU; "
            "move it to a CUDA device or to host memory"
        ) from None


def read_capsule(capsule: Any) -> CapsuleView:
    """Read a ``"dltensor"`` or ``"dltensor_versioned"`` capsule without consuming it (see the module docstring)."""
    name = capsule_name(capsule)
    if name == VERSIONED_NAME:
        managed = DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(capsule, VERSIONED_NAME))
        version = (int(managed.version.major), int(managed.version.minor))
        if version[0] != MAX_VERSION[0]:
            # A new major version may change the struct layout: reading it as 1.x would be reading garbage.
            raise ValueError(
                f"DLPack capsule has version {version[0]}.{version[1]} but cuinfer reads DLPack 1.x; "
                "ask the producer for max_version=(1, 1)"
            )
        flags = int(managed.flags)
        return _view(managed.dl_tensor, bool(flags & FLAG_READ_ONLY), bool(flags & FLAG_IS_COPIED), version)
    if name == LEGACY_NAME:
        managed = DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, LEGACY_NAME))
        return _view(managed.dl_tensor, False, False, None)
    if name is not None and name.startswith(b"used_"):
        raise ValueError(f"DLPack capsule {name.decode()!r} was already consumed; call __dlpack__() again")
    raise ValueError(
        f"expected a DLPack capsule named 'dltensor' or 'dltensor_versioned' but got {type(capsule).__name__}"
        + (f" named {name.decode()!r}" if name else "")
    )


def _view(t: DLTensor, read_only: bool, is_copied: bool, version: tuple[int, int] | None) -> CapsuleView:
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    strides = tuple(int(t.strides[i]) for i in range(ndim)) if t.strides else compact_strides(shape)
    dtype = from_dlpack_code(int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes))
    return CapsuleView(
        ptr=int(t.data or 0) + int(t.byte_offset),
        shape=shape,
        strides=strides,
        dtype=dtype,
        device_type=int(t.device.device_type),
        device_id=int(t.device.device_id),
        read_only=read_only,
        is_copied=is_copied,
        version=version,
    )


def request_capsule(obj: Any, stream: int | None = None) -> Any:
    """``obj.__dlpack__`` asking for a versioned capsule, falling back to the legacy call for older producers.

    ``stream`` (a consumer ``cudaStream_t``, or None to leave the producer's default) is passed only for CUDA arrays:
    the producer then orders its pending writes before work we enqueue on that stream. CPU producers (NumPy) refuse
    any stream other than None.
    """
    kwargs: dict[str, Any] = {}
    if stream is not None:
        kwargs["stream"] = consumer_stream_arg(stream)
    try:
        return obj.__dlpack__(max_version=MAX_VERSION, **kwargs)
    except TypeError:
        # Producers written before DLPack 1.0 take no max_version keyword; they export legacy capsules.
        return obj.__dlpack__(**kwargs)


def consumer_stream_arg(stream: int) -> int:
    """The ``stream=`` value for ``__dlpack__``: the array API reserves 0 (ambiguous), 1 is the legacy default.

    CuPy's and torch's null stream has handle 0, which ``__dlpack__`` refuses; the legacy default stream is spelt 1.
    """
    return 1 if stream == 0 else int(stream)
