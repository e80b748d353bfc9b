"""cuinfer.interop on the CPU: dtype parsing, DLPack capsules (NumPy's, torch's and hand-built ones, fp8 included),
`Tensor` views of NumPy arrays, outputs and lifetimes. GPU-side behaviour is in tests/gpu/test_interop_gpu.py."""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest
from cuinfer.interop import DType, Tensor, as_dtype, as_tensor, dlpack, empty, framework_of, wrap

from cuinfer import interop

# ---- dtypes --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        pytest.param("float16", DType.FLOAT16, id="float16"),
        pytest.param("half", DType.FLOAT16, id="half"),
        pytest.param("fp16", DType.FLOAT16, id="fp16"),
        pytest.param("bfloat16", DType.BFLOAT16, id="bfloat16"),
        pytest.param("bf16", DType.BFLOAT16, id="bf16"),
        pytest.param(" BFloat16 ", DType.BFLOAT16, id="case-and-space"),
        pytest.param("torch.bfloat16", DType.BFLOAT16, id="torch-str"),
        pytest.param("jnp.float16", DType.FLOAT16, id="jnp-str"),
        pytest.param("float8_e4m3fn", DType.FLOAT8_E4M3FN, id="e4m3fn"),
        pytest.param("e4m3", DType.FLOAT8_E4M3FN, id="cuda-e4m3"),
        pytest.param("float8_e5m2", DType.FLOAT8_E5M2, id="e5m2"),
        pytest.param("float32", DType.FLOAT32, id="float32"),
        pytest.param("float64", DType.FLOAT64, id="float64"),
        pytest.param("int32", DType.INT32, id="int32"),
        pytest.param("int64", DType.INT64, id="int64"),
        pytest.param("uint8", DType.UINT8, id="uint8"),
        pytest.param("bool", DType.BOOL, id="bool"),
        pytest.param(DType.INT8, DType.INT8, id="dtype-itself"),
    ],
)
def test_as_dtype_names(spelling, expected):
    assert as_dtype(spelling) is expected


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        pytest.param(np.float16, DType.FLOAT16, id="np-type-f16"),
        pytest.param(np.dtype("float32"), DType.FLOAT32, id="np-dtype-f32"),
        pytest.param(np.dtype("<f8"), DType.FLOAT64, id="np-typestr-f64"),
        pytest.param(ml_dtypes.bfloat16, DType.BFLOAT16, id="ml-bf16"),
        pytest.param(np.dtype(ml_dtypes.float8_e4m3fn), DType.FLOAT8_E4M3FN, id="ml-e4m3fn"),
        pytest.param(ml_dtypes.float8_e5m2, DType.FLOAT8_E5M2, id="ml-e5m2"),
        pytest.param(np.int32, DType.INT32, id="np-int32"),
        pytest.param(np.bool_, DType.BOOL, id="np-bool"),
        pytest.param(np.uint8, DType.UINT8, id="np-uint8"),
    ],
)
def test_as_dtype_numpy_and_ml_dtypes(x, expected):
    assert as_dtype(x) is expected


