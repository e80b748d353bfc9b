"""The lab wrappers of bench/lab/harness.py on run()'s GPU path without a GPU (the stand-ins of
tests/cpu/test_wrapper_lifecycle.py record every launch and its parameter struct): the lab's own kernel is the one
launched, a trace run hands its buffer to the kernel as lse, a forced L2 policy reaches the parameters, and nothing of
cuinfer is changed for the wrappers beside them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import bench.lab.harness as harness
from bench.lab import tune_sched as ts
from bench.lab.harness import LabDecode, LabPrefill, TraceBuffer, ab_spec, prefill_trace
from cuinfer.decode import BatchDecode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu"))  # the stand-ins of test_wrapper_lifecycle
from test_wrapper_lifecycle import HEADS, FakeKernel, _cuda, _page_table, gpu  # noqa: E402, F401 (gpu: a fixture)


@pytest.fixture
def lab_gpu(gpu, monkeypatch):  # noqa: F811 (the fixture imported above)
    """``gpu`` plus the lab's kernel lookup: its launches are logged under the name of the lab spec."""
    log, stream = gpu
    monkeypatch.setattr(harness, "get_kernel", lambda spec, expr, device_id: FakeKernel(log, spec.name))
    monkeypatch.setattr(harness, "miscompiled_reads", lambda spec, arch: [])  # (its own tests below)
    return log, stream


def _launches(log):
    return [(e[1], e[3]) for e in log if e[0] == "launch"]


def test_ab_spec():
    from cuinfer.decode.policy import decode_config
    from cuinfer.decode.specs import DecodeKernelKey, decode_spec

    shipped = decode_spec(DecodeKernelKey(decode_config(4, 128, use_tensor_cores=True), *["bfloat16"] * 3))
    assert ab_spec(shipped, ()) is shipped
    assert ab_spec(shipped, ("-DX",), "t").name == "lab-t/" + shipped.name
    with pytest.raises(ValueError, match="-D defines"):
        ab_spec(shipped, ("-O3",))


def test_decode_trace_run_stamps_where_lse_points(lab_gpu, rng):
    log, _ = lab_gpu
    cache = (_cuda((4000, 16, 8, 128)), _cuda((4000, 16, 8, 128)))
    table = _page_table(rng, rng.integers(1, 3000, 12))
    q = _cuda((12, 32, 128))
    w = LabDecode(spec_of=ts.decode_trace_spec, trace=TraceBuffer(0xABC000), evict_first=False)
    w.plan(*table, **HEADS, page_size=16, q_dtype="bfloat16")
    w.run(q, cache)
    with pytest.raises(ValueError, match="without lse"):
        w.run(q, cache, return_lse=True)
    plain = BatchDecode()  # beside it, the shipped kernel and the policy's L2 choice
    plain.plan(*table, **HEADS, page_size=16, q_dtype="bfloat16")
    plain.run(q, cache)
    (name, p), (plain_name, plain_p) = _launches(log)
    assert name.startswith("lab-dtrace/decode/tc/") and p["lse"] == 0xABC000 and p["kv_evict_first"] == 0
    assert plain_name == "cuinfer::decode::batch_decode_tensor_core" and plain_p["lse"] == 0
    assert plain_p["kv_evict_first"] == 1  # (12 requests: far under 4 L2 sizes of K/V)


