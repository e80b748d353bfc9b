"""The checked view of the cache a wrapper's run() parsed last, reused while the caller passes the same cache object.

A serving loop passes one cache every step, and parsing and checking it again costs ~20 us of host time.
"""

from __future__ import annotations

from typing import Any


def cache_fingerprint(x: Any, framework: str) -> tuple | None:
    """(pointer, shape, strides) of a torch / CuPy cache of the caller's framework, or None (no reuse)."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            return None
        a, b = cache_fingerprint(x[0], framework), cache_fingerprint(x[1], framework)
        return None if a is None or b is None else (a, b)
    fw = type(x).__module__.split(".")[0]
    if fw != framework:
        return None
    if fw == "torch":
        return (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype)
    if fw == "cupy":
        return (x.data.ptr, x.shape, x.strides, x.dtype)
    return None


class CacheViews:
    """The checked view of the last cache a wrapper's run() parsed, reused while the same torch / CuPy cache object
    (of the caller's framework, same pointer, shape, strides and dtype) comes back with the same plan: a serving loop
    passes one cache every step, and parsing and checking it again costs ~20 us of host time."""

    __slots__ = ("_entry",)

    def __init__(self) -> None:
        self._entry: tuple | None = None  # (cache object, fingerprint, plan, view)

    def view(self, cache: Any, call: Any, plan: Any, build: Any) -> Any:
        """The view of ``cache`` for ``plan``: the memoised one, or ``build(call, plan, cache)`` (which parses and
        checks it, raising on a mismatch)."""
        fp = cache_fingerprint(cache, call.framework)
        e = self._entry
        if fp is not None and e is not None and e[0] is cache and e[1] == fp and e[2] is plan:
            return e[3]
        kv = build(call, plan, cache)
        self._entry = None if fp is None else (cache, fp, plan, kv)
        return kv
