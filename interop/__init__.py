"""DLPack import/export, streams and validation at the public boundary.

`as_tensor` reads any DLPack array (torch, JAX, CuPy, NumPy, fp8 included) into a `Tensor` without copying; `empty`
and `wrap` make outputs in the caller's framework; `current_stream` picks the caller's stream; `validate` holds the
checks that turn bad input into a ``ValueError`` naming the argument, the rule and the fix. torch, JAX and CuPy are
imported lazily, inside the functions that meet their arrays.
"""

from .arrays import FRAMEWORKS, Tensor, as_tensor, empty, framework_of, wrap
from .dtypes import DType, as_dtype
from .streams import cupy_stream, current_stream, stream_context
from .validate import (
    check_cuda,
    check_dtype,
    check_index_array,
    check_indptr,
    check_last_dim_contiguous,
    check_ndim,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_writable,
)

__all__ = [
    "FRAMEWORKS",
    "DType",
    "Tensor",
    "as_dtype",
    "as_tensor",
    "check_cuda",
    "check_dtype",
    "check_index_array",
    "check_indptr",
    "check_last_dim_contiguous",
    "check_ndim",
    "check_same_device",
    "check_same_dtype",
    "check_shape",
    "check_writable",
    "cupy_stream",
    "current_stream",
    "empty",
    "framework_of",
    "stream_context",
    "wrap",
]
