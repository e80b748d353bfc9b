"""The Hopper prefill backend without a GPU: its kernels' register split (setmaxnreg must stay inside the block's
allocation, or the consumers' increase waits forever), no wgmma serialisation, and plan()'s limits and work."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuinfer.jit import get_compiled
from cuinfer.jit.sass import disassemble_instructions
from cuinfer.prefill import BatchPrefill, sm90
from cuinfer.variants import lookup, render

SPECS = sm90.default_specs()


@pytest.mark.compile
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_register_split_fits_the_block(spec):
    mod = get_compiled(spec, "sm_90a")
    assert "C7513" not in mod.log, f"ptxas serialised the wgmma instructions of {spec.name}"
    (sym,) = mod.lowered.values()
    regs = mod.resources[sym].registers
    insns = disassemble_instructions(mod.cubin)[sym]
    counts = {}
    for kind in ("DEALLOC", "TRY_ALLOC"):
        found = {
            int(m.group(1), 16) for i in insns if f"USETMAXREG.{kind}" in i and (m := re.search(r"0x([0-9a-f]+)", i))
        }
        assert len(found) == 1, f"{spec.name}: one setmaxnreg {kind} value expected, found {found}"
        counts[kind] = found.pop()
    producer, consumer = counts["DEALLOC"], counts["TRY_ALLOC"]
    assert 128 * producer + 256 * consumer <= sm90.THREADS * regs, (
        f"{spec.name}: producer {producer} + consumers {consumer} registers exceed the block's {regs} per thread"
    )
    assert spec.smem_bytes <= 232448, f"{spec.name}: {spec.smem_bytes} bytes of shared memory (sm_90: 227 KB a block)"


@pytest.mark.parametrize("kv", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("paged", [False, True])
def test_fp8_kv_plans_its_own_kernel(kv, paged):
    """fp8 K / V: the same items, a kernel of its own (the fp8 element type, the staging ring's shared memory)."""
    w = BatchPrefill(paged=paged, backend="sm90")
    if paged:
        w.plan(np.array([0, 300, 1000]), np.array([0, 25, 94]), np.arange(94), np.array([16, 4]), page_size=16,
               num_qo_heads=8, num_kv_heads=2, head_dim=128, q_dtype="bfloat16", kv_dtype=kv, causal=True)  # fmt: skip
    else:
        _plan(w, kv_dtype=kv)
    assert w.plan_backend == "sm90" and w._plan.work.n_items == (3 + 6) * 8
    ctype = {"float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}[kv]
    staging = 2 * sm90.STAGES * 128 * 128
    if paged:  # (page sizes that are not a multiple of 16: cp.async staging)
        key = sm90.Sm90KernelKey("bfloat16", w._plan.variant, paged, kv_dtype=kv)
        assert key.name_expr() == f"cuinfer::batch_prefill_sm90<__nv_bfloat16, 128, true, {ctype}>"
        assert key.smem_bytes == sm90.SMEM_BYTES + staging
    key = sm90.Sm90KernelKey("bfloat16", w._plan.variant, paged, kv_dtype=kv, stage_tma=True)
    assert key.name_expr() == f"cuinfer::batch_prefill_sm90<__nv_bfloat16, 128, {str(paged).lower()}, {ctype}, true>"
    # (the staging slots' full and empty barriers: 8 bytes each, K and V, per stage)
    assert key.smem_bytes == sm90.SMEM_BYTES + staging + 8 * 4 * sm90.STAGES
    assert sm90.Sm90KernelKey("bfloat16", w._plan.variant, paged).smem_bytes == sm90.SMEM_BYTES


def test_fp8_staging_keys_refuse_what_no_kernel_runs():
    """TMA staging is for fp8 K / V only, and ragged fp8 K / V has no cp.async staging kernel."""
    variant = _plan(BatchPrefill(paged=False, backend="sm90")).variant
    with pytest.raises(ValueError, match="stage_tma is for fp8"):
        sm90.Sm90KernelKey("bfloat16", variant, stage_tma=True)
    with pytest.raises(ValueError, match="ragged fp8 K / V is staged by TMA"):
        sm90.Sm90KernelKey("bfloat16", variant, kv_dtype="float8_e4m3fn")


def _plan(w: BatchPrefill, qo=(0, 300, 1000), **kw):
    kv = np.array([0, 400, 1500])[: len(qo)]
    args = dict(num_qo_heads=8, num_kv_heads=2, head_dim=128, q_dtype="bfloat16", causal=True)
    args.update(kw)
    w.plan(np.array(qo), kv, **args)
    return w._plan


def test_plan_items_are_one_query_head_of_128_rows():
    plan = _plan(BatchPrefill(paged=False, backend="sm90"), num_sms=132)
    work = plan.work
    # requests of 300 and 700 query rows: 3 + 6 tiles of 128 rows, each for 8 query heads
    assert work.n_items == (3 + 6) * 8 and work.num_ctas == 132
    assert set(np.unique(work.item_kv_head)) == set(range(8)), "items are planned per query head"


def test_fixed_split_in_whole_tiles():
    plan = _plan(BatchPrefill(paged=False, backend="sm90"), fixed_split_size=256, causal=False)
    assert plan.work.num_partial_rows > 0
    starts = plan.work.item_kv_start
    assert (starts % sm90.TILE_KV == 0).all(), "split pieces start on a 128-key tile"
    with pytest.raises(ValueError, match="multiples of its 128-key tiles"):
        _plan(BatchPrefill(paged=False, backend="sm90"), fixed_split_size=100)


@pytest.mark.parametrize(
    "kw, match",
    [
        pytest.param(dict(head_dim=64), "head_dim=64", id="head-dim-64"),
        pytest.param(dict(q_dtype="float16", o_dtype="bfloat16"), "o must have q's dtype", id="o-dtype"),
        pytest.param(dict(variant="sinks"), "'sinks' \\(a sink", id="sinks"),
        pytest.param(dict(pos_encoding="rope_llama"), "a query transform", id="rope"),
    ],
)
def test_plan_names_what_sm90_does_not_run(kw, match):
    with pytest.raises(ValueError, match=f"backend='sm90' does not run .*{match}"):
        _plan(BatchPrefill(paged=False, backend="sm90"), **kw)


def test_constructor_takes_paged_and_graph_mode():
    """The Hopper kernel takes a paged cache and CUDA-graph mode (plans: test_paged_plans and the lifecycle tests)."""
    w = BatchPrefill(paged=True, backend="sm90", use_cuda_graph=True, max_batch_size=4)
    assert w.backend == "sm90" and w.paged and w.use_cuda_graph


def test_numpy_inputs_run_the_reference():
    w = BatchPrefill(paged=False, backend="sm90")
    _plan(w)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1000, 8, 128)).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((1500, 2, 128)).astype(ml_dtypes.bfloat16)
    o_sm90 = w.run(q, k, k)
    ref = BatchPrefill(paged=False, backend="fa2")
    _plan(ref)
    np.testing.assert_array_equal(np.asarray(o_sm90, np.float32), np.asarray(ref.run(q, k, k), np.float32))


