"""cuinfer.interop with real CUDA arrays from torch, JAX and CuPy: zero-copy import (pointer equality), fp8 caches,
outputs allocated in each framework, stream pickup and stream ordering. Skipped without a GPU (tests/conftest.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from cuinfer.interop import (
    DType,
    as_tensor,
    check_index_array,
    current_stream,
    empty,
    framework_of,
    stream_context,
    wrap,
)

pytestmark = pytest.mark.gpu


def native_ptr(framework: str, x) -> int:
    """The framework's own idea of where element 0 is."""
    if framework == "torch":
        return x.data_ptr()
    if framework == "cupy":
        return x.data.ptr
    return x.unsafe_buffer_pointer()


def cupy_view(t):
    """A CuPy array over a Tensor's memory, as raw unsigned bits (so fp8 / bf16 need no CuPy support)."""
    import cupy

    bits = np.dtype(f"uint{8 * t.dtype.itemsize}")
    span = (max((n - 1) * s for n, s in zip(t.shape, t.byte_strides, strict=True)) if t.size else 0) + t.dtype.itemsize
    mem = cupy.cuda.UnownedMemory(t.ptr, span, owner=t, device_id=t.device_id)
    return cupy.ndarray(t.shape, bits, cupy.cuda.MemoryPointer(mem, 0), strides=t.byte_strides)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32], ids=["f16", "bf16", "f32"])
def test_zero_copy_import(framework, rng, dtype):
    host = rng.standard_normal((5, 7, 64)).astype(dtype)
    x = framework.asarray(host)
    t = as_tensor(x, "q")
    assert t.ptr == native_ptr(framework, x)
    assert t.is_cuda and t.device_id == 0 and t.framework == framework and t.obj is x
    assert t.shape == (5, 7, 64) and t.strides == (7 * 64, 64, 1) and t.dtype.numpy == np.dtype(dtype)
    np.testing.assert_array_equal(cupy_view(t).get(), host.view(f"uint{8 * host.itemsize}"))


def test_zero_copy_strided_slice(framework, rng):
    if framework == "jax":
        pytest.skip("JAX slices are new arrays, never strided views")
    host = rng.standard_normal((9, 3 * 4, 64)).astype(np.float16)  # fused QKV: [tokens, 3 * heads, head_dim]
    fused = framework.asarray(host)
    q = fused[:, 4:8]
    t = as_tensor(q, "q")
    assert t.strides == (12 * 64, 64, 1) and t.last_dim_contiguous and not t.is_contiguous
    assert t.ptr == native_ptr(framework, q) == as_tensor(fused, "qkv").ptr + 4 * 64 * 2
    np.testing.assert_array_equal(cupy_view(t).get(), host[:, 4:8].view(np.uint16))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_cache_import(framework, rng, name):
    host = rng.standard_normal((6, 2, 16, 4, 64)).astype(getattr(ml_dtypes, name))  # [pages, 2, page, Hkv, D]
    cache = framework.asarray(host)
    t = as_tensor(cache, "kv_cache")
    assert t.ptr == native_ptr(framework, cache)
    if framework == "cupy":
        # CuPy has no fp8 dtype: the cache is uint8 and the caller says what it holds.
        assert t.dtype is DType.UINT8
        t = t.reinterpret(name)
    assert t.dtype is DType(name) and t.shape == host.shape
    np.testing.assert_array_equal(cupy_view(t).get(), host.view(np.uint8))


