"""The closed set of element types cuinfer handles, and how every framework spells them.

One table (`_INFO`) gives each `DType` its size, the C++ type the kernels use, its NumPy / ml_dtypes dtype and its
DLPack code; everything else (name parsing, DLPack decoding, the NumPy mapping) is derived from it. NumPy has no
bfloat16 or fp8, so those come from `ml_dtypes` (what JAX and CuPy use too).

`as_dtype` never imports torch or JAX: a torch dtype is recognised by its type's module and parsed from its ``str``
(``"torch.bfloat16"``); a JAX dtype is a NumPy / ml_dtypes dtype or scalar type already.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    """An element type. The value is the canonical name (the same in NumPy / ml_dtypes, torch and JAX)."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    FLOAT8_E4M3FN = "float8_e4m3fn"
    FLOAT8_E5M2 = "float8_e5m2"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    INT8 = "int8"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return _INFO[self].itemsize

    @property
    def ctype(self) -> str:
        """The C++ type kernels use for this element (`kernel_src/common/types.cuh` and the CUDA fp headers)."""
        return _INFO[self].ctype

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype (ml_dtypes for bfloat16 and fp8)."""
        return _INFO[self].numpy

    @property
    def dlpack(self) -> tuple[int, int]:
        """DLPack ``(type code, bits)`` (DLPack 1.1 codes: bfloat 4, bool 6, float8_e4m3fn 10, float8_e5m2 12)."""
        return _INFO[self].dlpack

    @property
    def short(self) -> str:
        """Short tag for kernel and cache names: ``f16``, ``bf16``, ``e4m3``, ..."""
        return _INFO[self].short

    @property
    def is_float8(self) -> bool:
        return self in (DType.FLOAT8_E4M3FN, DType.FLOAT8_E5M2)

    @property
    def is_float(self) -> bool:
        return self.dlpack[0] in (_DL_FLOAT, _DL_BFLOAT) or self.is_float8

    def __str__(self) -> str:
        return self.value


class _Info(NamedTuple):
    itemsize: int
    ctype: str
    numpy: np.dtype
    dlpack: tuple[int, int]
    short: str


# DLPack type codes (dlpack.h 1.1, DLDataTypeCode).
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_BOOL = 0, 1, 2, 4, 6
_DL_FLOAT8_E4M3FN, _DL_FLOAT8_E5M2 = 10, 12

_INFO: dict[DType, _Info] = {
    DType.FLOAT16: _Info(2, "half", np.dtype(np.float16), (_DL_FLOAT, 16), "f16"),
    DType.BFLOAT16: _Info(2, "__nv_bfloat16", np.dtype(ml_dtypes.bfloat16), (_DL_BFLOAT, 16), "bf16"),
    DType.FLOAT32: _Info(4, "float", np.dtype(np.float32), (_DL_FLOAT, 32), "f32"),
    DType.FLOAT64: _Info(8, "double", np.dtype(np.float64), (_DL_FLOAT, 64), "f64"),
    DType.FLOAT8_E4M3FN: _Info(1, "__nv_fp8_e4m3", np.dtype(ml_dtypes.float8_e4m3fn), (_DL_FLOAT8_E4M3FN, 8), "e4m3"),
    DType.FLOAT8_E5M2: _Info(1, "__nv_fp8_e5m2", np.dtype(ml_dtypes.float8_e5m2), (_DL_FLOAT8_E5M2, 8), "e5m2"),
    DType.INT32: _Info(4, "int", np.dtype(np.int32), (_DL_INT, 32), "i32"),
    DType.INT64: _Info(8, "long long", np.dtype(np.int64), (_DL_INT, 64), "i64"),
    DType.UINT8: _Info(1, "unsigned char", np.dtype(np.uint8), (_DL_UINT, 8), "u8"),
    DType.INT8: _Info(1, "signed char", np.dtype(np.int8), (_DL_INT, 8), "i8"),
    DType.BOOL: _Info(1, "bool", np.dtype(np.bool_), (_DL_BOOL, 8), "bool"),
}

# Spellings accepted besides the canonical names. "float" / "double" are left out on purpose: NumPy reads "float" as
# float64 and torch as float32, so either answer would surprise someone. "float8_e4m3" (no "fn") is a different
# format in ml_dtypes and JAX (IEEE-like, with inf), so it is refused; the CUDA-style "e4m3" / "fp8_e4m3" mean the
# finite-only format (`__nv_fp8_e4m3` is e4m3fn) and are accepted.
_ALIASES: dict[str, DType] = {
    "half": DType.FLOAT16,
    "fp16": DType.FLOAT16,
    "f16": DType.FLOAT16,
    "bf16": DType.BFLOAT16,
    "fp32": DType.FLOAT32,
    "f32": DType.FLOAT32,
    "fp64": DType.FLOAT64,
    "f64": DType.FLOAT64,
    "fp8_e4m3fn": DType.FLOAT8_E4M3FN,
    "e4m3fn": DType.FLOAT8_E4M3FN,
    "e4m3": DType.FLOAT8_E4M3FN,
    "fp8_e4m3": DType.FLOAT8_E4M3FN,
    "fp8_e5m2": DType.FLOAT8_E5M2,
    "e5m2": DType.FLOAT8_E5M2,
    "i32": DType.INT32,
    "i64": DType.INT64,
    "u8": DType.UINT8,
    "i8": DType.INT8,
    "bool_": DType.BOOL,
}
_BY_NAME: dict[str, DType] = {**{d.value: d for d in DType}, **_ALIASES}
_BY_NUMPY: dict[np.dtype, DType] = {info.numpy: d for d, info in _INFO.items()}
_BY_DLPACK: dict[tuple[int, int], DType] = {info.dlpack: d for d, info in _INFO.items()}
# Module prefixes stripped from names such as "torch.bfloat16" (what str() of a torch dtype gives) or "jnp.float16".
_PREFIXES = ("torch.", "numpy.", "np.", "jax.numpy.", "jnp.", "ml_dtypes.", "cupy.", "cp.")


def accepted_names() -> str:
    """The canonical names, for error messages."""
    return ", ".join(d.value for d in DType)


def _unknown(x: Any, why: str = "") -> ValueError:
    return ValueError(
        f"unknown dtype {x!r} (a {type(x).__name__}){why}; pass one of {accepted_names()}, "
        "or a NumPy / ml_dtypes, torch or JAX dtype of one of them"
    )


def _from_name(name: str) -> DType:
    key = name.strip().lower()
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    try:
        return _BY_NAME[key]
    except KeyError:
        raise _unknown(name) from None


def as_dtype(x: Any) -> DType:
    """Parse a dtype given as a `DType`, a name, a NumPy / ml_dtypes dtype or scalar type, a torch dtype or a JAX dtype.

    Raises ValueError listing the accepted names for anything else (including complex and the integer widths the
    kernels do not use).
    """
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        return _from_name(x)
    # torch.dtype: recognised by module so torch is never imported here; its str() is "torch.<name>".
    if type(x).__module__.split(".")[0] == "torch":
        return _from_name(str(x))
    try:
        np_dtype = np.dtype(x)
    except (TypeError, ValueError):
        raise _unknown(x) from None
    try:
        return _BY_NUMPY[np_dtype]
    except KeyError:
        why = " in non-native byte order" if not np_dtype.isnative else ""
        raise _unknown(x, why) from None


def from_dlpack_code(code: int, bits: int, lanes: int = 1) -> DType:
    """The `DType` of a DLPack ``DLDataType``; ValueError for vector lanes or codes cuinfer does not handle."""
    if lanes != 1:
        raise ValueError(f"DLPack dtype has {lanes} lanes but cuinfer only reads scalar elements (lanes=1)")
    try:
        return _BY_DLPACK[(code, bits)]
    except KeyError:
        raise ValueError(
            f"DLPack dtype (code={code}, bits={bits}) is not one cuinfer handles; supported: {accepted_names()}"
        ) from None
