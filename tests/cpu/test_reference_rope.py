"""Reference RoPE and ALiBi slopes against hand-written values and the complex-number form of the rotation."""

from __future__ import annotations

import numpy as np
import pytest

from cuinfer import reference as R


@pytest.fixture
def rng(request):
    seed = int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"random seed for {request.node.name}: {seed}")
    return np.random.default_rng(seed)


def test_alibi_slopes_8_heads_by_hand():
    want = [2**-1, 2**-2, 2**-3, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8]  # 2^(-8(h+1)/8)
    got = R.alibi_slopes(8)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, want)


def test_alibi_slopes_12_heads_by_hand():
    # m = 8: 2^-1 .. 2^-8, then the odd-indexed slopes of the 16-head sequence 2^(-(2j+1)/2): 2^-0.5, 2^-1.5, ...
    want = [2.0 ** -(h + 1) for h in range(8)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    np.testing.assert_allclose(R.alibi_slopes(12), want, rtol=1e-15, atol=1e-13)


@pytest.mark.parametrize("n", [pytest.param(n, id=f"n{n}") for n in (1, 2, 3, 5, 6, 7, 16, 20, 28, 40, 64, 96)])
def test_alibi_slopes_match_paper_code(n):
    def power_of_2(m):
        start = 2 ** (-(2 ** -(np.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    def paper(m):
        if np.log2(m).is_integer():
            return power_of_2(m)
        closest = 2 ** int(np.floor(np.log2(m)))
        return power_of_2(closest) + paper(2 * closest)[0::2][: m - closest]

    np.testing.assert_allclose(R.alibi_slopes(n), paper(n), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    "bad", [pytest.param(0, id="zero"), pytest.param(-3, id="negative"), pytest.param(2.5, id="float")]
)
def test_alibi_slopes_reject_bad_counts(bad):
    with pytest.raises(ValueError, match="num_heads"):
        R.alibi_slopes(bad)


def complex_rope(x, pos, rotary_dim, interleave, scale, theta):
    """RoPE as a complex multiplication of each dimension pair, written without the reference's slicing."""
    r = rotary_dim
    half = r // 2
    if interleave:
        z = x[..., 0:r:2] + 1j * x[..., 1:r:2]
    else:
        z = x[..., :half] + 1j * x[..., half:r]
    freq = np.array([theta ** (-2.0 * i / r) for i in range(half)])
    z = z * np.exp(1j * (np.asarray(pos, float)[:, None, None] / scale) * freq)
    out = x.astype(np.float64).copy()
    if interleave:
        out[..., 0:r:2], out[..., 1:r:2] = z.real, z.imag
    else:
        out[..., :half], out[..., half:r] = z.real, z.imag
    return out


ROPE_CASES = [
    pytest.param(64, None, False, 1.0, 1e4, id="d64-full-halves"),
    pytest.param(64, None, True, 1.0, 1e4, id="d64-full-interleave"),
    pytest.param(128, 64, False, 8.0, 5e5, id="d128-rot64-scaled"),
    pytest.param(96, 32, True, 2.0, 1e6, id="d96-rot32-interleave"),
    pytest.param(10, 6, False, 1.0, 100.0, id="d10-rot6"),
]


@pytest.mark.parametrize(("d", "rotary_dim", "interleave", "scale", "theta"), ROPE_CASES)
def test_rope_matches_complex_form_and_preserves_norms(rng, d, rotary_dim, interleave, scale, theta):
    L, H = 13, 3
    x = rng.standard_normal((L, H, d))
    pos = rng.integers(0, 4097, size=L)
    y = R.rope(x, pos, rotary_dim=rotary_dim, interleave=interleave, rope_scale=scale, rope_theta=theta)
    r = d if rotary_dim is None else rotary_dim
    # angles reach ~4096 rad, so the sin/cos arguments carry ~4096·eps absolute error
    np.testing.assert_allclose(y, complex_rope(x, pos, r, interleave, scale, theta), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(y[..., r:], x[..., r:])  # dims past rotary_dim are untouched
    assert not np.allclose(y[..., :r], x[..., :r])  # and the rotated ones did move


def test_rope_relative_position_property(rng):
    # <rope(q, m), rope(k, n)> depends only on m - n: the reason RoPE exists.
    d = 32
    q, k = rng.standard_normal((1, 1, d)), rng.standard_normal((1, 1, d))
    dots = [np.sum(R.rope(q, [m + 5]) * R.rope(k, [m])) for m in (0, 17, 1000)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-10, atol=1e-13)


def test_rope_position_zero_is_identity(rng):
    x = rng.standard_normal((4, 2, 16))
    np.testing.assert_array_equal(R.rope(x, np.zeros(4)), x)


def test_apply_rope_offsets_equal_pos_ids(rng):
    lens, offsets = [3, 1, 5, 2], [0, 77, 9, 4000]
    indptr = np.cumsum([0, *lens])
    q, k = rng.standard_normal((indptr[-1], 6, 64)), rng.standard_normal((indptr[-1], 2, 64))
    pos_ids = np.concatenate([np.arange(n) + o for n, o in zip(lens, offsets, strict=True)])
    opts = dict(rotary_dim=32, interleave=True, rope_scale=3.0, rope_theta=5e5)
    qa, ka = R.apply_rope(q, k, indptr, offsets, **opts)
    qb, kb = R.apply_rope_pos_ids(q, k, pos_ids, **opts)
    np.testing.assert_array_equal(qa, qb)
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_allclose(qb, complex_rope(q, pos_ids, 32, True, 3.0, 5e5), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(kb, complex_rope(k, pos_ids, 32, True, 3.0, 5e5), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rotary_dim", [pytest.param(7, id="odd"), pytest.param(66, id="too-big")])
def test_rope_rejects_bad_rotary_dim(rng, rotary_dim):
    with pytest.raises(ValueError, match="rotary_dim"):
        R.rope(rng.standard_normal((2, 1, 64)), [0, 1], rotary_dim=rotary_dim)