def test_decode_config_and_work_reach_the_launch(lab_gpu, rng):
    log, _ = lab_gpu
    cfg = ts.decode_variant("2,1,3,2")
    w = LabDecode(config=cfg, work=ts.cta_cut_work)
    w.plan(*_page_table(rng, rng.integers(1, 3000, 12)), **HEADS, page_size=16, q_dtype="bfloat16")
    w.run(_cuda((12, 32, 128)), (_cuda((4000, 16, 8, 128)), _cuda((4000, 16, 8, 128))))
    assert len(_launches(log)) == 1
    # warps_kv, warps_d, stages and CTAs per SM of the lab config in the kernel launched
    assert w._launch_state.kernel.name.endswith(", 2, 1, 16, 3, 2, Variant, false>")
    assert w._plan.work.assign_mode == "cta-cut-experiment" and w._plan.work.num_ctas == 2 * 132


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "ragged"])
def test_prefill_trace_run_skips_the_merge(lab_gpu, rng, paged):
    log, _ = lab_gpu
    qo_lens = rng.integers(1, 300, 5)
    qo = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    tb = prefill_trace(1 << 30, 2 * 4000, 32)
    w = LabPrefill(paged=paged, spec_of=ts.prefill_trace_spec, trace=tb)
    if paged:
        w.plan(qo, *_page_table(rng, qo_lens + 700), **HEADS, page_size=16, q_dtype="bfloat16", fixed_split_size=256)
        kv = (_cuda((4000, 2, 16, 8, 128)),)
    else:
        kvi = np.concatenate([[0], np.cumsum(qo_lens + 700)]).astype(np.int32)
        w.plan(qo, kvi, **HEADS, q_dtype="bfloat16", fixed_split_size=256)
        kv = (_cuda((int(kvi[-1]), 8, 128)), _cuda((int(kvi[-1]), 8, 128)))
    assert w._plan.work.n_merge > 0
    w.run(_cuda((int(qo[-1]), 32, 128)), *kv)
    ((name, p),) = _launches(log)  # the kernel alone: no merge launch
    assert name.startswith("lab-trace/prefill/") and p["lse"] == tb.ptr
    assert (p["lse_stride_n"], p["lse_stride_h"]) == (-32, -1)


def test_lab_kernel_refuses_a_miscompiled_spec_before_loading_it(lab_gpu, monkeypatch):
    """A lab build or configuration whose SASS reads unwritten uniform registers is refused before it is loaded (on
    the GPU it would be an illegal instruction ending the call's CUDA context); a clean one is loaded."""
    from cuinfer.decode.policy import decode_config
    from cuinfer.decode.specs import DecodeKernelKey, decode_spec

    key = DecodeKernelKey(decode_config(4, 128, use_tensor_cores=True), *["bfloat16"] * 3)
    spec, loaded = decode_spec(key), []
    monkeypatch.setattr(harness, "get_kernel", lambda s, e, d: loaded.append(s.name) or "kernel")
    bad = "LDGSTS.E.128 [R22+UR0], desc[UR1][R2.64], P0 reads UR0, UR1"
    monkeypatch.setattr(harness, "miscompiled_reads", lambda s, arch: [bad] if arch == "sm_90a" else [])
    with pytest.raises(RuntimeError, match=r"decode/tc/bfloat16/d128/g4: not launched.*1: LDGSTS"):
        harness.lab_kernel(spec, key.name_expr(), 0)
    assert loaded == []
    monkeypatch.setattr(harness, "miscompiled_reads", lambda s, arch: [])
    assert harness.lab_kernel(spec, key.name_expr(), 0) == "kernel" and loaded == [spec.name]


@pytest.mark.compile
def test_miscompiled_reads_of_a_shipped_spec_is_empty_and_memoised(monkeypatch):
    """The check itself on a registered kernel (clean, as tests/compile asserts): nothing found, and a second call
    answers from the memo without compiling."""
    from cuinfer.decode.policy import decode_config
    from cuinfer.decode.specs import DecodeKernelKey, decode_spec
    from cuinfer.jit.sass import find_cuobjdump

    if find_cuobjdump() is None:
        pytest.skip("cuobjdump not installed (the test extra brings it)")
    key = DecodeKernelKey(decode_config(4, 128, use_tensor_cores=True, kv_itemsize=1), "bfloat16", "float8_e4m3fn",
                          "bfloat16")  # fmt: skip
    spec = decode_spec(key)
    monkeypatch.setattr(harness, "_SASS_CHECKED", {})
    assert harness.miscompiled_reads(spec, "sm_90a") == []
    import cuinfer.jit as jit

    monkeypatch.setattr(jit, "get_compiled", lambda *a: pytest.fail("compiled again"))
    assert harness.miscompiled_reads(spec, "sm_90a") == []
