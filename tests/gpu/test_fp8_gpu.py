"""fp8 KV caches on the GPU: the in-register conversions on all 256 codes, batch / single decode (both kernels) and
paged / ragged prefill against the float64 reference computed on the dequantised cache (torch, JAX and CuPy inputs).

Cases cover both formats (float8_e4m3fn, float8_e5m2), page sizes 1 and 16, head dims 64 / 128 / 256, GQA groups 1 /
4 / 8 (and 7), both decode kernels, bf16 and fp16 queries, per-tensor scales as numbers and per-KV-head scales as
device arrays, split-KV, variants (soft cap + window, ALiBi, causal), and decode against prefill with one query token
per request. K and V are drawn as N(0, 1) and quantised with ml_dtypes; the reference reads the same fp8 codes (so it
is exact on what the kernels see) and the scales, so the error left is the kernels' own: the 16-bit rounding of the
probabilities fed to mma and of o. Bounds (issue 18): |o - ref| <= 1e-2 + 0.2 |ref|; lse (never 16-bit) within 1e-3,
which catches a dropped or doubled tile, a wrong scale or a permuted head dim that the averaged o could hide.

Outputs are poisoned (``out=`` / ``lse=`` and the split-KV workspace NaN before each run), so an element the kernels
never write fails. A child process first runs a canary (one small case per kernel family): a kernel fault there fails
this module without poisoning the CUDA context of the rest of the GPU suite.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest

from cuinfer import reference
from cuinfer.reference import fp8 as fp8_ref

pytestmark = pytest.mark.gpu

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

Q_DTYPES = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}
FORMATS = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
F8_TYPES = {"float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}  # their CUDA types
ATOL, RTOL, LSE_TOL = 1e-2, 2e-1, 1e-3

MIX6 = (1, 17, 513, 2049, 0, 77)
MIX40 = tuple((1, 17, 130, 513)[i % 4] if i != 9 else 4097 for i in range(40))
LONG1 = (9001,)
# 2400 short requests x 8 KV heads: more work items per CTA than its shared-memory item chunk holds (64), so the
# producers reload the chunk mid-stream (a block barrier the warp-local fp8 tiles must reach in step)
MANY = tuple((i * 37) % 97 + 1 for i in range(2400))


def _framework(name: str):
    from conftest import _load_framework

    return _load_framework(name)


def _quantise(x: np.ndarray, fmt: str) -> np.ndarray:
    return x.astype(getattr(ml_dtypes, fmt))


def _check(o, lse, ref_o, ref_lse, what: str = "o", unnormalised: bool = False) -> None:
    """o within 1e-2 + 0.2 |ref|; ``unnormalised`` (sigmoid attention: o is a sum of weights times values, not an
    average) adds 4 u_bf16 times the row's rms, as test_variant_builtins_gpu.py allows: the kernel rounds each weight
    to 16 bits before P·V, an error of up to 2^-9 |p_j v_j| per key that cancelling terms do not shrink."""
    o = np.asarray(o, np.float64)
    assert np.isfinite(o).all(), f"{what} has NaN/inf: an element was never written (outputs are poisoned with NaN)"
    err = np.abs(o - ref_o)
    bound = ATOL + RTOL * np.abs(ref_o)
    if unnormalised:
        bound = bound + 4 * 2.0**-8 * np.sqrt(np.mean(ref_o**2, axis=-1, keepdims=True))
    if (err > bound).any():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        raise AssertionError(
            f"{what}: {(err > bound).sum()} of {err.size} elements beyond 1e-2 + 0.2 |ref|; worst at {i}: got "
            f"{o[i]:.6f}, want {ref_o[i]:.6f}"
        )
    if lse is None:
        return
    lse = np.asarray(lse, np.float64)
    empty = np.isneginf(ref_lse)
    assert np.isneginf(lse[empty]).all(), f"{what}: a row with no keys must have lse = -inf"
    assert (o[empty] == 0).all(), f"{what}: a row with no keys must have o = 0 exactly"
    np.testing.assert_allclose(lse[~empty], ref_lse[~empty], rtol=LSE_TOL, atol=LSE_TOL, err_msg=f"lse of {what}")


def _poison_workspace(w) -> None:
    if w._buffers is not None:
        w._buffers.workspace.fill(0xFF)  # 0xFFFFFFFF is a float32 NaN


def _poison_cupy_pool(nbytes: int = 64 << 20) -> None:
    import cupy

    x = cupy.full(nbytes // 4, np.nan, dtype=np.float32)
    del x


def _device_scales(fw, values: np.ndarray | None):
    return None if values is None else fw.asarray(values.astype(np.float32))


# ---- the conversions on all 256 codes -------------------------------------------------------------------------------


def _probe(kernel: str, targs: str, n: int, dtype, threads: int) -> np.ndarray:
    """debug/fp8_probe.cu's `kernel<targs>` run by one block of `threads` threads into n zeros of dtype: the output."""
    import cupy

    from cuinfer.jit import KernelSpec, get_kernel

    expr = f"cuinfer::{kernel}<{targs}>"
    spec = KernelSpec(name=f"test/{kernel}/{targs.replace(', ', '/')}", source="debug/fp8_probe.cu", name_exprs=(expr,))
    out = cupy.zeros(n, dtype=dtype)
    get_kernel(spec, expr, 0).launch(1, threads, (out,))
    return out.get()


