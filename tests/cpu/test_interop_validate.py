"""Every validation message of cuinfer.interop.validate, pinned: the argument's name, the rule, what was received and
the fix (in the caller's framework where the fix is framework-specific)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from cuinfer.interop import (
    DType,
    Tensor,
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
    dlpack,
)


def fake(shape, strides=None, dtype=DType.FLOAT16, *, framework="torch", device_type="cuda", device_id=0, ro=False):
    """A Tensor as another framework's CUDA array would import (no GPU needed: checks read only the description)."""
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    return Tensor(0x7000_0000, tuple(shape), tuple(strides), dtype, device_type, device_id, framework, None, ro)


def raises(message: str):
    return pytest.raises(ValueError, match="^" + re.escape(message) + "$")


# ---- dtype ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("framework", "fix"),
    [
        pytest.param("torch", "q.to(torch.float16)", id="torch"),
        pytest.param("jax", "q.astype(jnp.float16)", id="jax"),
        pytest.param("cupy", "q.astype(np.float16)", id="cupy"),
        pytest.param("numpy", "q.astype(np.float16)", id="numpy"),
    ],
)
def test_check_dtype_message_per_framework(framework, fix):
    t = fake((3, 4, 64), dtype=DType.FLOAT32, framework=framework)
    with raises(f"q must have dtype float16 or bfloat16 but has dtype float32; cast it with {fix}"):
        check_dtype("q", t, ["float16", "bfloat16"])


def test_check_dtype_hint_and_ml_dtypes_fix():
    t = fake((3, 64), dtype=DType.FLOAT16, framework="numpy")
    with raises(
        "k must have dtype one of bfloat16, float8_e4m3fn, float8_e5m2 but has dtype float16; "
        "cast it with k.astype(ml_dtypes.bfloat16) or plan() with kv_dtype='float16'"
    ):
        check_dtype("k", t, [DType.BFLOAT16, "e4m3", ml_dtypes.float8_e5m2], hint="or plan() with kv_dtype='float16'")


def test_check_dtype_passes_and_returns(rng):
    arr = rng.standard_normal((5, 3)).astype(ml_dtypes.bfloat16)
    assert check_dtype("q", arr, ["float16", "bfloat16"]) is DType.BFLOAT16  # raw arrays are imported on the fly


def test_check_same_dtype():
    k, v = fake((2, 8), dtype=DType.FLOAT16), fake((2, 8), dtype=DType.BFLOAT16)
    with raises(
        "k and v must have the same dtype but k is float16 and v is bfloat16; cast it with v.to(torch.float16)"
    ):
        check_same_dtype(["k", "v"], [k, v])
    assert check_same_dtype(["k", "v"], [k, fake((9,), dtype=DType.FLOAT16)]) is DType.FLOAT16


# ---- shape ---------------------------------------------------------------------------------------------------------


def test_check_ndim():
    with raises("q must have 3 dimensions but has 2 (shape (7, 128)); q is [num_tokens, num_qo_heads, head_dim]"):
        check_ndim("q", fake((7, 128)), 3, hint="q is [num_tokens, num_qo_heads, head_dim]")
    with raises("kv_cache must have 4 or 5 dimensions but has 1 (shape (9,))"):
        check_ndim("kv_cache", fake((9,)), (4, 5))
    check_ndim("kv_cache", fake((2, 2, 16, 4, 64)), (4, 5))


def test_check_shape_with_wildcards():
    t = fake((7, 16, 128))
    check_shape("q", t, (None, 16, 128))
    with raises("q must have shape (*, 32, 128) but has shape (7, 16, 128); plan() was made for num_qo_heads=32"):
        check_shape("q", t, (None, 32, 128), hint="plan() was made for num_qo_heads=32")
    with raises("lse must have shape (7,) but has shape (7, 16, 128)"):
        check_shape("lse", t, (7,))


# ---- device and layout ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("framework", "fix"),
    [
        pytest.param("torch", "pass k.cuda()", id="torch"),
        pytest.param("jax", "pass jax.device_put(k, jax.devices('gpu')[0])", id="jax"),
        pytest.param(
            "numpy",
            "pass NumPy arrays for all data arrays to use the CPU reference backend, or move them all to the GPU",
            id="numpy",
        ),
        pytest.param("other", "move k to a CUDA device", id="other"),
    ],
)
def test_check_cuda(framework, fix):
    with raises(f"k must be a CUDA array but is a host array ({framework}); {fix}"):
        check_cuda("k", fake((4,), framework=framework, device_type="cpu"))
    check_cuda("k", fake((4,)))