class _FakeTorchDtype:
    """Stands in for torch.dtype: as_dtype must recognise it by module and str(), never by importing torch."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


_FakeTorchDtype.__module__ = "torch"


class _FakeJaxScalarMeta(type):
    pass


class _FakeJnpFloat16(metaclass=_FakeJaxScalarMeta):
    """jnp.float16 and friends are classes carrying a ``dtype`` attribute."""

    dtype = np.dtype(np.float16)


@pytest.mark.parametrize("d", list(DType), ids=lambda d: d.value)
def test_as_dtype_torch_spelling_without_torch(d):
    assert as_dtype(_FakeTorchDtype(d.value)) is d


def test_as_dtype_jax_scalar_type():
    assert as_dtype(_FakeJnpFloat16) is DType.FLOAT16


@pytest.mark.parametrize("d", list(DType), ids=lambda d: d.value)
def test_as_dtype_real_torch_dtypes(d):
    torch = pytest.importorskip("torch")
    assert as_dtype(getattr(torch, d.value)) is d


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("float", id="ambiguous-float"),
        pytest.param("float8_e4m3", id="ieee-e4m3-is-not-fn"),
        pytest.param("int16", id="int16"),
        pytest.param(np.complex64, id="complex"),
        pytest.param(np.dtype(">f4"), id="big-endian"),
        pytest.param(3.5, id="number"),
        pytest.param(_FakeTorchDtype("complex64"), id="torch-complex"),
    ],
)
def test_as_dtype_unknown_lists_accepted_names(bad):
    with pytest.raises(ValueError, match=r"unknown dtype .*; pass one of float16, bfloat16, float32, .*bool"):
        as_dtype(bad)


def test_as_dtype_big_endian_says_so():
    with pytest.raises(ValueError, match="in non-native byte order"):
        as_dtype(np.dtype(">f2"))


_CTYPES = {
    DType.FLOAT16: "half",
    DType.BFLOAT16: "__nv_bfloat16",
    DType.FLOAT32: "float",
    DType.FLOAT64: "double",
    DType.FLOAT8_E4M3FN: "__nv_fp8_e4m3",
    DType.FLOAT8_E5M2: "__nv_fp8_e5m2",
    DType.INT32: "int",
    DType.INT64: "long long",
    DType.UINT8: "unsigned char",
    DType.INT8: "signed char",
    DType.BOOL: "bool",
}
# dlpack.h 1.1: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6, kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12.
_DLPACK = {
    DType.FLOAT16: (2, 16),
    DType.BFLOAT16: (4, 16),
    DType.FLOAT32: (2, 32),
    DType.FLOAT64: (2, 64),
    DType.FLOAT8_E4M3FN: (10, 8),
    DType.FLOAT8_E5M2: (12, 8),
    DType.INT32: (0, 32),
    DType.INT64: (0, 64),
    DType.UINT8: (1, 8),
    DType.INT8: (0, 8),
    DType.BOOL: (6, 8),
}


@pytest.mark.parametrize("d", list(DType), ids=lambda d: d.value)
def test_dtype_table(d):
    assert d.ctype == _CTYPES[d]
    assert d.dlpack == _DLPACK[d]
    assert d.itemsize == d.numpy.itemsize == max(d.dlpack[1] // 8, 1)
    assert as_dtype(d.numpy) is d and as_dtype(d.value) is d and as_dtype(d.short) is d
    assert d.is_float8 == (d in (DType.FLOAT8_E4M3FN, DType.FLOAT8_E5M2))
    assert str(d) == d.value


# ---- NumPy arrays --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.int32]
)
def test_numpy_array_is_read_in_place(rng, dtype):
    arr = rng.standard_normal((7, 13)).astype(dtype)
    t = as_tensor(arr, "x")
    assert t.ptr == arr.ctypes.data
    assert t.shape == (7, 13) and t.strides == (13, 1)
    assert t.dtype is as_dtype(dtype) and t.framework == "numpy" and t.device_type == "cpu" and not t.is_cuda
    assert t.nbytes == arr.nbytes and t.size == 91 and t.ndim == 2
    assert t.obj is arr and not t.readonly
    view = t.numpy()
    assert view.dtype == arr.dtype and np.shares_memory(view, arr)


def test_numpy_sliced_strides_and_offset(rng):
    base = rng.standard_normal((9, 11, 6)).astype(np.float32)
    arr = base[1::2, :, 3:]  # q sliced out of a fused tensor: last dim contiguous, others strided
    t = as_tensor(arr, "q")
    assert t.ptr == arr.ctypes.data == base.ctypes.data + (1 * 66 + 3) * 4
    assert t.strides == (132, 6, 1) and t.byte_strides == arr.strides
    assert t.last_dim_contiguous and not t.is_contiguous
    np.testing.assert_array_equal(t.numpy(), arr)


def test_numpy_negative_and_nonunit_last_stride(rng):
    base = rng.standard_normal((5, 8)).astype(ml_dtypes.bfloat16)
    arr = base[::-1, ::2]
    t = as_tensor(arr, "k")
    assert t.strides == (-8, 2) and not t.last_dim_contiguous
    # Through the generic (non-NumPy-object) path: reinterpret forces it, then read back as bfloat16.
    back = t.reinterpret(np.float16).reinterpret("bfloat16").numpy()
    np.testing.assert_array_equal(back.astype(np.float64), arr.astype(np.float64))


def test_numpy_readonly_is_reported():
    arr = np.arange(5, dtype=np.int32)
    arr.flags.writeable = False
    t = as_tensor(arr, "x")
    assert t.readonly
    assert not t.numpy().flags.writeable
    assert not t.reinterpret("float32").numpy().flags.writeable  # the generic view path honours it too


def test_numpy_bad_strides_rejected():
    rec = np.zeros(4, dtype=[("a", np.float32), ("b", np.int8)])
    with pytest.raises(ValueError, match=r"^x has byte strides \(5,\) that are not multiples of its itemsize 4; pass"):
        as_tensor(rec["a"], "x")


def test_numpy_unsupported_dtype_names_argument():
    with pytest.raises(ValueError, match=r"^v has dtype complex64 which cuinfer does not handle: unknown dtype"):
        as_tensor(np.zeros(3, np.complex64), "v")


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param([1.0, 2.0], id="list"),
        pytest.param(3.0, id="scalar"),
        pytest.param(None, id="none"),
        pytest.param("abc", id="str"),
    ],
)
def test_as_tensor_rejects_non_arrays(bad):
    with pytest.raises(ValueError, match=rf"^q must be an array \(torch.Tensor, .*\) but is a {type(bad).__name__}"):
        as_tensor(bad, "q")


def test_zero_size_array():
    t = as_tensor(np.zeros((0, 4), np.float16), "x")
    assert t.size == 0 and t.nbytes == 0
    assert t.reinterpret("bfloat16").numpy().shape == (0, 4)


def test_reinterpret_requires_same_itemsize(rng):
    raw = rng.integers(0, 255, size=(3, 5), dtype=np.uint8)
    fp8 = as_tensor(raw, "kv_cache").reinterpret("float8_e4m3fn")
    assert fp8.dtype is DType.FLOAT8_E4M3FN and fp8.ptr == raw.ctypes.data
    np.testing.assert_array_equal(fp8.numpy().view(np.uint8), raw)
    with pytest.raises(ValueError, match=r"cannot read a uint8 array as float16: the element sizes differ \(1 vs 2"):
        as_tensor(raw, "kv_cache").reinterpret("float16")


# ---- DLPack capsules -----------------------------------------------------------------------------------------------

_capi = ctypes.PyDLL(None, handle=ctypes.pythonapi._handle)
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class HandMade:
    """A DLPack producer built in ctypes over a NumPy buffer, so every header field can be set by the test.

    The capsule has no destructor: the structs live as long as this object, which the Tensor keeps as ``obj``.
    """

    def __init__(
        self,
        buf: np.ndarray,
        shape,
        strides,
        code: int,
        bits: int,
        *,
        lanes: int = 1,
        device: tuple[int, int] = (dlpack.DL_CPU, 0),
        versioned: bool = False,
        version: tuple[int, int] = (1, 1),
        flags: int = 0,
        byte_offset: int = 0,
        name: bytes | None = None,
        legacy_only: bool = False,
    ) -> None:
        self.buf = buf
        self.device = device
        self.calls: list[dict] = []
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self.managed = dlpack.DLManagedTensorVersioned() if versioned else dlpack.DLManagedTensor()
        if versioned:
            self.managed.version.major, self.managed.version.minor = version
            self.managed.flags = flags
        t = self.managed.dl_tensor
        t.data = buf.ctypes.data
        t.device.device_type, t.device.device_id = device
        t.ndim = len(shape)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
        t.shape = self._shape
        t.strides = self._strides
        t.byte_offset = byte_offset
        self.name = name or (dlpack.VERSIONED_NAME if versioned else dlpack.LEGACY_NAME)
        self.legacy_only = legacy_only

    def capsule(self):
        return _capi.PyCapsule_New(ctypes.addressof(self.managed), self.name, None)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        if self.legacy_only and "max_version" in kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.calls.append(kwargs)
        return self.capsule()


def test_handmade_fp8_capsule(rng):
    bits = rng.integers(0, 255, size=(6, 10), dtype=np.uint8)
    producer = HandMade(bits, (6, 4), (10, 2), code=10, bits=8, byte_offset=3)  # kDLFloat8_e4m3fn
    t = as_tensor(producer, "k_cache")
    assert t.dtype is DType.FLOAT8_E4M3FN and t.framework == "other" and t.obj is producer
    assert t.ptr == bits.ctypes.data + 3 and t.shape == (6, 4) and t.strides == (10, 2)
    expected = bits.reshape(-1)[3:].view(ml_dtypes.float8_e4m3fn)
    expected = np.lib.stride_tricks.as_strided(expected, shape=(6, 4), strides=(10, 2))
    np.testing.assert_array_equal(t.numpy().view(np.uint8), expected.view(np.uint8))
    assert producer.calls == [{"max_version": dlpack.MAX_VERSION}]  # a CPU array is never handed a stream


def test_handmade_e5m2_versioned_readonly_null_strides(rng):
    bits = rng.integers(0, 255, size=(3, 7), dtype=np.uint8)
    producer = HandMade(bits, (3, 7), None, code=12, bits=8, versioned=True, flags=dlpack.FLAG_READ_ONLY)
    t = as_tensor(producer, "v_cache")
    assert t.dtype is DType.FLOAT8_E5M2 and t.strides == (7, 1) and t.readonly
    view = t.numpy()
    assert not view.flags.writeable
    np.testing.assert_array_equal(view.view(np.uint8), bits)


def test_read_capsule_reports_version_and_flags(rng):
    buf = rng.standard_normal(5).astype(np.float32)
    producer = HandMade(buf, (5,), (1,), 2, 32, versioned=True, version=(1, 0), flags=dlpack.FLAG_IS_COPIED)
    view = dlpack.read_capsule(producer.capsule())
    assert view.version == (1, 0) and view.is_copied and not view.read_only
    assert view.dtype is DType.FLOAT32 and view.ptr == buf.ctypes.data and view.device_type == dlpack.DL_CPU


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"code": 2, "bits": 32, "lanes": 4}, r"x: DLPack dtype has 4 lanes", id="lanes"),
        pytest.param({"code": 5, "bits": 64}, r"x: DLPack dtype \(code=5, bits=64\) is not one", id="complex"),
        pytest.param({"code": 0, "bits": 16}, r"x: DLPack dtype \(code=0, bits=16\)", id="int16"),
        pytest.param(
            {"code": 2, "bits": 32, "device": (dlpack.DL_ROCM, 1)}, r"x: the array is on ROCm \(device 1\)", id="rocm"
        ),
        pytest.param(
            {"code": 2, "bits": 32, "versioned": True, "version": (2, 0)},
            r"x: DLPack capsule has version 2.0 but cuinfer reads DLPack 1.x",
            id="major-2",
        ),
        pytest.param(
            {"code": 2, "bits": 32, "name": b"used_dltensor"},
            r"x: DLPack capsule 'used_dltensor' was already",
            id="used",
        ),
    ],
)
def test_bad_capsules_are_refused(kwargs, message):
    producer = HandMade(np.ones(8, np.float32), (2,), (1,), **kwargs)
    with pytest.raises(ValueError, match=message):
        as_tensor(producer, "x")


def test_read_capsule_rejects_non_capsules():
    with pytest.raises(ValueError, match="expected a DLPack capsule named 'dltensor' or 'dltensor_versioned' but got"):
        dlpack.read_capsule(object())


def test_legacy_producer_without_max_version(rng):
    buf = rng.standard_normal(6).astype(np.float16)
    producer = HandMade(buf, (2, 3), (3, 1), 2, 16, legacy_only=True)
    t = as_tensor(producer, "q")
    assert t.dtype is DType.FLOAT16 and producer.calls == [{}]
    np.testing.assert_array_equal(t.numpy(), buf.reshape(2, 3))


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        pytest.param(None, {}, id="no-stream"),
        pytest.param(0, {"stream": 1}, id="null-stream-is-spelt-1"),
        pytest.param(0x7F00BEEF, {"stream": 0x7F00BEEF}, id="raw-handle"),
    ],
)
def test_cuda_producer_is_given_the_consumer_stream(stream, expected):
    producer = HandMade(np.ones(4, np.float32), (4,), (1,), 2, 32, device=(dlpack.DL_CUDA, 3))
    t = as_tensor(producer, "q", stream=stream)
    assert producer.calls == [{"max_version": dlpack.MAX_VERSION, **expected}]
    assert t.is_cuda and t.device_id == 3 and t.device == "cuda:3"
    with pytest.raises(ValueError, match=r"numpy\(\) needs a host array but this one is on cuda:3"):
        t.numpy()


def test_cuda_managed_and_pinned_device_kinds():
    managed = as_tensor(HandMade(np.ones(2, np.float32), (2,), (1,), 2, 32, device=(dlpack.DL_CUDA_MANAGED, 1)), "a")
    pinned = as_tensor(HandMade(np.ones(2, np.float32), (2,), (1,), 2, 32, device=(dlpack.DL_CUDA_HOST, 0)), "b")
    assert managed.device_type == "cuda" and pinned.device_type == "cpu"


def test_export_errors_name_the_argument():
    class Refuses:
        def __dlpack__(self, **kwargs):
            raise BufferError("Can't export tensors with the conjugate bit set")

    with pytest.raises(
        ValueError, match=r"^o could not be exported through DLPack: Can't export tensors with the conj"
    ):
        as_tensor(Refuses(), "o")


class _Exporter:
    """Exposes only NumPy's DLPack protocol (not the ndarray itself), so as_tensor goes through the capsule."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)