def _device_arch() -> int:
    from cuinfer.runtime.device import device_info

    cc = device_info(0).compute_capability
    return cc[0] * 10 + cc[1]


# the probes' 32-bit words: thread i converts codes 4i, 4i + 1, 4i + 2, 4i + 3 (bytes 0-3)
PROBE_WORDS = np.arange(64, dtype=np.uint32) * 0x04040404 + 0x03020100


@pytest.mark.parametrize("fmt", FORMATS.values())
@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_device_conversion_matches_the_emulation(fmt, target):
    """The device's fp8 -> 16-bit pairs (common/fp8.cuh, through debug/fp8_probe.cu) give, for every code in every
    byte position, exactly what the NumPy emulation gives (which the CPU tests pin against ml_dtypes): finite codes
    exactly their value, non-finite codes what the emulation documents."""
    arch = _device_arch()
    ct = {"float16": "half", "bfloat16": "__nv_bfloat16"}[target]
    # [thread i][pair k][half]: codes 4i + (0,1), (2,3), (0,2), (1,3)
    got = _probe("fp8_probe", f"{ct}, {F8_TYPES[fmt]}", 512, np.uint16, 64).reshape(64, 4, 2)
    t = np.dtype(ml_dtypes.bfloat16) if target == "bfloat16" else np.dtype(np.float16)
    want = fp8_ref.convert(np.arange(256, dtype=np.uint8), fmt, target, arch).view(np.uint16)
    i = np.arange(64)[:, None]
    codes = np.stack([4 * i + np.array([0, 1]), 4 * i + np.array([2, 3]), 4 * i + np.array([0, 2]),
                      4 * i + np.array([1, 3])], axis=1)  # fmt: skip
    w = want[codes]
    gv, wv = got.view(t).astype(np.float64), w.view(t).astype(np.float64)
    same = (got == w) | (np.isnan(gv) & np.isnan(wv))  # (a NaN's payload is the hardware's)
    assert same.all(), f"codes {np.unique(codes[~same])} differ: got {gv[~same][:8]}, want {wv[~same][:8]}"
    fin = np.isfinite(fp8_ref.exact(codes, fmt))
    np.testing.assert_array_equal(gv[fin], fp8_ref.exact(codes, fmt)[fin])

    fout = _probe("fp8_probe_float", F8_TYPES[fmt], 256, np.float32, 32)
    ex = fp8_ref.exact(np.arange(256), fmt)
    fin = np.isfinite(ex)
    np.testing.assert_array_equal(fout[fin], ex[fin].astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS.values())
def test_device_f16s_pairs_match_the_emulation(fmt):
    """fp8::f16s_pairs (the decode tensor-core kernel's float16 fragments, through debug/fp8_probe.cu) gives, for every
    code in every byte position, the emulation's bits: finite codes their value times 2^-kPow."""
    out = _probe("fp8_probe_f16s", F8_TYPES[fmt], 256, np.uint16, 64)
    p02, p13 = fp8_ref.f16s_pairs(PROBE_WORDS, fmt)
    want = np.stack([p02 & 0xFFFF, p02 >> 16, p13 & 0xFFFF, p13 >> 16], axis=1).astype(np.uint16).reshape(-1)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("fmt", FORMATS.values())
@pytest.mark.parametrize("probe", ["kpairs", "vpairs"])
def test_device_pairs_match_the_emulation(fmt, probe):
    """fp8::k_pairs / fp8::v_pairs (the decode tensor-core kernel's K fragments: bytes (0, 1) and (2, 3), e4m3 by cvt
    on sm_89+; its V fragments: bytes (0, 2) and (1, 3), e4m3 by a byte permute and cvt on sm_89+) give, for every
    code in every byte position, the emulation's bits (a NaN's payload is the hardware's): finite codes their value
    times 2^-kPowK / 2^-kPowV."""
    arch = _device_arch()
    got = _probe(f"fp8_probe_{probe}", F8_TYPES[fmt], 256, np.uint16, 64)
    emulate, pow_of = (
        (fp8_ref.k_pairs, fp8_ref.k_pairs_pow) if probe == "kpairs" else (fp8_ref.v_pairs, fp8_ref.v_pairs_pow)
    )
    lo, hi = emulate(PROBE_WORDS, fmt, arch)
    want = np.stack([lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16], axis=1).astype(np.uint16).reshape(-1)
    gv, wv = got.view(np.float16).astype(np.float64), want.view(np.float16).astype(np.float64)
    same = (got == want) | (np.isnan(gv) & np.isnan(wv))
    assert same.all(), f"codes {np.flatnonzero(~same)} differ: got {gv[~same][:8]}, want {wv[~same][:8]}"
    codes = np.arange(256)
    if probe == "vpairs":
        codes = codes.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(-1)  # (the outputs' code order)
    ex = fp8_ref.exact(codes, fmt)
    fin = np.isfinite(ex)
    np.testing.assert_array_equal(gv[fin] * 2.0 ** pow_of(fmt, arch), ex[fin])


