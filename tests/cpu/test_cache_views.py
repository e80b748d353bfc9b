"""CacheViews (cuinfer/runtime/cache_views.py): the paged-cache view run() reuses, and when it must not."""

from __future__ import annotations

from types import SimpleNamespace

from cuinfer.runtime.cache_views import CacheViews


class _FakeCupyArray:
    """Enough of a CuPy array for cache_fingerprint (its module must read as cupy)."""

    __module__ = "cupy._core.core"

    def __init__(self, ptr: int, shape=(8, 2, 16, 4, 64)) -> None:
        self.data = SimpleNamespace(ptr=ptr)
        self.shape = shape
        self.strides = tuple(2 * s for s in shape)
        self.dtype = "float16"


def _builder():
    calls = []

    def build(call, plan, cache):
        calls.append((plan, cache))
        return ("view", len(calls))

    return build, calls


def test_same_cache_object_and_plan_reuse_the_view():
    views, (build, calls) = CacheViews(), _builder()
    call, plan, cache = SimpleNamespace(framework="cupy"), object(), _FakeCupyArray(0x1000)
    first = views.view(cache, call, plan, build)
    assert views.view(cache, call, plan, build) is first
    assert len(calls) == 1


def test_another_plan_pointer_or_object_builds_again():
    views, (build, calls) = CacheViews(), _builder()
    call, plan = SimpleNamespace(framework="cupy"), object()
    cache = _FakeCupyArray(0x1000)
    views.view(cache, call, plan, build)
    views.view(cache, call, object(), build)  # a new plan
    cache.data.ptr = 0x2000  # the same object over other memory
    views.view(cache, call, plan, build)
    views.view(_FakeCupyArray(0x2000), call, plan, build)  # an equal-looking other object
    assert len(calls) == 4


def test_other_frameworks_are_never_memoised():
    views, (build, calls) = CacheViews(), _builder()
    cache = _FakeCupyArray(0x1000)
    call, plan = SimpleNamespace(framework="torch"), object()  # the caller's framework is not the cache's
    views.view(cache, call, plan, build)
    views.view(cache, call, plan, build)
    assert len(calls) == 2
