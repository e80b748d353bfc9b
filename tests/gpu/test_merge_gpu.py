"""Merge kernels on the GPU against the float64 reference, for torch, JAX and CuPy inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cuinfer
from cuinfer import reference

pytestmark = pytest.mark.gpu

DTYPES = {
    "fp16": (np.float16, 2.0**-11),
    "bf16": (ml_dtypes.bfloat16, 2.0**-8),
    "fp32": (np.float32, 2.0**-21),
}


def _poison_pool(framework, nbytes: int = 64 << 20) -> None:
    """Fill the framework allocator's free blocks with NaN, so an output element the kernel never writes is NaN."""
    x = framework.asarray(np.full(nbytes // 4, np.nan, np.float32))
    del x


def _states(rng, rows, states, heads, d, dtype, empty_frac=0.2):
    o = rng.standard_normal((rows, states, heads, d)).astype(dtype)
    lse = (rng.standard_normal((rows, states, heads)) * 4).astype(np.float32)
    lse[rng.random(lse.shape) < empty_frac] = -np.inf
    lse[0, :, 0] = -np.inf  # row 0, head 0: every state empty
    return o, lse


def _check(out, out_lse, ref_o, ref_lse, eps):
    out = np.asarray(out, np.float64)
    assert np.isfinite(out).all(), "an output element is NaN/inf (unwritten or bad merge)"
    empty = np.isneginf(ref_lse)
    assert (out[empty] == 0).all(), "an all-empty row must be exactly 0"
    assert np.isneginf(out_lse[empty]).all(), "an all-empty row must have lse = -inf"
    scale = np.abs(ref_o).max()
    err = np.abs(out - ref_o).max()
    assert err <= 2 * eps * scale, f"max abs error {err:.3e} > 2 eps * max|ref| = {2 * eps * scale:.3e}"
    fin = ~empty
    np.testing.assert_allclose(out_lse[fin], ref_lse[fin], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize(
    "rows,states,heads,d",
    [
        pytest.param(113, 8, 5, 128, id="113rows-8states-d128"),
        pytest.param(37, 1, 3, 64, id="1state-d64"),
        pytest.param(29, 13, 2, 256, id="13states-d256"),
    ],
)
def test_merge_states(framework, rng, dt, rows, states, heads, d):
    dtype, eps = DTYPES[dt]
    o, lse = _states(rng, rows, states, heads, d, dtype)
    ref_o, ref_lse = reference.merge_states(o, lse)
    _poison_pool(framework)
    out, out_lse = cuinfer.merge_states(framework.asarray(o), framework.asarray(lse))
    assert type(out).__module__.split(".")[0] == type(framework.asarray(o[:1])).__module__.split(".")[0]
    _check(framework.to_numpy(out), framework.to_numpy(out_lse), ref_o, ref_lse, eps)


def test_merge_states_strided_input(framework, rng):
    """o and lse sliced out of larger arrays (every other state, a head window): strides honoured, nothing copied."""
    dtype, eps = DTYPES["bf16"]
    o, lse = _states(rng, 41, 10, 7, 128, dtype)
    ref_o, ref_lse = reference.merge_states(o[:, ::2, 1:5], lse[:, ::2, 1:5])
    go, gl = framework.asarray(o), framework.asarray(lse)
    out, out_lse = cuinfer.merge_states(go[:, ::2, 1:5], gl[:, ::2, 1:5])
    _check(framework.to_numpy(out), framework.to_numpy(out_lse), ref_o, ref_lse, eps)


@pytest.mark.parametrize("dt", list(DTYPES), ids=list(DTYPES))
def test_merge_state_pair(framework, rng, dt):
    dtype, eps = DTYPES[dt]
    o, lse = _states(rng, 97, 2, 6, 128, dtype, empty_frac=0.3)
    a, b = np.ascontiguousarray(o[:, 0]), np.ascontiguousarray(o[:, 1])
    la, lb = np.ascontiguousarray(lse[:, 0]), np.ascontiguousarray(lse[:, 1])
    ref_o, ref_lse = reference.merge_state(a, la, b, lb)
    _poison_pool(framework)
    f = framework.asarray
    out, out_lse = cuinfer.merge_state(f(a), f(la), f(b), f(lb))
    _check(framework.to_numpy(out), framework.to_numpy(out_lse), ref_o, ref_lse, eps)


@pytest.mark.parametrize("use_mask", [False, True], ids=["nomask", "mask"])
def test_merge_state_in_place(framework, rng, use_mask):
    if framework == "jax":
        pytest.skip("JAX arrays are immutable; in-place merge is covered by the error test below")
    dtype, eps = DTYPES["bf16"]
    o, lse = _states(rng, 61, 2, 4, 64, dtype, empty_frac=0.3)
    a, b = np.ascontiguousarray(o[:, 0]), np.ascontiguousarray(o[:, 1])
    la, lb = np.ascontiguousarray(lse[:, 0]), np.ascontiguousarray(lse[:, 1])
    a[np.isneginf(la)] = 0  # a valid empty state has o = 0 (rows the mask leaves alone keep theirs)
    mask = rng.random(61) < 0.6 if use_mask else None
    ref_o, ref_lse = reference.merge_state(a, la, b, lb)
    if use_mask:
        ref_o[~mask], ref_lse[~mask] = a[~mask], la[~mask]
    ga, gla = framework.asarray(a), framework.asarray(la)
    cuinfer.merge_state_in_place(ga, gla, framework.asarray(b), framework.asarray(lb),
                                 mask=None if mask is None else framework.asarray(mask))  # fmt: skip
    # the user's own arrays changed: the kernel wrote through the DLPack pointer, no copy in between
    _check(framework.to_numpy(ga), framework.to_numpy(gla), ref_o, ref_lse, eps)


def test_in_place_on_jax_is_refused(rng):
    jax = pytest.importorskip("jax")
    o = jax.device_put(rng.standard_normal((4, 2, 64)).astype(np.float32))
    lse = jax.device_put(rng.standard_normal((4, 2)).astype(np.float32))
    with pytest.raises(ValueError, match="o must be writable.*JAX arrays are immutable"):
        cuinfer.merge_state_in_place(o, lse, o, lse)


def test_bad_inputs_raise_before_launch(framework, rng):
    f = framework.asarray
    o = f(rng.standard_normal((5, 3, 2, 128)).astype(np.float16))
    lse = f(rng.standard_normal((5, 3, 2)).astype(np.float32))
    with pytest.raises(ValueError, match=r"lse must have shape \(5, 3, 2\) but has shape \(5, 3\)"):
        cuinfer.merge_states(o, f(rng.standard_normal((5, 3)).astype(np.float32)))
    with pytest.raises(ValueError, match="lse must have dtype float32 but has dtype float16"):
        cuinfer.merge_states(o, f(rng.standard_normal((5, 3, 2)).astype(np.float16)))
    with pytest.raises(ValueError, match="head dim 96"):
        cuinfer.merge_states(f(rng.standard_normal((5, 3, 2, 96)).astype(np.float16)), lse)
    with pytest.raises(ValueError, match="o must have dtype one of float16, bfloat16, float32 but has dtype int32"):
        cuinfer.merge_states(f(rng.integers(0, 9, (5, 3, 2, 128)).astype(np.int32)), lse)
    a = f(rng.standard_normal((5, 2, 64)).astype(np.float32))
    la = f(rng.standard_normal((5, 2)).astype(np.float32))
    b = f(rng.standard_normal((5, 3, 64)).astype(np.float32))
    with pytest.raises(ValueError, match=r"o_b must have shape \(5, 2, 64\) but has shape"):
        cuinfer.merge_state(a, la, b, la)
    if framework != "jax":  # JAX slicing copies; torch / CuPy give a view with a non-unit last stride
        wide = f(rng.standard_normal((5, 3, 2, 256)).astype(np.float16))
        with pytest.raises(ValueError, match="o must have a contiguous last dimension"):
            cuinfer.merge_states(wide[..., ::2], lse)