# ---- batch decode -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    lens: tuple
    page_size: int
    heads: tuple  # (num_qo_heads, num_kv_heads)
    head_dim: int
    fmt: str = "e4m3"
    q: str = "bf16"
    tensor_cores: bool | None = None
    layout: str = "NHD"
    framework: str = "torch"
    split: int | None = None
    scales: str = "numbers"  # "none", "numbers", "heads" (device arrays, one value per KV head), "one" (array of 1)
    cache: str = "5d"  # or "tuple"; "offset" (torch): the 5-d cache 16 bytes into a larger buffer (rows not aligned)
    opts: dict = field(default_factory=dict)
    ramp: float = 0.0  # keys of a request's i-th of n pages times 1 + ramp * i / n: the rows' max keeps climbing


CASES = [
    pytest.param(Case(MIX6, 16, (32, 8), 128), id="d10-shape-e4m3-bf16-p16-g4-tc"),
    pytest.param(Case(MIX6, 16, (32, 8), 128, tensor_cores=False), id="e4m3-bf16-p16-g4-cc"),
    pytest.param(Case(MIX6, 1, (32, 8), 128, "e5m2", "fp16"), id="e5m2-fp16-p1-g4-tc"),
    pytest.param(Case(MIX6, 1, (8, 8), 64, "e5m2", framework="cupy"), id="e5m2-bf16-p1-g1-d64-cc-cupy-uint8"),
    pytest.param(Case(MIX6, 16, (8, 8), 256, "e4m3", "fp16", framework="jax"), id="e4m3-fp16-p16-g1-d256-cc-jax"),
    pytest.param(Case(MIX6, 16, (64, 8), 256, scales="heads"), id="e4m3-bf16-p16-g8-d256-tc-head-scales"),
    pytest.param(Case(MIX6, 1, (64, 8), 64, "e5m2", layout="HND"), id="e5m2-bf16-p1-g8-d64-tc-hnd"),
    pytest.param(Case(MIX6, 16, (32, 4), 64, "e4m3", "fp16", cache="tuple"), id="e4m3-fp16-p16-g8-d64-tc-tuple"),
    pytest.param(Case(MIX6, 16, (28, 4), 128, "e5m2", scales="one", framework="cupy"), id="e5m2-g7-tc-one-scale"),
    pytest.param(Case(MIX40, 16, (32, 8), 128, split=256, scales="heads"), id="b40-e4m3-tc-split256-head-scales"),
    pytest.param(
        Case(MIX40, 1, (16, 16), 128, "e5m2", split=512, scales="heads", framework="cupy"),
        id="b40-e5m2-p1-g1-cc-split512-head-scales",
    ),
    # split pieces of one and of three 128-token tiles (kernels.cuh PendingPiece: settled at once / just flagged)
    pytest.param(Case(MIX40, 16, (32, 8), 128, split=128), id="b40-e4m3-tc-split128-one-tile-pieces"),
    pytest.param(Case(MIX40, 16, (32, 8), 128, split=384, scales="heads"), id="b40-e4m3-tc-split384-three-tile-pieces"),
    pytest.param(Case(LONG1, 16, (32, 8), 128, scales="none"), id="b1long-e4m3-tc-no-scales"),
    pytest.param(Case(MANY, 16, (32, 8), 128, scales="heads"), id="b2400-e4m3-tc-item-chunk-reload"),
    pytest.param(Case(MIX6, 16, (32, 8), 128, opts={"logits_soft_cap": 30.0, "window_left": 300}), id="softcap-window"),
    pytest.param(Case(MIX6, 16, (32, 8), 128, tensor_cores=False, opts={"pos_encoding": "alibi"}), id="alibi-cc"),
    # logits rising along the keys (the max climbs by far more than the lazy softmax's slack of 2^8 over the tiles:
    # the rescale of o runs on some tiles and is skipped on others, softmax_fp8)
    pytest.param(Case(MIX6, 16, (32, 8), 128, ramp=6.0), id="rising-logits-e4m3-tc"),
    # a page size that is no power of two (the fp8 producer's integer division; powers of two take a shift)
    pytest.param(Case(MIX6, 5, (32, 8), 128), id="e4m3-p5-tc"),
    pytest.param(Case(MIX6, 12, (8, 8), 128, "e5m2", "fp16"), id="e5m2-p12-cc"),
    # a cache whose base is not a multiple of a row's bytes: the tile producer's 64-bit address adds (aligned caches
    # take a logic op per copy, pipeline.cuh)
    pytest.param(Case(MIX6, 16, (32, 8), 128, cache="offset"), id="e4m3-tc-unaligned-rows"),
    pytest.param(Case(MIX6, 16, (32, 8), 128, tensor_cores=False, cache="offset"), id="e4m3-cc-unaligned-rows"),
    pytest.param(Case(LONG1, 16, (32, 8), 128, "e5m2", "fp16", scales="heads", ramp=6.0), id="rising-logits-e5m2-long"),
]