def test_numpy_capsule_matches_numpy(rng):
    arr = rng.standard_normal((4, 9)).astype(np.float64)[:, 2:7]
    t = as_tensor(_Exporter(arr), "x", stream=12345)  # CPU: the stream must not reach NumPy, which would refuse it
    assert t.ptr == arr.ctypes.data and t.strides == (9, 1) and t.shape == (4, 5)
    assert dlpack.capsule_name(t.capsule) in (dlpack.VERSIONED_NAME, dlpack.LEGACY_NAME)
    np.testing.assert_array_equal(t.numpy(), arr)


def test_capsule_keeps_memory_alive_and_frees_it():
    arr = np.arange(1000, dtype=np.float32) * 0.5
    alive = weakref.ref(arr)
    exporter = _Exporter(arr)
    t = as_tensor(exporter, "x")
    exporter.arr = None
    del arr
    gc.collect()
    assert alive() is not None  # only the capsule held by the Tensor references the array now
    np.testing.assert_array_equal(t.numpy()[:3], [0.0, 0.5, 1.0])
    view = t.numpy()
    del t
    gc.collect()
    assert alive() is not None  # the NumPy view keeps the Tensor (and so the capsule) alive
    assert view[999] == 499.5
    del view
    gc.collect()
    assert alive() is None  # no leak: dropping the last view runs the producer's deleter


