"""The public merge functions on NumPy inputs (CPU reference backend) and their input validation messages."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cuinfer


def test_numpy_inputs_use_the_reference_and_merge_correctly(rng):
    o = rng.standard_normal((9, 4, 3, 64))
    lse = rng.standard_normal((9, 4, 3)).astype(np.float32)
    out, out_lse = cuinfer.merge_states(o, lse)
    assert isinstance(out, np.ndarray) and out.shape == (9, 3, 64)
    # merging the 4 states pairwise in any order gives the same result (associative, commutative)
    ab = cuinfer.merge_state(o[:, 0], lse[:, 0], o[:, 1], lse[:, 1])
    cd = cuinfer.merge_state(o[:, 3], lse[:, 3], o[:, 2], lse[:, 2])
    full = cuinfer.merge_state(ab[0], ab[1].astype(np.float32), cd[0], cd[1].astype(np.float32))
    np.testing.assert_allclose(full[0], out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(full[1], out_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "o_shape,lse_shape,o_dtype,lse_dtype,match",
    [
        pytest.param(
            (5, 3, 2, 128),
            (5, 3),
            np.float16,
            np.float32,
            r"lse must have shape \(5, 3, 2\) but has shape \(5, 3\)",
            id="lse-shape",
        ),
        pytest.param(
            (5, 3, 2, 128),
            (5, 3, 2),
            np.float16,
            np.float16,
            "lse must have dtype float32 but has dtype float16",
            id="lse-dtype",
        ),
        pytest.param((5, 3, 2, 96), (5, 3, 2), np.float16, np.float32, "head dim 96", id="head-dim"),
        pytest.param(
            (5, 3, 2, 128),
            (5, 3, 2),
            np.int32,
            np.float32,
            "o must have dtype one of float16, bfloat16, float32.* but has dtype int32",
            id="o-dtype",
        ),
        pytest.param((5, 2, 128), (5, 2), np.float16, np.float32, "o must have 4 dimensions|o has 3 dim", id="ndim"),
    ],
)
def test_merge_states_validation_messages(rng, o_shape, lse_shape, o_dtype, lse_dtype, match):
    o = rng.standard_normal(o_shape).astype(o_dtype)
    lse = rng.standard_normal(lse_shape).astype(lse_dtype)
    with pytest.raises(ValueError, match=match):
        cuinfer.merge_states(o, lse)


def test_merge_state_pair_validation(rng):
    a = rng.standard_normal((5, 2, 64)).astype(ml_dtypes.bfloat16)
    la = rng.standard_normal((5, 2)).astype(np.float32)
    with pytest.raises(ValueError, match=r"o_b must have shape \(5, 2, 64\) but has shape"):
        cuinfer.merge_state(a, la, a[:, :1], la)
    with pytest.raises(ValueError, match="o_b has dtype float16|o_b.*float16"):
        cuinfer.merge_state(a, la, a.astype(np.float16), la)
    with pytest.raises(ValueError, match=r"lse_b must have shape \(5, 2\) but has shape \(5, 1\)"):
        cuinfer.merge_state(a, la, a, la[:, :1])