def _build(rng, c: Case):
    hq, hkv = c.heads
    d, ps = c.head_dim, c.page_size
    lens = np.asarray(c.lens)
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(indptr[-1]) + 3
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = np.where(pages > 0, lens - (pages - 1) * ps, 1).astype(np.int32)
    shape = (num_pages, 2, ps, hkv, d) if c.layout == "NHD" else (num_pages, 2, hkv, ps, d)
    raw = rng.standard_normal(shape, dtype=np.float32)
    if c.ramp:
        for b, n in enumerate(pages):
            for i in range(n):
                raw[indices[indptr[b] + i], 0] *= 1 + c.ramp * i / n
    cache = _quantise(raw, FORMATS[c.fmt])
    q = (2 * rng.standard_normal((lens.shape[0], hq, d), dtype=np.float32)).astype(Q_DTYPES[c.q])
    return q, cache, indptr, indices, last


def _scales(rng, c: Case):
    """(k_scale, v_scale) for the reference (numbers or float64 per KV head) and the kind run() gets."""
    hkv = c.heads[1]
    if c.scales == "none":
        return None, None
    if c.scales == "numbers":
        return 0.37, 1.9
    if c.scales == "one":
        return np.array([0.61]), np.array([1.3])
    return rng.uniform(0.2, 2.0, hkv), rng.uniform(0.2, 2.0, hkv)


@pytest.mark.parametrize("c", CASES)
def test_batch_decode_fp8(rng, c: Case):
    from cuinfer.decode import BatchDecode

    fw = _framework(c.framework)
    hq, hkv = c.heads
    q, cache, indptr, indices, last = _build(rng, c)
    ks, vs = _scales(rng, c)
    ref_o, ref_lse = reference.batch_decode_paged(
        q, cache, indptr, indices, last, kv_layout=c.layout, k_scale=ks, v_scale=vs, **c.opts
    )
    w = BatchDecode(kv_layout=c.layout, use_tensor_cores=c.tensor_cores)
    w.plan(
        indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=c.head_dim, page_size=c.page_size,
        q_dtype=Q_DTYPES[c.q], kv_dtype=FORMATS[c.fmt], fixed_split_size=c.split, **c.opts,
    )  # fmt: skip
    if c.split is not None:
        assert w._plan.work.num_partial_rows > 0, "the fixed split size must split something"
    if c.lens is MANY:
        assert np.diff(np.asarray(w._plan.work.work_indptr)).max() > 64, "a CTA must hold more items than a chunk"
    kv = (fw.asarray(cache[:, 0]), fw.asarray(cache[:, 1])) if c.cache == "tuple" else fw.asarray(cache)
    if c.cache == "offset":
        flat = fw.module.empty(kv.numel() + 16, dtype=kv.dtype, device=kv.device)
        flat[16:].copy_(kv.reshape(-1))
        kv = flat[16:].view(kv.shape)
        assert kv.data_ptr() % (c.head_dim * kv.element_size()) != 0
    run_ks = ks if c.scales in ("none", "numbers") else _device_scales(fw, ks)
    run_vs = vs if c.scales in ("none", "numbers") else _device_scales(fw, vs)
    gq = fw.asarray(q)
    if c.framework == "jax":
        _poison_cupy_pool()
        _poison_workspace(w)
        o, lse = w.run(gq, kv, return_lse=True, k_scale=run_ks, v_scale=run_vs)
    else:
        out = fw.asarray(np.full(q.shape, np.nan, Q_DTYPES[c.q]))
        lse_buf = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
        _poison_workspace(w)
        o, lse = w.run(gq, kv, out=out, lse=lse_buf, k_scale=run_ks, v_scale=run_vs)
        assert o is out and lse is lse_buf
    _check(fw.to_numpy(o), fw.to_numpy(lse), ref_o, ref_lse)


@pytest.mark.parametrize(
    ("fw_name", "fmt", "kv_len", "heads", "d"),
    [
        pytest.param("torch", "e4m3", 9001, (32, 8), 128, id="torch-e4m3-9001-tc-split"),
        pytest.param("cupy", "e5m2", 17, (8, 8), 64, id="cupy-e5m2-17-cc"),
        pytest.param("jax", "e4m3", 513, (16, 2), 256, id="jax-e4m3-513-d256-tc"),
    ],
)
def test_single_decode_fp8(rng, fw_name, fmt, kv_len, heads, d):
    from cuinfer.decode import single_decode

    fw = _framework(fw_name)
    hq, hkv = heads
    q = (2 * rng.standard_normal((hq, d), dtype=np.float32)).astype(ml_dtypes.bfloat16)
    k = _quantise(rng.standard_normal((kv_len, hkv, d), dtype=np.float32), FORMATS[fmt])
    v = _quantise(rng.standard_normal((kv_len, hkv, d), dtype=np.float32), FORMATS[fmt])
    ref_o, ref_lse = reference.attention(q[None], k, v, k_scale=0.8, v_scale=1.5)
    o, lse = single_decode(fw.asarray(q), fw.asarray(k), fw.asarray(v), kv_dtype=FORMATS[fmt], k_scale=0.8,
                           v_scale=1.5, return_lse=True)  # fmt: skip
    _check(fw.to_numpy(o), fw.to_numpy(lse), ref_o[0], ref_lse[0])