# ---- torch CPU tensors through the capsule reader ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float32", "int32", "int64", "bool", "uint8"]
)
def test_torch_cpu_tensor(rng, name):
    torch = pytest.importorskip("torch")
    data = rng.standard_normal((11, 2, 9))
    full = torch.from_numpy(data).to(getattr(torch, name))
    x = full[3:, 1, 2:]  # strided view with an offset
    t = as_tensor(x, "k")
    assert t.framework == "torch" and t.ptr == x.data_ptr() and t.obj is x
    assert t.shape == (8, 7) and t.strides == tuple(x.stride()) == (18, 1)
    assert t.dtype is as_dtype(name) and not t.is_cuda
    assert dlpack.capsule_name(t.capsule) == dlpack.VERSIONED_NAME  # torch >= 2.9 answers max_version with 1.x
    expected = x.to(torch.float64).numpy()
    np.testing.assert_array_equal(t.numpy().astype(np.float64), expected)


def test_torch_requires_grad_is_detached(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.standard_normal((3, 5)).astype(np.float32)).requires_grad_()
    t = as_tensor(x, "q")
    assert t.ptr == x.data_ptr() and t.obj is x


def test_torch_parameter_is_torch():
    torch = pytest.importorskip("torch")
    assert framework_of(torch.nn.Parameter(torch.ones(2))) == "torch"
    assert framework_of(torch.ones(2)) == "torch"