def test_paged_plans():
    """The paged kernel's plan: the same items as ragged (one query head, 128 rows), its own specialisation."""
    w = BatchPrefill(paged=True, backend="sm90")
    qo, pages = np.array([0, 300, 1000]), np.array([0, 25, 94])  # 400 and 1100 + 4 keys in pages of 16
    w.plan(qo, pages, np.arange(94), np.array([16, 4]), page_size=16, num_qo_heads=8, num_kv_heads=2, head_dim=128,
           q_dtype="bfloat16", causal=True, num_sms=132)  # fmt: skip
    assert w._plan.work.n_items == (3 + 6) * 8
    key = sm90.Sm90KernelKey("bfloat16", w._plan.variant, True)
    assert key.name_expr() == "cuinfer::batch_prefill_sm90<__nv_bfloat16, 128, true, __nv_bfloat16>"
    assert sm90.sm90_spec(key) in sm90.default_specs()


def test_row_fill():
    assert sm90.row_fill(np.array([0, 128, 384])) == 1.0
    assert sm90.row_fill(np.array([0, 64])) == 0.5
    assert sm90.row_fill(np.array([0, 300, 1000])) == pytest.approx(1000 / (3 * 128 + 6 * 128))
    assert sm90.row_fill(np.array([0, 0])) == 0.0