# ---- prefill ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PCase:
    qo: tuple
    kv: tuple
    page: int | None  # page size, None = ragged
    heads: tuple
    head_dim: int
    fmt: str = "e4m3"
    q: str = "bf16"
    causal: bool = True
    scales: str = "numbers"
    framework: str = "cupy"
    opts: dict = field(default_factory=dict)
    tiles: tuple | None = None
    q_rows: str = "normal"  # "spread": each (token, head) row of q times 2^U[-14, 4], some zero, some beyond float16
    backend: str = "auto"  # BatchPrefill(backend=...); "sm90" skips off Hopper


PCASES = [
    # the Hopper kernel (backend="sm90"): fp8 rows staged by its producer and converted to q's dtype in shared memory
    pytest.param(PCase((577, 1300, 1), (4097, 1300, 130), 16, (32, 8), 128, backend="sm90"), id="sm90-paged-p16-e4m3"),
    pytest.param(
        PCase((700, 300), (1000, 1500), None, (64, 8), 128, "e5m2", "fp16", backend="sm90"),
        id="sm90-ragged-e5m2-fp16-g8",
    ),
    pytest.param(
        PCase((600, 333), (1200, 333), 1, (8, 8), 128, "e5m2", scales="heads", q_rows="spread", backend="sm90"),
        id="sm90-paged-p1-e5m2-g1-head-scales",
    ),
    pytest.param(
        PCase(
            (1000, 257),
            (1000, 3000),
            None,
            (32, 8),
            128,
            backend="sm90",
            opts={"logits_soft_cap": 30.0, "window_left": 700},
        ),
        id="sm90-ragged-softcap-window",
    ),
    pytest.param(
        PCase((640, 129), (2000, 700), 16, (32, 8), 128, causal=False, backend="sm90", opts={"pos_encoding": "alibi"}),
        id="sm90-paged-alibi-noncausal",
    ),
    # pages of 48 slots: TMA boxes of 16 slots at three offsets in a page; of 24: the cp.async staging
    pytest.param(PCase((300, 1000), (2000, 1001), 48, (32, 8), 128, "e5m2", backend="sm90"), id="sm90-paged-p48-e5m2"),
    pytest.param(PCase((300, 1000), (1500, 1001), 24, (16, 4), 128, backend="sm90"), id="sm90-paged-p24-e4m3"),
    pytest.param(PCase((577, 17, 1), (4097, 54, 130), 16, (32, 8), 128), id="paged-p16-e4m3-bf16-g4-d128-causal"),
    # float16 Q·K^T (bf16 q, the CTA converting, sm_90: PrefillTraits::kHalfQK): each warp scales its Q rows by the
    # power of two of their largest |q|; rows of very different size, zero rows and q beyond float16's range, with
    # the k scale folded from arrays or numbers (P4's tiles: paged 128 x 64)
    pytest.param(PCase((577, 17, 1), (4097, 54, 130), 16, (32, 8), 128, q_rows="spread"), id="paged-p4-tiles-spread-q"),
    pytest.param(
        PCase((600, 33), (1200, 33), 16, (32, 8), 128, scales="heads", q_rows="spread"), id="paged-spread-q-head-scales"
    ),
    pytest.param(PCase((300, 5), (300, 97), None, (32, 8), 128, "e5m2", q_rows="spread"), id="ragged-e5m2-spread-q"),
    # fp8 rows of head dim 128 copied by 4 threads each (kKVPairRows) on the tiles that split the keys over warps
    pytest.param(
        PCase((1, 3, 1), (513, 70, 2049), 16, (32, 8), 128, tiles=(16, 64, 2, 1, True)), id="paged-q16-d128-convert"
    ),
    pytest.param(
        PCase((9, 30), (700, 300), 16, (32, 8), 128, "e5m2", tiles=(32, 64, 2, 1, True)), id="paged-q32-d128-convert"
    ),
    pytest.param(PCase((127, 37), (512, 97), 1, (32, 8), 64, "e5m2", "fp16"), id="paged-p1-e5m2-fp16-g4-d64"),
    pytest.param(PCase((300, 5), (300, 97), None, (8, 8), 256, causal=False), id="ragged-e4m3-g1-d256"),
    pytest.param(PCase((200, 17, 33), (2048, 54, 33), None, (64, 8), 128, "e5m2"), id="ragged-e5m2-g8-d128"),
    pytest.param(
        PCase((97, 1, 40), (512, 200, 40), 16, (32, 4), 64, scales="heads", framework="torch"),
        id="paged-g8-d64-head-scales-torch",
    ),
    pytest.param(
        PCase((64, 300), (1000, 300), 16, (32, 8), 128, opts={"logits_soft_cap": 30.0, "window_left": 200}),
        id="paged-softcap-window",
    ),
    # ALiBi: KV tiles run backwards (prefill loader.cuh TileOrder), by the CTA's conversion and by each warp's
    pytest.param(
        PCase((577, 17, 1), (4097, 54, 130), 16, (32, 8), 128, opts={"pos_encoding": "alibi"}), id="paged-alibi"
    ),
    pytest.param(
        PCase((577, 17), (900, 54), 16, (32, 8), 128, tiles=(128, 32, 3, 1, False), opts={"pos_encoding": "alibi"}),
        id="paged-q128-per-warp-alibi",
    ),
    pytest.param(
        PCase((200, 17, 33), (2048, 54, 33), None, (64, 8), 128, "e5m2", opts={"pos_encoding": "alibi"}),
        id="ragged-e5m2-alibi",
    ),
    pytest.param(PCase((1, 1, 1), (513, 17, 2049), 16, (32, 8), 128, tiles=(16,)), id="paged-decode-like-q16"),
    pytest.param(PCase((130, 70), (130, 600), None, (28, 4), 128, tiles=(32,), framework="jax"), id="ragged-q32-g7"),
    # both conversion modes on the tiles whose policy picks the other: per warp on 128-row tiles, by the CTA on 16 rows
    pytest.param(PCase((577, 17), (900, 54), 16, (32, 8), 128, tiles=(128, 64, 3, 1, False)), id="paged-q128-per-warp"),
    pytest.param(
        PCase((1, 3, 1), (513, 70, 2049), 1, (32, 8), 64, "e5m2", "fp16", tiles=(16, 64, 2, 1, True)),
        id="paged-q16-cta-converts",
    ),  # fmt: skip
]