def test_torch_index_tensor_is_read_without_copy(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.integers(0, 100, size=17).astype(np.int32))
    out = interop.check_index_array("kv_indices", x)
    assert out.ctypes.data == x.data_ptr()
    np.testing.assert_array_equal(out, x.numpy())


# ---- frameworks, outputs, streams ----------------------------------------------------------------------------------


class _FakeJaxArray:
    pass


_FakeJaxArray.__module__ = "jaxlib._jax"


class _MyArray(np.ndarray):
    pass


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        pytest.param(np.zeros(2), "numpy", id="numpy"),
        pytest.param(np.zeros(2).view(_MyArray), "numpy", id="numpy-subclass"),
        pytest.param(_FakeJaxArray(), "jax", id="jaxlib-class"),
        pytest.param([1, 2], "other", id="list"),
        pytest.param(HandMade(np.ones(1, np.float32), (1,), (1,), 2, 32), "other", id="dlpack-object"),
    ],
)
def test_framework_of(x, expected):
    assert framework_of(x) == expected


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float32"])
def test_empty_numpy(dtype):
    out, t = empty("numpy", (5, 3, 7), dtype)
    assert isinstance(out, np.ndarray) and out.shape == (5, 3, 7) and out.dtype == as_dtype(dtype).numpy
    assert t.ptr == out.ctypes.data and t.dtype is as_dtype(dtype) and t.strides == (21, 7, 1)
    assert wrap(t) is out


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e5m2", "float32"])
def test_empty_torch_cpu(dtype):
    torch = pytest.importorskip("torch")
    out, t = empty("torch", (4, 9), dtype)
    assert isinstance(out, torch.Tensor) and out.dtype == getattr(torch, dtype) and out.device.type == "cpu"
    assert t.ptr == out.data_ptr() and t.framework == "torch" and wrap(t) is out


