"""Input checks shared by the CPU reference backend (`cuinfer.reference`).

The reference is the oracle of every GPU test, so it converts everything to float64 / int64 up front and rejects
malformed inputs loudly instead of guessing: a silently wrong oracle would make wrong kernels pass.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def as_f64(x: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """`x` as a float64 NumPy array (bfloat16 / float8 from ml_dtypes included), checking its rank."""
    a = np.asarray(x)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D but has shape {a.shape}; pass a {ndim}-D array")
    if a.dtype.kind in "bUSOMm":
        raise ValueError(f"{name} must hold floating-point values but has dtype {a.dtype}")
    # ml_dtypes' bfloat16 / float8_e4m3fn report kind "V"; they cast to float64, a structured or object array does not
    try:
        return a.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must hold floating-point values but has dtype {a.dtype}") from None


def as_index(x: Any, name: str) -> np.ndarray:
    """A 1-D integer index array (list, NumPy, host tensor) as int64."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D but has shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        if a.dtype.kind == "f" and np.all(a == np.round(a)):
            return a.astype(np.int64)
        raise ValueError(f"{name} must hold integers but has dtype {a.dtype}")
    return a.astype(np.int64)


def as_indptr(x: Any, name: str, total: int | None = None) -> np.ndarray:
    """A CSR index pointer: 1-D, at least one entry, non-negative and non-decreasing, ending at or before `total`."""
    a = as_index(x, name)
    if a.size == 0:
        raise ValueError(f"{name} must have batch_size + 1 >= 1 entries but is empty")
    if a[0] < 0 or np.any(np.diff(a) < 0):
        raise ValueError(f"{name} must be non-negative and non-decreasing but is {a.tolist()[:16]}")
    if total is not None and a[-1] > total:
        raise ValueError(f"{name}[-1] = {int(a[-1])} points past the end of an array of {total} rows")
    return a


def as_bool_mask(x: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A boolean mask of exactly `shape` (nonzero = True = keep)."""
    a = np.asarray(x)
    if a.shape != shape:
        raise ValueError(
            f"{name} must have shape {shape} but has shape {a.shape}; pass one bool per (query, key) pair, "
            f"True = keep (packed bits go through unpack_custom_mask first)"
        )
    return a.astype(bool) if a.dtype != bool else a


def check_rope_dims(head_dim: int, rotary_dim: int | None) -> int:
    """The rotary dimension (default: the full head dim); it must be even and at most head_dim."""
    r = head_dim if rotary_dim is None else int(rotary_dim)
    if r <= 0 or r % 2 or r > head_dim:
        raise ValueError(
            f"rotary_dim must be even and in [2, head_dim={head_dim}] but is {rotary_dim}; "
            f"pass None for the full head dim"
        )
    return r


def memory_limit() -> int:
    """Bytes the CPU reference may allocate for one call: half this machine's physical memory (16 GiB where that is
    not known)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def check_memory(need: int, what: str) -> None:
    """Refuse, before allocating anything large, a call whose float64 temporaries would not fit ``memory_limit()``:
    a clear ValueError with the size instead of a MemoryError (or the machine swapping) half-way through."""
    limit = memory_limit()
    if need > limit:
        raise ValueError(
            f"the CPU reference backend would need about {need / 2**30:.1f} GiB of memory for {what} but may use "
            f"{limit / 2**30:.1f} GiB (half this machine's memory); run it on a GPU, or split the batch"
        )