def _pbuild(rng, c: PCase):
    hq, hkv = c.heads
    d = c.head_dim
    qo, kvl = np.asarray(c.qo), np.asarray(c.kv)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    q = 2 * rng.standard_normal((int(qo.sum()), hq, d), dtype=np.float32)
    if c.q_rows == "spread":
        q *= 2.0 ** rng.integers(-14, 5, q.shape[:2])[..., None]
        q[rng.random(q.shape[:2]) < 0.02] = 0.0
        q[q.shape[0] // 2, 0, 0] = 7.0e4  # (beyond float16's 65504: that warp's scale is below 1)
    q = q.astype(Q_DTYPES[c.q])
    fmt = FORMATS[c.fmt]
    if c.page is None:
        kv_indptr = np.concatenate([[0], np.cumsum(kvl)]).astype(np.int32)
        k = _quantise(rng.standard_normal((int(kvl.sum()), hkv, d), dtype=np.float32), fmt)
        v = _quantise(rng.standard_normal((int(kvl.sum()), hkv, d), dtype=np.float32), fmt)
        return q, qo_indptr, kv_indptr, None, None, (k, v)
    ps = c.page
    pages = (kvl + ps - 1) // ps
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(kv_indptr[-1]) + 2
    indices = rng.permutation(num_pages)[: kv_indptr[-1]].astype(np.int32)
    last = (kvl - (pages - 1) * ps).astype(np.int32)
    cache = _quantise(rng.standard_normal((num_pages, 2, ps, hkv, d), dtype=np.float32), fmt)
    return q, qo_indptr, kv_indptr, indices, last, cache


def _pscales(rng, c: PCase):
    return _scales(rng, Case((), 1, c.heads, c.head_dim, scales=c.scales))


@pytest.mark.parametrize("c", PCASES)
def test_batch_prefill_fp8(rng, c: PCase):
    from cuinfer.prefill import BatchPrefill
    from cuinfer.runtime.device import current_device_id, device_info

    if c.backend == "sm90" and device_info(current_device_id()).arch != "sm_90a":
        pytest.skip("backend='sm90' needs an sm_90 GPU")
    fw = _framework(c.framework)
    hq, hkv = c.heads
    q, qo_indptr, kv_indptr, indices, last, kv = _pbuild(rng, c)
    ks, vs = _pscales(rng, c)
    if c.page is None:
        ref_o, ref_lse = reference.batch_attention_ragged(
            q, kv[0], kv[1], qo_indptr, kv_indptr, causal=c.causal, k_scale=ks, v_scale=vs, **c.opts
        )
    else:
        ref_o, ref_lse = reference.batch_prefill_paged(
            q, kv, qo_indptr, kv_indptr, indices, last, causal=c.causal, k_scale=ks, v_scale=vs, **c.opts
        )
    w = BatchPrefill(paged=c.page is not None, backend=c.backend)
    w.plan(
        qo_indptr, kv_indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=c.head_dim,
        page_size=c.page or 1, causal=c.causal, q_dtype=Q_DTYPES[c.q], kv_dtype=FORMATS[c.fmt], tile_sizes=c.tiles,
        **c.opts,
    )  # fmt: skip
    assert c.backend == "auto" or w.plan_backend == c.backend
    run_ks = ks if c.scales in ("none", "numbers") else _device_scales(fw, ks)
    run_vs = vs if c.scales in ("none", "numbers") else _device_scales(fw, vs)
    arrays = (fw.asarray(kv),) if c.page is not None else (fw.asarray(kv[0]), fw.asarray(kv[1]))
    if c.framework == "jax":
        _poison_cupy_pool()
        _poison_workspace(w)
        o, lse = w.run(fw.asarray(q), *arrays, return_lse=True, k_scale=run_ks, v_scale=run_vs)
    else:
        out = fw.asarray(np.full(q.shape, np.nan, Q_DTYPES[c.q]))
        lse_buf = fw.asarray(np.full(q.shape[:2], np.nan, np.float32))
        _poison_workspace(w)
        o, lse = w.run(fw.asarray(q), *arrays, out=out, lse=lse_buf, k_scale=run_ks, v_scale=run_vs)
    _check(fw.to_numpy(o), fw.to_numpy(lse), ref_o, ref_lse)


@pytest.mark.parametrize(
    ("fmt", "page", "heads", "d"),
    [
        pytest.param("e4m3", 16, (32, 8), 128, id="e4m3-p16-g4-d128"),
        pytest.param("e5m2", 1, (8, 8), 64, id="e5m2-p1-g1-d64"),
        pytest.param("e4m3", 1, (64, 8), 256, id="e4m3-p1-g8-d256"),
    ],
)
def test_decode_equals_prefill_with_one_query_token(rng, fmt, page, heads, d):
    """The decode kernels and the prefill kernel (qo_len 1 per request) on one fp8 cache agree (within the bounds:
    different kernels round the probabilities differently)."""
    import cupy

    from cuinfer.decode import BatchDecode
    from cuinfer.prefill import BatchPrefill

    hq, hkv = heads
    c = Case(MIX6, page, heads, d, fmt)
    q, cache, indptr, indices, last = _build(rng, c)
    gq, gc = cupy.asarray(q), cupy.asarray(cache.view(np.uint8))
    dec = BatchDecode()
    dec.plan(indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=page,
             q_dtype="bfloat16", kv_dtype=FORMATS[fmt])  # fmt: skip
    od, ld = dec.run(gq, gc, k_scale=0.5, v_scale=2.0, return_lse=True)
    pre = BatchPrefill(paged=True)
    qo = np.arange(len(MIX6) + 1, dtype=np.int32)
    pre.plan(qo, indptr, indices, last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=page,
             q_dtype="bfloat16", kv_dtype=FORMATS[fmt])  # fmt: skip
    op, lp = pre.run(gq, gc, k_scale=0.5, v_scale=2.0, return_lse=True)
    ref_o, ref_lse = reference.batch_decode_paged(q, cache, indptr, indices, last, k_scale=0.5, v_scale=2.0)
    _check(od.get(), ld.get(), ref_o, ref_lse, "decode")
    _check(op.get(), lp.get(), ref_o, ref_lse, "prefill")
    _check(op.get(), lp.get(), od.get().astype(np.float64), ld.get().astype(np.float64), "prefill vs decode")


# ---- fp8 with the variants: sinks (arrays given at run()) and sigmoid (no softmax) ----------------------------------


@pytest.mark.parametrize("variant", ["sinks", "sigmoid"])
@pytest.mark.parametrize(
    ("kernel", "tiles"),
    [
        pytest.param("decode-tc", None, id="decode-tc"),
        pytest.param("decode-cc", None, id="decode-cc"),
        pytest.param("paged", None, id="paged"),
        pytest.param("paged", (128, None, None, None, False), id="paged-fragments"),  # (the other conversion mode)
        pytest.param("ragged", None, id="ragged"),
    ],
)
def test_fp8_with_variants_against_the_numpy_route(rng, variant, kernel, tiles):
    """fp8 K/V (a CuPy uint8 cache), per-KV-head scale arrays on the GPU and the sinks / sigmoid variants: the GPU
    result against the NumPy route of the same plan (the float64 reference on the dequantised cache through the
    variant's steps, itself checked against a per-head loop in tests/cpu/test_fp8_host.py)."""
    import cupy

    from cuinfer.decode import BatchDecode
    from cuinfer.prefill import BatchPrefill

    hq, hkv, d, ps = 32, 8, 128, 16
    c = Case(MIX6, ps, (hq, hkv), d)
    q, cache, indptr, indices, last = _build(rng, c)
    ks, vs = rng.uniform(0.2, 2.0, hkv), rng.uniform(0.2, 2.0, hkv)
    kw = dict(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, q_dtype="bfloat16", kv_dtype="float8_e4m3fn")
    sinks = rng.uniform(-2.0, 2.0, hq).astype(np.float32)
    if variant == "sinks":
        kw["variant"] = "sinks"
    else:
        kw.update(variant="sigmoid", variant_params={"sigmoid": {"bias": -1.0}})
    if kernel.startswith("decode"):
        w = BatchDecode(use_tensor_cores=kernel == "decode-tc")
        w.plan(indptr, indices, last, page_size=ps, **kw)
        host, dev = (q, cache), (cupy.asarray(q), cupy.asarray(cache.view(np.uint8)))
    else:
        lens = np.asarray(MIX6)
        qo_lens = np.minimum(lens, 37)
        qo = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
        q = (2 * rng.standard_normal((int(qo[-1]), hq, d), dtype=np.float32)).astype(ml_dtypes.bfloat16)
        w = BatchPrefill(paged=kernel == "paged")
        if kernel == "paged":
            w.plan(qo, indptr, indices, last, page_size=ps, causal=True, tile_sizes=tiles, **kw)
            host, dev = (q, cache), (cupy.asarray(q), cupy.asarray(cache.view(np.uint8)))
        else:
            kv_indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            k = _quantise(rng.standard_normal((int(kv_indptr[-1]), hkv, d), dtype=np.float32), "float8_e4m3fn")
            v = _quantise(rng.standard_normal((int(kv_indptr[-1]), hkv, d), dtype=np.float32), "float8_e4m3fn")
            w.plan(qo, kv_indptr, causal=True, **kw)
            host = (q, k, v)
            dev = (cupy.asarray(q), cupy.asarray(k.view(np.uint8)), cupy.asarray(v.view(np.uint8)))
    arrays = {"sinks": sinks} if variant == "sinks" else None
    ref_o, ref_lse = w.run(*host, k_scale=ks, v_scale=vs, variant_arrays=arrays, return_lse=True)
    _poison_workspace(w)
    dev_arrays = None if arrays is None else {"sinks": cupy.asarray(sinks)}
    o, lse = w.run(*dev, k_scale=cupy.asarray(ks.astype(np.float32)), v_scale=cupy.asarray(vs.astype(np.float32)),
                   variant_arrays=dev_arrays, return_lse=True)  # fmt: skip
    _check(o.get(), lse.get(), np.asarray(ref_o, np.float64), np.asarray(ref_lse, np.float64), f"{kernel}/{variant}",
           unnormalised=variant == "sigmoid")  # fmt: skip


def test_gpu_fp8_errors_before_launch(rng):
    """Bad fp8 inputs raise on the GPU path as on the NumPy path, before anything is launched."""
    import cupy

    from cuinfer.decode import BatchDecode

    c = Case((5, 40), 16, (8, 2), 128)
    q, cache, indptr, indices, last = _build(rng, c)
    w = BatchDecode()
    w.plan(indptr, indices, last, num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16, q_dtype="bfloat16",
           kv_dtype="float8_e5m2")  # fmt: skip
    gq = cupy.asarray(q)
    with pytest.raises(ValueError, match="kv_dtype=float8_e5m2"):
        w.run(gq, _framework("torch").asarray(cache))  # an e4m3 torch cache, planned as e5m2
    with pytest.raises(ValueError, match="k_scale must be a number or a float32 array"):
        w.run(gq, cupy.asarray(cache.view(np.uint8)), k_scale=cupy.ones(3, dtype=cupy.float32))
    w16 = BatchDecode()
    w16.plan(indptr, indices, last, num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16, q_dtype="bfloat16")
    with pytest.raises(ValueError, match="k_scale as an array \\(per KV head\\) dequantises fp8 caches"):
        w16.run(gq, cupy.asarray(cache.astype(ml_dtypes.bfloat16)), k_scale=cupy.ones(2, dtype=cupy.float32))
    with pytest.raises(ValueError, match="uint8"):
        w16.run(gq, cupy.asarray(cache.view(np.uint8)))


# ---- the canary ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _canary():
    from conftest import run_canary

    run_canary(__file__, "fp8", "one small case per kernel")


def _canary_main() -> None:
    """Small CuPy cases of both decode kernels and both prefill layouts; exit code 1 on a wrong result."""
    import cupy

    from cuinfer.decode import BatchDecode
    from cuinfer.prefill import BatchPrefill

    rng = np.random.default_rng(7)
    for tc in (False, True):
        c = Case((3, 40, 1, 0, 129), 5, (8, 2), 128, tensor_cores=tc)
        q, cache, indptr, indices, last = _build(rng, c)
        ref_o, ref_lse = reference.batch_decode_paged(q, cache, indptr, indices, last)
        w = BatchDecode(use_tensor_cores=tc)
        w.plan(indptr, indices, last, num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=5,
               q_dtype="bfloat16", kv_dtype="float8_e4m3fn")  # fmt: skip
        o, lse = w.run(cupy.asarray(q), cupy.asarray(cache.view(np.uint8)), return_lse=True)
        cupy.cuda.runtime.deviceSynchronize()
        _check(o.get(), lse.get(), ref_o, ref_lse, what=f"canary decode tc={tc}")
        print(f"canary decode tc={tc}: ok", flush=True)
    for page in (None, 16):
        c = PCase((40, 3), (100, 50), page, (8, 2), 128)
        q, qo_indptr, kv_indptr, indices, last, kv = _pbuild(rng, c)
        w = BatchPrefill(paged=page is not None)
        w.plan(qo_indptr, kv_indptr, indices, last, num_qo_heads=8, num_kv_heads=2, head_dim=128,
               page_size=page or 1, causal=True, q_dtype="bfloat16", kv_dtype="float8_e4m3fn")  # fmt: skip
        if page is None:
            ref_o, ref_lse = reference.batch_attention_ragged(q, kv[0], kv[1], qo_indptr, kv_indptr, causal=True)
            o, lse = w.run(cupy.asarray(q), cupy.asarray(kv[0].view(np.uint8)), cupy.asarray(kv[1].view(np.uint8)),
                           return_lse=True)  # fmt: skip
        else:
            ref_o, ref_lse = reference.batch_prefill_paged(q, kv, qo_indptr, kv_indptr, indices, last, causal=True)
            o, lse = w.run(cupy.asarray(q), cupy.asarray(kv.view(np.uint8)), return_lse=True)
        cupy.cuda.runtime.deviceSynchronize()
        _check(o.get(), lse.get(), ref_o, ref_lse, what=f"canary prefill page={page}")
        print(f"canary prefill page={page}: ok", flush=True)


if __name__ == "__main__":
    _canary_main()