def test_empty_errors():
    with pytest.raises(ValueError, match=r"framework must be one of torch, jax, cupy, numpy, other but is 'mxnet'"):
        empty("mxnet", (2,), "float16")
    with pytest.raises(ValueError, match=r"empty\('cupy', \.\.\.\) allocates on a GPU: pass device_id"):
        empty("cupy", (2,), "float16")


def test_current_stream_numpy_has_none():
    with pytest.raises(ValueError, match="NumPy arrays run on the CPU reference backend, which has no CUDA stream"):
        interop.current_stream("numpy", 0)


def test_consumer_stream_spelling():
    assert dlpack.consumer_stream_arg(0) == 1  # the array API reserves 0
    assert dlpack.consumer_stream_arg(2) == 2 and dlpack.consumer_stream_arg(0xABC0) == 0xABC0


def test_cupy_stream_wraps_raw_handles():
    cupy = pytest.importorskip("cupy")
    assert interop.cupy_stream(0x5EED0).ptr == 0x5EED0
    assert interop.cupy_stream(0) is cupy.cuda.Stream.null
    assert interop.cupy_stream(1) is cupy.cuda.Stream.null


def test_import_does_not_import_frameworks():
    code = "import sys, cuinfer.interop; print(sorted(m for m in ('torch', 'jax', 'cupy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_tensor_built_by_hand_for_other_layers():
    t = Tensor(ptr=4096, shape=(2, 3), strides=(3, 1), dtype=DType.BFLOAT16, device_type="cuda", device_id=0,
               framework="torch", obj=None)  # fmt: skip
    assert t.nbytes == 12 and t.byte_strides == (6, 2) and t.is_contiguous and t.is_cuda


def test_jax_inputs_outlive_their_call_until_its_stream_passes(monkeypatch):
    """JAX frees an input's memory when its last reference goes and may reuse it at once on its own streams, while a
    kernel of the call still reads it (test_segment_packbits[jax] once read a packed input overwritten that way). A
    call holds its JAX inputs until an event recorded on its stream at its end is done; other inputs it does not."""
    from collections import deque

    import cuinfer.runtime.calls as calls

    class Event:
        done = False

    events: list = []
    monkeypatch.setattr(calls, "_KEPT", deque())
    monkeypatch.setattr(calls, "_record_event", lambda stream, dev: events.append(Event()) or events[-1])

    class Buffer:  # stands for the JAX array (and its DLPack capsule)
        pass

    def imported(framework):
        buf = Buffer()
        call = calls.Call(framework, 0, 7)
        call.tensor(Tensor(1 << 20, (4,), (1,), DType.INT32, "cuda", 0, framework, buf), "x")
        return weakref.ref(buf), call

    ref, call = imported("jax")
    del call  # the public function returned: its kernels may still be running
    assert ref() is not None and len(events) == 1
    ref_torch, call = imported("torch")
    del call
    assert ref_torch() is None and len(events) == 1  # torch's allocator is ordered on the caller's stream
    events[0].done = True
    ref2, call = imported("jax")
    del call  # the end of a later call releases what finished
    assert ref() is None and ref2() is not None