def test_check_same_device():
    q, k, v = fake((2,)), fake((2,)), fake((2,), device_id=1)
    with raises("q, k, v must be on one device but q is on cuda:0 and v is on cuda:1; move v to cuda:0"):
        check_same_device(["q", "k", "v"], [q, k, v])
    with raises("q, o must be on one device but q is on cuda:0 and o is on cpu; move o to cuda:0"):
        check_same_device(["q", "o"], [q, fake((2,), device_type="cpu")])
    check_same_device(["q", "k"], [q, k])


@pytest.mark.parametrize(
    ("framework", "fix"),
    [
        pytest.param("torch", "k.contiguous()", id="torch"),
        pytest.param("cupy", "cupy.ascontiguousarray(k)", id="cupy"),
        pytest.param("numpy", "np.ascontiguousarray(k)", id="numpy"),
        pytest.param("other", "a contiguous copy of k", id="other"),
    ],
)
def test_check_last_dim_contiguous(framework, fix):
    with raises(f"k must have a contiguous last dimension (stride 1) but has stride 2; pass {fix}"):
        check_last_dim_contiguous("k", fake((5, 64), (128, 2), framework=framework))


def test_check_last_dim_contiguous_passes_strided_rows_and_length_one():
    check_last_dim_contiguous("q", fake((5, 8, 64), (3 * 8 * 64, 64, 1)))  # q out of a fused QKV tensor
    check_last_dim_contiguous("x", fake((5, 1), (3, 7)))  # one element: its stride is irrelevant
    arr = np.zeros((6, 10), np.float16)[:, ::2]
    with raises("x must have a contiguous last dimension (stride 1) but has stride 2; pass np.ascontiguousarray(x)"):
        check_last_dim_contiguous("x", arr)


def test_check_writable():
    with raises("out must be writable but it is read-only; JAX arrays are immutable: leave it out to get a new array"):
        check_writable("out", fake((3,), framework="jax", ro=True))
    with raises("o must be writable but it is read-only; pass a writable array (e.g. a copy of o)"):
        check_writable("o", fake((3,), framework="other", ro=True))
    check_writable("o", fake((3,)))


# ---- index arrays --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda a: a.tolist(), id="list"),
        pytest.param(lambda a: tuple(a.tolist()), id="tuple"),
        pytest.param(lambda a: a.astype(np.int64), id="numpy-int64"),
        pytest.param(lambda a: a.astype(np.uint8), id="numpy-uint8"),
        pytest.param(lambda a: a.astype(np.int32)[::-1].copy()[::-1], id="numpy-negative-stride"),
    ],
)
def test_check_index_array_accepts(rng, make):
    values = rng.integers(0, 200, size=37)
    out = check_index_array("kv_indices", make(values))
    assert out.dtype == np.int32 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, values)


def test_check_index_array_int32_is_not_copied(rng):
    values = rng.integers(0, 1 << 30, size=1023).astype(np.int32)
    assert check_index_array("kv_indices", values).ctypes.data == values.ctypes.data


def test_check_index_array_empty_list():
    out = check_index_array("kv_indices", [])
    assert out.dtype == np.int32 and out.shape == (0,)