def _auto(arch, **kw):
    """What backend="auto" resolves a plan to, as if on a GPU of ``arch`` (the plan made on the host)."""
    plan = _plan(BatchPrefill(paged=False, backend="fa2"), **kw)
    return sm90.auto_picks(plan, arch)


@pytest.mark.parametrize(
    "arch, kw, picks",
    [
        pytest.param("sm_90a", {}, True, id="hopper"),
        pytest.param("sm_90a", dict(logits_soft_cap=30.0, window_left=500), True, id="hopper-variants"),
        pytest.param("sm_80", {}, False, id="ampere"),
        pytest.param("sm_100", {}, False, id="blackwell"),
        pytest.param(None, {}, False, id="no-gpu"),
        pytest.param("sm_90a", dict(tile_sizes=(64, 64)), False, id="tile-sizes"),
        pytest.param("sm_90a", dict(head_dim=64), False, id="head-dim-64"),
        pytest.param("sm_90a", dict(kv_dtype="float8_e4m3fn"), True, id="fp8"),
        pytest.param("sm_90a", dict(pos_encoding="rope_llama"), False, id="rope"),
        pytest.param("sm_90a", dict(qo=(0, 16, 32)), False, id="short-appends"),
    ],
)
def test_auto_picks(arch, kw, picks):
    assert _auto(arch, **kw) is picks


def test_auto_picks_paged_plans():
    w = BatchPrefill(paged=True, backend="fa2")
    w.plan(np.array([0, 512]), np.array([0, 32]), np.arange(32), np.array([16]), page_size=16, num_qo_heads=8,
           num_kv_heads=2, head_dim=128, q_dtype="bfloat16", causal=True)  # fmt: skip
    assert sm90.auto_picks(w._plan, "sm_90a") and not sm90.auto_picks(w._plan, "sm_80")


def test_auto_without_a_gpu_plans_fa2():
    w = BatchPrefill(paged=False)
    assert w.plan_backend is None
    _plan(w)
    assert w.plan_backend == "fa2" and w._plan.work.n_items != (3 + 6) * 8
    w = BatchPrefill(paged=False, backend="sm90")
    _plan(w)
    assert w.plan_backend == "sm90"


