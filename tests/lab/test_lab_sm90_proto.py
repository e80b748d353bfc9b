"""The Hopper prefill prototype (bench/lab/sm90/prefill_proto.cu) compiles for sm_90a as designed, without a GPU:
wgmma from shared-memory descriptors and from registers, no spills, and no serialised wgmma (ptxas C7513, which a
register written while an issued wgmma may still read triggers; the lab build refuses it). Its float64 reference
handles rows that see no key."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from bench.lab import sm90_proto


def _sass_ops(cubin: bytes) -> collections.Counter:
    from cuinfer.jit.sass import disassemble

    return collections.Counter(op for insns in disassemble(cubin).values() for op in insns)


@pytest.mark.parametrize(
    "stages, spec",
    [
        pytest.param(2, "", id="tma-overlap-pingpong-s2-causal"),
        pytest.param(3, "", id="tma-s3"),
        pytest.param(2, "noncausal", id="noncausal"),
        pytest.param(2, "-DPROTO_TMA=0", id="cp.async-producer-fence"),
        pytest.param(2, "-DPROTO_TMA=0+-DPROTO_OVERLAP=0+-DPROTO_PINGPONG=0", id="cp.async-sequential"),
        pytest.param(2, "-DPROTO_TMA=0+-DPROTO_PRODUCER_FENCE=0", id="cp.async-consumer-fence"),
        pytest.param(2, "causal+soft_cap:30", id="soft-cap"),
        pytest.param(2, "causal+soft_cap_approx:30", id="soft-cap-approx-user-variant"),
        pytest.param(2, "causal+alibi", id="alibi"),
        pytest.param(2, "causal+window:1024", id="window"),
        pytest.param(2, "-DPROTO_DYNAMIC=1", id="dynamic-units"),
    ],
)
def test_prototype_compiles_to_async_wgmma(stages, spec):
    pytest.importorskip("cuda.bindings")
    defines, chain = sm90_proto.parse_build(spec)
    cubin, log = sm90_proto.compile_cubin("bf16", stages, defines=defines, chain=chain)  # raises on C7513
    assert "0 bytes spill stores, 0 bytes spill loads" in log
    ops = _sass_ops(cubin)
    count = lambda prefix: sum(v for k, v in ops.items() if k.startswith(prefix))  # noqa: E731
    assert count("HGMMA") >= 16, ops  # m64n128k16: the Q·K^T (descriptors) and P·V (registers) bodies
    if "-DPROTO_TMA=0" not in defines:
        assert count("UTMALDG") >= 3 and count("LDGSTS") == 0, ops  # Q, K, V boxes (call sites may merge)
    else:
        assert count("LDGSTS") >= 48, ops  # the producer's cp.async: Q, K, V tiles, 16 each per thread
    assert count("LDL") == 0 and count("STL") == 0
    assert any(k.startswith("USETMAXREG") for k in ops)  # the producer gives registers to the consumers


def test_reference_rows_without_keys():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 2, 128))
    k = rng.standard_normal((3, 1, 128))
    v = rng.standard_normal((3, 1, 128))
    o, lse = sm90_proto.reference(q, k, v, [5], [3], 0.1, ("causal",))
    # bottom-right causal with 5 rows and 3 keys: rows 0 and 1 see no key, row 2 sees key 0 only
    assert np.all(o[:2] == 0) and np.all(np.isneginf(lse[:2]))
    np.testing.assert_allclose(o[2, 0], v[0, 0], rtol=1e-12)
    assert lse[2, 0] == pytest.approx(0.1 * (q[2, 0] @ k[0, 0]) / np.log(2))


def test_builds_parse_into_defines_and_chains():
    assert sm90_proto.parse_build("") == ((), ("causal",))
    assert sm90_proto.parse_build("noncausal") == ((), ())
    assert sm90_proto.parse_build("-DPROTO_TMA=0+GRID_UNITS") == (("-DPROTO_TMA=0", "GRID_UNITS"), ("causal",))
    assert sm90_proto.parse_build("causal+window:1024") == ((), ("causal", "window:1024"))
    assert sm90_proto.key_bounds(("causal", "soft_cap:30", "alibi")) == (True, -1)
    assert sm90_proto.key_bounds(("window:1024",)) == (False, 1024)
    vals = sm90_proto.chain_values(("causal", "soft_cap:30", "alibi", "window:7"), num_qo_heads=32)
    assert vals["alibi"] == {"num_qo_heads": 32} and vals["window"] == {"window_left": 7}
    assert vals["soft_cap"]["cap"] == 30.0
    with pytest.raises(ValueError, match="unknown variant piece"):
        sm90_proto.rendered_chain(("sliding",))


def test_reference_applies_the_chain_in_order():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((4, 2, 128))
    k = rng.standard_normal((6, 2, 128))
    v = rng.standard_normal((6, 2, 128))
    _, a = sm90_proto.reference(q, k, v, [4], [6], 0.2, ("alibi", "soft_cap:5"))
    _, b = sm90_proto.reference(q, k, v, [4], [6], 0.2, ("soft_cap:5", "alibi"))
    # by hand for row 0 (qpos 2), head 1 of 2: slope 2^(-8 (h + 1) / 2) = 2^-8
    s = 0.2 * (q[0, 1] @ k[:, 1].T)
    bias = 2.0**-8 * (np.arange(6) - 2)
    assert a[0, 1] == pytest.approx(np.log2(np.exp(5 * np.tanh((s + bias) / 5)).sum()))
    assert b[0, 1] == pytest.approx(np.log2(np.exp(5 * np.tanh(s / 5) + bias).sum()))