@pytest.mark.parametrize(
    ("x", "kwargs", "message"),
    [
        pytest.param(
            [0.5, 1.5], {},
            "kv_indices must have an integer dtype (int32) but has dtype float64; pass kv_indices as int32",
            id="float-list",
        ),
        pytest.param(
            np.array([True, False]), {},
            "kv_indices must have an integer dtype (int32) but has dtype bool; "
            "pass the indices of the True entries of kv_indices",
            id="bool",
        ),
        pytest.param(
            np.zeros((2, 3), np.int32), {},
            "kv_indices must be 1-D but has shape (2, 3); pass kv_indices.ravel() if it is flat data",
            id="2d",
        ),
        pytest.param([3, -1, 4], {}, "kv_indices must be non-negative but kv_indices[1] = -1", id="negative"),
        pytest.param(
            np.array([5, 2**31], np.int64), {},
            "kv_indices must fit in int32 but kv_indices[1] = 2147483648; indices beyond 2**31 - 1 are not supported",
            id="int32-overflow",
        ),
        pytest.param(
            [1, 2, 3], {"length": 4, "hint": "one per request (batch_size=4)"},
            "kv_indices must have 4 entries but has 3; one per request (batch_size=4)",
            id="length",
        ),
        pytest.param([1], {"min_len": 2}, "kv_indices must have at least 2 entries but has 1", id="min-len"),
        pytest.param(None, {}, "kv_indices must be given but is None", id="none"),
        pytest.param(
            7, {}, "kv_indices must be a 1-D integer array or list but is a int; pass [kv_indices] for one value",
            id="scalar",
        ),
    ],
)  # fmt: skip
def test_check_index_array_messages(x, kwargs, message):
    with raises(message):
        check_index_array("kv_indices", x, **kwargs)


def test_check_index_array_reads_only_the_entries_in_use():
    """``used=n``: a longer buffer's tail is neither checked nor returned (FlashInfer's preallocated kv_indices)."""
    for tail in ([-1, 2**40], [7]):
        for x in (np.array([4, 2] + tail, np.int64), [4, 2] + tail):
            out = check_index_array("kv_indices", x, used=2)
            assert out.dtype == np.int32
            np.testing.assert_array_equal(out, [4, 2])
    with raises("kv_indices must have at least 3 entries but has 2"):
        check_index_array("kv_indices", [4, 2], used=3)
    with raises("kv_indices must be non-negative but kv_indices[1] = -2"):
        check_index_array("kv_indices", [4, -2, 5], used=2)


def test_check_index_array_ragged_list():
    with pytest.raises(ValueError, match=r"^x must be a 1-D list of integers but could not be read as an array"):
        check_index_array("x", [[1, 2], [3]])


def test_check_index_array_negative_allowed_when_asked():
    np.testing.assert_array_equal(check_index_array("offsets", [-3, 4], nonnegative=False), [-3, 4])


def test_check_index_array_device_float_refused_before_any_copy():
    from test_interop import HandMade  # the hand-built DLPack producer of the sibling test module

    producer = HandMade(np.ones(4, np.float32), (4,), (1,), 2, 32, device=(dlpack.DL_CUDA, 0))
    # A CUDA float array: refused from its header, so no device-to-host copy (which would need a GPU) is attempted.
    with raises(
        "qo_indptr must have an integer dtype (int32) but has dtype float32; cast it with qo_indptr.astype(np.int32)"
    ):
        check_index_array("qo_indptr", producer)


# ---- indptr --------------------------------------------------------------------------------------------------------


def test_check_indptr_valid(rng):
    lengths = rng.integers(0, 50, size=13)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    out = check_indptr("kv_indptr", indptr.tolist(), length=14, last=int(indptr[-1]))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, indptr)


@pytest.mark.parametrize(
    ("x", "kwargs", "message"),
    [
        pytest.param(
            [3, 5, 9], {},
            "kv_indptr must start at 0 but starts at 3; kv_indptr[i]:kv_indptr[i+1] is the range of row i",
            id="start",
        ),
        pytest.param(
            [0, 4, 7, 2, 9], {},
            "kv_indptr must be non-decreasing but kv_indptr[2] = 7 > kv_indptr[3] = 2; "
            "kv_indptr[i+1] - kv_indptr[i] is the length of row i and cannot be negative",
            id="decreasing",
        ),
        pytest.param(
            [0, 4, 9], {"last": 17, "hint": "the last entry is len(kv_indices)"},
            "kv_indptr must end at 17 but ends at 9; the last entry is len(kv_indices)",
            id="last",
        ),
        pytest.param(
            [0, 4, 9], {"length": 5, "hint": "batch_size + 1"},
            "kv_indptr must have 5 entries but has 3; batch_size + 1",
            id="length",
        ),
        pytest.param([], {}, "kv_indptr must have at least 1 entry but has 0", id="empty"),
    ],
)  # fmt: skip
def test_check_indptr_messages(x, kwargs, message):
    with raises(message):
        check_indptr("kv_indptr", x, **kwargs)