def test_torch_fp8_is_a_versioned_capsule(rng):
    torch = pytest.importorskip("torch")
    from cuinfer.interop import dlpack

    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32)).cuda().to(torch.float8_e4m3fn)
    t = as_tensor(x, "k_cache")
    assert dlpack.capsule_name(t.capsule) == dlpack.VERSIONED_NAME and t.dtype is DType.FLOAT8_E4M3FN
    assert t.ptr == x.data_ptr()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_output_in_callers_framework(framework, rng, dtype):
    import cupy

    out, t = empty(framework, (3, 5, 64), dtype, 0)
    host = rng.standard_normal((3, 5, 64)).astype(DType(dtype).numpy)
    stream = current_stream(framework, 0)
    with stream_context(stream, 0):
        # Stands in for a kernel writing the output on the caller's stream.
        cupy_view(t)[...] = cupy.asarray(host.view(f"uint{8 * host.itemsize}"))
    user = wrap(t, stream=stream)
    assert framework_of(user) == framework
    assert native_ptr(framework, user) == t.ptr  # zero copy, JAX included
    back = framework.to_numpy(user)
    np.testing.assert_array_equal(back.view(np.uint8), host.view(np.uint8))
    assert as_tensor(user, "o").ptr == t.ptr  # round trip


@pytest.mark.parametrize("fw", ["torch", "cupy"])
def test_output_fp8_in_torch_and_cupy(rng, fw):
    import cupy

    torch = pytest.importorskip("torch") if fw == "torch" else None
    out, t = empty(fw, (4, 64), "float8_e4m3fn", 0)
    assert t.dtype is DType.FLOAT8_E4M3FN and t.ptr == native_ptr(fw, out)
    if fw == "cupy":
        assert out.dtype == np.uint8  # CuPy holds fp8 as bytes
    bits = rng.integers(0, 255, size=(4, 64), dtype=np.uint8)
    cupy_view(t)[...] = cupy.asarray(bits)
    cupy.cuda.get_current_stream().synchronize()
    got = out.view(torch.uint8).cpu().numpy() if fw == "torch" else out.get()
    np.testing.assert_array_equal(got, bits)


def test_torch_current_stream_pickup():
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    assert current_stream("torch", 0) == torch.cuda.current_stream(0).cuda_stream
    with torch.cuda.stream(s):
        assert current_stream("torch", 0) == s.cuda_stream != 0


def test_cupy_current_stream_pickup():
    import cupy

    assert current_stream("cupy", 0) == cupy.cuda.get_current_stream().ptr
    with cupy.cuda.Stream(non_blocking=True) as s:
        assert current_stream("cupy", 0) == s.ptr != 0
        assert current_stream("jax", 0) == s.ptr  # JAX work goes on CuPy's current stream


def test_stream_context_makes_a_raw_stream_current():
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    with stream_context(s.ptr, 0) as inner:
        assert cupy.cuda.get_current_stream().ptr == s.ptr == inner.ptr
    assert cupy.cuda.get_current_stream().ptr != s.ptr


def test_input_is_ordered_before_consumer_stream(framework, rng):
    """The producer's pending writes to x must land before work on our stream reads it (``__dlpack__(stream=)``)."""
    import cupy

    host = rng.standard_normal((2048, 2048)).astype(np.float32)
    x = framework.asarray(host)
    y = (x @ x) * 0.5  # enqueued on the framework's own stream, typically still running when we ask for it
    consumer = cupy.cuda.Stream(non_blocking=True)
    t = as_tensor(y, "y", stream=consumer.ptr)
    with consumer:
        copy = cupy_view(t).copy()  # reads y on the consumer stream
    consumer.synchronize()
    np.testing.assert_array_equal(copy.get(), framework.to_numpy(y).view(np.uint32))


def test_device_index_array_is_copied_once(framework, rng):
    values = rng.integers(0, 1000, size=113).astype(np.int32)
    x = framework.asarray(values)
    out = check_index_array("kv_indices", x)
    assert isinstance(out, np.ndarray) and out.dtype == np.int32
    np.testing.assert_array_equal(out, values)


def test_torch_tensor_on_another_device():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.ones(8, device="cuda:1")
    t = as_tensor(x, "q")  # torch refuses to export a tensor of a non-current device unless we switch to it
    assert t.device_id == 1 and t.ptr == x.data_ptr()