def test_cli_lists_sm90_kernels_for_sm90a_only(capsys):
    """``cuinfer kernels`` / ``warmup`` for another target leave the sm_90a-only kernels out (they cannot build)."""
    from cuinfer.cli import main

    for arch, present in (("sm_90a", True), ("sm_80", False), ("sm_100a", False)):
        assert main(["kernels", "--group", "prefill_sm90", "--arch", arch]) == 0
        names = capsys.readouterr().out.split()
        assert bool(names) is present, f"{arch}: {names}"
        assert all(s.builds_for(arch) is present for s in SPECS)


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 1500)), min_size=1, max_size=6),
    heads=st.sampled_from([(4, 4), (8, 2), (16, 2)]),
    causal=st.booleans(),
    window=st.sampled_from([-1, 0, 100, 300]),
    split=st.sampled_from([None, 128, 384]),
    sms=st.integers(1, 40),
)
def test_plans_cover_every_row_and_key_once(lens, heads, causal, window, split, sms):
    """Every (request, 128-row tile, query head) of a plan is one item, or pieces that tile its KV range without
    overlap, cut at multiples of 128 keys: the sm90 kernel computes each row's keys exactly once. (The first piece may
    start off a tile only where a window's lower bound starts it: the kernel masks the keys below by the window.)"""
    hq, hkv = heads
    qo, kv = (np.array(x) for x in zip(*lens, strict=True))
    w = BatchPrefill(paged=False, backend="sm90")
    w.plan(np.concatenate([[0], np.cumsum(qo)]), np.concatenate([[0], np.cumsum(kv)]), num_qo_heads=hq,
           num_kv_heads=hkv, head_dim=128, q_dtype="bfloat16", causal=causal, window_left=window,
           fixed_split_size=split, num_sms=sms)  # fmt: skip
    work = w._plan.work
    pieces: dict = {}
    for r, t, h, s, e in zip(work.item_req, work.item_qo_tile, work.item_kv_head, work.item_kv_start,
                             work.item_kv_end, strict=True):  # fmt: skip
        pieces.setdefault((int(r), int(t), int(h)), []).append((int(s), int(e)))
    want = {(b, t, h) for b in range(len(qo)) for t in range(-(-int(qo[b]) // 128)) for h in range(hq)}
    assert set(pieces) <= want
    for key, ranges in pieces.items():
        ranges.sort()
        starts = [s for s, _ in ranges] if window < 0 else [s for s, _ in ranges[1:]]
        assert all(s % sm90.TILE_KV == 0 for s in starts), f"{key}: a piece starts off a tile: {ranges}"
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), f"{key}: gaps or overlaps"
        assert ranges[-1][1] <= kv[key[0]]
    # a (tile, head) with no item must see no key (e.g. causal rows before the first key)
    for b, t, h in want - set(pieces):
        last = min((t + 1) * 128, int(qo[b])) - 1
        assert causal and last + int(kv[b]) - int(qo[b]) < 0 or kv[b] == 0, (b, t, h)


class _Encoder:
    """cuTensorMapEncodeTiled stand-in: records the arguments (this machine may have no driver) and returns a map."""

    def __init__(self):
        self.calls = []

    def __call__(self, kind, rank, ptr, dims, strides, box, elem_strides, interleave, swizzle, promotion, oob):
        import ctypes

        from cuda.bindings import driver as cu

        self.calls.append(dict(kind=kind, rank=int(rank), ptr=ptr, dims=[int(d) for d in dims],
                               strides=[int(s) for s in strides], box=[int(b) for b in box], swizzle=swizzle,
                               promotion=promotion))  # fmt: skip
        self.buf = ctypes.create_string_buffer(bytes(range(128)))

        class Map:
            def getPtr(_):  # noqa: N802 - the bindings' name
                return ctypes.addressof(self.buf)

        return cu.CUresult.CUDA_SUCCESS, Map()


def test_tma_maps_encode_the_q_tensor_and_the_fp8_byte_views(monkeypatch):
    """The maps handed to the kernel: q as [rows, heads, 128] 16-bit in 64-column boxes with the 128-byte swizzle;
    fp8 K / V as bytes, ragged in 128-row boxes, paged in boxes of 16 slots of one page, unswizzled (written out here
    as literals, not from the encoder's own code)."""
    from cuda.bindings import driver as cu

    from cuinfer.formats.kv import KV

    enc = _Encoder()
    monkeypatch.setattr(cu, "cuTensorMapEncodeTiled", enc)
    desc = sm90.tensor_map(4096, "bfloat16", 300, 32, 32 * 128, 128)
    assert bytes(desc["opaque"].tobytes()) == bytes(range(128))
    q = enc.calls[-1]
    assert q["kind"] == cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 and q["rank"] == 3
    assert (q["dims"], q["strides"], q["box"]) == ([128, 32, 300], [256, 8192], [64, 1, 128])
    assert q["swizzle"] == cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    assert q["promotion"] == cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B

    kv = KV(k=None, v=None, k_ptr=8192, v_ptr=8192, k_strides=(0, 0, 0), v_strides=(0, 0, 0), num_pages=50,
            page_size=32, num_kv_heads=8, head_dim=128)  # fmt: skip
    sm90.fp8_map(8192, (32 * 8 * 128, 8 * 128, 128), kv, paged=True, nk=0)
    paged = enc.calls[-1]
    assert paged["kind"] == cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8 and paged["rank"] == 4
    assert (paged["dims"], paged["strides"], paged["box"]) == ([128, 8, 32, 50], [128, 1024, 32768], [128, 1, 16, 1])
    assert paged["swizzle"] == cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE
    assert paged["promotion"] == cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B
    sm90.fp8_map(8192, (0, 8 * 128, 128), kv, paged=False, nk=0)  # (no rows: one, as the driver needs dims >= 1)
    ragged = enc.calls[-1]
    assert (ragged["dims"], ragged["strides"], ragged["box"]) == ([128, 8, 1], [128, 1024], [128, 1, 128])

    monkeypatch.setattr(cu, "cuTensorMapEncodeTiled", lambda *a: (cu.CUresult.CUDA_ERROR_INVALID_VALUE, None))
    with pytest.raises(RuntimeError, match=r"for a \[300, 32, 128\] bfloat16 tensor with strides \(4096, 128, 1\)"):
        sm90.tensor_map(4096, "bfloat16", 300, 32, 32 * 128, 128)


# ---- the max-free softmax of scaled logits -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, kv, names, cap, free",
    [
        ("bfloat16", "bfloat16", ("causal", "soft_cap"), 30.0, True),
        ("bfloat16", "bfloat16", ("soft_cap",), 54.7, True),  # (54.7 log2 e = 78.9 <= 79)
        ("bfloat16", "bfloat16", ("causal", "soft_cap"), 54.8, False),  # (79.06: 2^(32 - 2 c log2 e) < 2^-126)
        ("float16", "float16", ("causal", "soft_cap"), 30.0, False),  # (float16 P holds no 2^32)
        ("bfloat16", "float8_e4m3fn", ("causal", "soft_cap"), 30.0, False),  # (float16 MMAs)
        ("bfloat16", "bfloat16", ("causal", "alibi", "soft_cap"), 30.0, False),  # (two logits pieces)
        ("bfloat16", "bfloat16", ("causal", "soft_cap_accurate"), 30.0, True),
        ("bfloat16", "bfloat16", ("causal",), None, False),
    ],
)
def test_max_free_softmax_only_where_every_exponential_stays_a_normal_float(dtype, kv, names, cap, free):
    chain = render(tuple(lookup(n) for n in names))
    values = {n: {"cap": cap} for n in names if n.startswith("soft_cap")}
    assert sm90.max_free_ok(dtype, kv, chain, values) is free
    if free:  # the bound: p = 2^(s - (c log2 e - 32)) within [2^-126, 2^32] for s in [-c log2 e, c log2 e]
        c2 = cap * np.log2(np.e)
        assert 32 - 2 * c2 >= -126 and c2 <= sm90.MAX_FREE_BOUND


def test_max_free_keys_name_their_kernel_and_refuse_what_it_cannot_run():
    chain = render((lookup("causal"), lookup("soft_cap")))
    key = sm90.Sm90KernelKey("bfloat16", chain, max_free=True)
    assert key.name_expr() == "cuinfer::batch_prefill_sm90<__nv_bfloat16, 128, false, __nv_bfloat16, false, true>"
    assert key.short_name().endswith("/causal+soft_cap/max-free")
    assert sm90.Sm90KernelKey("bfloat16", chain).name_expr().endswith("__nv_bfloat16>")  # (plain names unchanged)
    with pytest.raises(ValueError, match="max_free is for bfloat16"):
        sm90.Sm90KernelKey("float16", chain, max_free=True)
    with pytest.raises(ValueError, match="max_free is for bfloat16"):
        sm90.Sm90KernelKey("bfloat16", render((lookup("causal"),)), max_free=True)
    with pytest.raises(ValueError, match="max_free is for bfloat16"):
        sm90.Sm90KernelKey("bfloat16", chain, kv_dtype="float8_e4m3fn", stage_tma=True, max_free=True)


def test_max_free_kernel_has_no_running_max():
    """The max-free soft cap kernel: no max reduction (FMNMX) nor quad shuffles of it, MUFU ops for the tanh and the
    exp2 of every logit (2 per logit site, beside the plain kernel's 1), no spills."""
    chain = render((lookup("causal"), lookup("soft_cap")))
    counts = {}
    for free in (False, True):
        spec = sm90.sm90_spec(sm90.Sm90KernelKey("bfloat16", chain, max_free=free))
        mod = get_compiled(spec, sm90.ARCH)
        sym = mod.lowered[spec.name_exprs[0]]
        ops = [
            re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in disassemble_instructions(mod.cubin)[sym]
        ]
        counts[free] = {op: ops.count(op) for op in ("FMNMX", "MUFU", "SHFL")}
        usage = mod.resources[sym]
        assert usage.spill_stores == 0 and usage.spill_loads == 0
    assert counts[True]["FMNMX"] == 0 and counts[False]["FMNMX"] >= 128
    assert counts[True]["SHFL"] < counts[False]["SHFL"]
    assert counts[True]["MUFU"] >= 256
