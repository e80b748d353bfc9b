"""The plan/run lifecycle of ``cuinfer.runtime.wrapper`` on the GPU path, without a GPU: the device, the buffers, the
kernels and the caller's arrays are stand-ins that record what run() enqueues (uploads, launches and their parameter
structs), so CPU CI runs the hooks every wrapper supplies and the rules the base keeps: the plan words go up once per
plan and stream (every run in CUDA-graph mode), the parameter struct is rebuilt only when an array changes, split
prefill plans add the merge launch, and out= / lse= come back as given."""

from __future__ import annotations

import numpy as np
import pytest
from cuinfer.interop.arrays import Tensor
from cuinfer.interop.dtypes import DType
from cuinfer.planner import layout as plan_layout

import cuinfer.decode.launch as decode_launch
import cuinfer.decode.single as decode_single
import cuinfer.merge as merge
import cuinfer.prefill.launch as prefill_launch
import cuinfer.prefill.wrapper as prefill_wrapper
import cuinfer.runtime.device as device
import cuinfer.runtime.wrapper as wrapper
from cuinfer.decode import BatchDecode, single_decode
from cuinfer.prefill import BatchPrefill

_NEXT = [1 << 20]


def _alloc(nbytes: int) -> int:
    p = _NEXT[0]
    _NEXT[0] += (int(nbytes) + 0xFFFF) & ~0xFFF
    return p


def _cuda(shape: tuple, dtype: DType = DType.BFLOAT16) -> Tensor:
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return Tensor(_alloc(s * dtype.itemsize), tuple(shape), tuple(reversed(strides)), dtype, "cuda", 0, "cupy", None)


class _Memory:
    def __init__(self, n: int) -> None:
        self.size = n
        self.data = type("Ptr", (), {"ptr": _alloc(4 * n)})()


class FakeBuffers:
    """``runtime.buffers.Buffers`` without CuPy: host buffers are NumPy, device addresses are made up."""

    def __init__(self, log: list, device_id: int, workspace_bytes: int, graph: bool) -> None:
        self.log, self.device_id, self.graph = log, device_id, graph
        self.workspace_bytes = int(workspace_bytes)
        self.workspace, self.merge_count = _Memory(self.workspace_bytes // 4 + 1), _Memory(2)
        self.device, self.pinned, self.turn, self.fixed_layout = None, [], 0, None

    def ensure_workspace(self, nbytes: int) -> None:
        if nbytes > self.workspace_bytes:
            self.workspace, self.workspace_bytes = _Memory(int(nbytes) // 4 + 1), int(nbytes)

    def merge_count_ptr(self) -> int:
        return self.merge_count.data.ptr

    def ensure(self, words: int) -> None:
        if self.device is None or self.device.size < words:
            n = max(words, 4096)
            self.device, self.pinned = _Memory(n), [np.zeros(n, np.int32) for _ in range(1 if self.graph else 2)]

    def next_host(self) -> np.ndarray:
        i = 0 if self.graph else self.turn
        self.turn ^= 1
        return self.pinned[i]

    def upload(self, host: np.ndarray, words: int, stream: int) -> None:
        self.log.append(("upload", stream, words))

    def ptr(self, word: int) -> int:
        return self.device.data.ptr + 4 * int(word)

    def partial_pointers(self, head_dim: int) -> tuple[int, int]:
        rows = self.workspace_bytes // (4 * head_dim + 4)
        return self.workspace.data.ptr, self.workspace.data.ptr + plan_layout.workspace_offsets(rows, head_dim)[0]


class FakeKernel:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def launch(self, grid, block, args, *, smem_bytes=0, stream=0) -> None:
        p = args[0]
        self.log.append(("launch", self.name.split("<")[0], stream, {n: p[n].item() for n in p.dtype.names},
                         args[1] if len(args) > 1 else None))  # fmt: skip

    def max_active_blocks(self, block_threads: int, smem_bytes: int = 0) -> int:
        return 1


class FakeCall:
    framework, device_id = "cupy", 0

    def __init__(self, stream: int) -> None:
        self.stream = stream

    def tensor(self, x, name):
        return x

    def empty(self, shape, dtype):
        return _cuda(shape, dtype)

    def give(self, t):
        return t


@pytest.fixture
def gpu(monkeypatch):
    """A fake GPU: returns the log of uploads and launches, and ``stream`` (a one-element list) for run()'s calls."""
    log, stream = [], [7]
    info = device.DeviceInfo(0, "fake", (9, 0), 132, 232448, 233472, 60 << 20, 65536, 2048)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "current_device_id", lambda: 0)
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)
    monkeypatch.setattr(decode_launch, "device_info", lambda device_id=None: info)
    kernel = lambda spec, name_expr, device_id: FakeKernel(log, name_expr)  # noqa: E731
    for mod in (decode_launch, prefill_launch, prefill_wrapper, merge):
        monkeypatch.setattr(mod, "get_kernel", kernel)
    monkeypatch.setattr(wrapper, "Buffers", lambda *a: FakeBuffers(log, *a))
    begin = lambda anchor, name: (FakeCall(stream[0]), anchor)  # noqa: E731
    monkeypatch.setattr(wrapper, "begin", begin)
    monkeypatch.setattr(decode_single, "begin", begin)
    monkeypatch.setattr(decode_single, "_single_wrappers", {})  # (none of these fakes outlives the test)
    return log, stream


def _page_table(rng, lens, ps=16):
    pages = -(-np.asarray(lens) // ps)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = ((np.asarray(lens) - 1) % ps + 1).astype(np.int32)
    return indptr, rng.permutation(int(indptr[-1])).astype(np.int32), last


HEADS = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128)


def test_decode_uploads_once_per_plan_and_stream(gpu, rng):
    log, stream = gpu
    cache = (_cuda((4000, 16, 8, 128)), _cuda((4000, 16, 8, 128)))
    w = BatchDecode()
    w.plan(*_page_table(rng, rng.integers(1, 3000, 12)), **HEADS, page_size=16, q_dtype="bfloat16")
    q = _cuda((12, 32, 128))
    o = w.run(q, cache)
    assert o.shape == (12, 32, 128) and o.dtype is DType.BFLOAT16
    w.run(q, cache)
    stream[0] = 9
    out, lse = _cuda((12, 32, 128)), _cuda((12, 32), DType.FLOAT32)
    assert w.run(q, cache, out=out, lse=lse) == (out, lse)
    kinds = [(e[0], e[1]) if e[0] == "upload" else (e[0], e[2]) for e in log]
    assert kinds == [("upload", 7), ("launch", 7), ("launch", 7), ("upload", 9), ("launch", 9)]
    first, _, last = (e[3] for e in log if e[0] == "launch")
    assert first["q"] == q.ptr and first["lse"] == 0 and first["plan_words"] == last["plan_words"]
    assert last["o"] == out.ptr and last["lse"] == lse.ptr and last["lse_stride_b"] == 32


def test_decode_graph_mode_uploads_every_run(gpu, rng):
    log, _ = gpu
    cache = _cuda((4000, 2, 16, 8, 128))
    w = BatchDecode(use_cuda_graph=True, max_batch_size=16)
    for b in (12, 16):
        w.plan(*_page_table(rng, rng.integers(1, 3000, b)), **HEADS, page_size=16, q_dtype="bfloat16")
        q = _cuda((b, 32, 128))
        w.run(q, cache)
        w.run(q, cache)
    assert [e[0] for e in log] == ["upload", "launch"] * 4
    words = {e[3]["plan_words"] for e in log if e[0] == "launch"}
    assert len(words) == 1, "a captured run keeps reading one plan buffer"


def test_run_checks_before_any_launch(gpu, rng):
    log, _ = gpu
    w = BatchDecode(device=1)
    with pytest.raises(ValueError, match=r"run\(\) needs a plan: call plan\(kv_indptr, kv_indices, kv_last_page_len"):
        w.run(_cuda((2, 32, 128)), _cuda((10, 2, 16, 8, 128)))
    w._device_id = 1  # (planned for cuda:1; the fake call's arrays are on cuda:0)
    w.plan(*_page_table(rng, [40, 50]), **HEADS, page_size=16, q_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"plan\(\) was made for cuda:1; call plan\(\) with BatchDecode\(device=0\)"):
        w.run(_cuda((2, 32, 128)), _cuda((10, 2, 16, 8, 128)))
    p = BatchPrefill(paged=False)
    with pytest.raises(ValueError, match=r"call plan\(qo_indptr, kv_indptr, \.\.\.\) first"):
        p.run(_cuda((4, 32, 128)))
    assert log == []


def test_single_decode_launches_once(gpu):
    log, _ = gpu
    q, k = _cuda((32, 128)), _cuda((700, 8, 128))
    o, lse = single_decode(q, k, _cuda((700, 8, 128)), return_lse=True)
    assert o.shape == (32, 128) and lse.shape == (32,) and lse.dtype is DType.FLOAT32
    assert [e[0] for e in log] == ["upload", "launch"]
    params = log[1][3]
    assert params["q"] == q.ptr and params["q_stride_b"] == 0 and params["k"] == k.ptr and params["lse"] == lse.ptr


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "ragged"])
def test_prefill_split_plans_add_the_merge_launch(gpu, rng, paged):
    log, _ = gpu
    qo_lens = rng.integers(1, 300, 5)
    qo = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    w = BatchPrefill(paged=paged)
    if paged:
        w.plan(qo, *_page_table(rng, qo_lens + 700), **HEADS, page_size=16, q_dtype="bfloat16", fixed_split_size=256)
        kv = (_cuda((4000, 2, 16, 8, 128)),)
    else:
        kvi = np.concatenate([[0], np.cumsum(qo_lens + 700)]).astype(np.int32)
        w.plan(qo, kvi, **HEADS, q_dtype="bfloat16", fixed_split_size=256)
        kv = (_cuda((int(kvi[-1]), 8, 128)), _cuda((int(kvi[-1]), 8, 128)))
    assert w._plan.work.n_merge > 0
    q = _cuda((int(qo[-1]), 32, 128))
    o, lse = w.run(q, *kv, return_lse=True)
    w.run(q, *kv)
    assert [e[0] for e in log] == ["upload", "launch", "launch", "launch", "launch"]
    names = [e[1] for e in log if e[0] == "launch"]
    assert names == ["cuinfer::batch_prefill", "cuinfer::merge_partials"] * 2
    assert log[2][3]["o"] == o.ptr and log[2][3]["lse"] == lse.ptr and log[4][3]["lse"] == 0
    with pytest.raises(TypeError, match="runs as"):
        w.run(q, *kv, kv[0])


@pytest.mark.parametrize("kind", ["decode", "paged", "ragged"])
def test_variant_arrays_reach_the_kernel_and_are_checked_first(gpu, rng, kind):
    """run()'s variant arrays: checked before any launch (on the GPU: a CUDA array of q's device), their addresses
    in the kernel's VariantParams, repacked only when an address changes."""
    log, _ = gpu
    sinks = _cuda((32,), DType.FLOAT32)
    if kind == "decode":
        w = BatchDecode()
        w.plan(*_page_table(rng, [40, 700]), **HEADS, page_size=16, q_dtype="bfloat16", variant="sinks")
        q, kv = _cuda((2, 32, 128)), (_cuda((100, 2, 16, 8, 128)),)
    else:
        qo = np.array([0, 3, 40], np.int32)
        w = BatchPrefill(paged=kind == "paged")
        if kind == "paged":
            w.plan(qo, *_page_table(rng, [40, 700]), **HEADS, page_size=16, q_dtype="bfloat16", variant="sinks")
            kv = (_cuda((100, 2, 16, 8, 128)),)
        else:
            w.plan(qo, np.array([0, 40, 740], np.int32), **HEADS, q_dtype="bfloat16", variant="sinks")
            kv = (_cuda((740, 8, 128)), _cuda((740, 8, 128)))
        q = _cuda((40, 32, 128))
    with pytest.raises(
        ValueError, match=r"read arrays given at run\(\): pass variant_arrays=\{'sinks': float32 \[32\]"
    ):
        w.run(q, *kv)
    with pytest.raises(ValueError, match=r"variant_arrays\['sinks'\] must be a CUDA array but is a host array"):
        w.run(q, *kv, variant_arrays={"sinks": np.zeros(32, np.float32)})
    elsewhere = Tensor(sinks.ptr, (32,), (1,), DType.FLOAT32, "cuda", 1, "cupy", None)
    with pytest.raises(ValueError, match=r"must be on the device of q \(cuda:0\) but is on cuda:1"):
        w.run(q, *kv, variant_arrays={"sinks": elsewhere})
    with pytest.raises(ValueError, match=r"must have dtype float32 but has dtype bfloat16"):
        w.run(q, *kv, variant_arrays={"sinks": _cuda((32,))})
    assert log == []
    w.run(q, *kv, variant_arrays={"sinks": sinks})
    w.run(q, *kv, variant_arrays={"sinks": sinks})
    other = _cuda((32,), DType.FLOAT32)
    w.run(q, *kv, variant_arrays={"sinks.sinks": other})
    vparams = [e[4] for e in log if e[0] == "launch" and "merge" not in e[1]]
    assert [int(v["sinks"]["sinks"]) for v in vparams] == [sinks.ptr, sinks.ptr, other.ptr]


def test_single_decode_passes_variant_arrays(gpu):
    log, _ = gpu
    q, k, sinks = _cuda((32, 128)), _cuda((700, 8, 128)), _cuda((32,), DType.FLOAT32)
    single_decode(q, k, _cuda((700, 8, 128)), variant="sinks", variant_arrays={"sinks": sinks})
    assert [e[0] for e in log] == ["upload", "launch"] and int(log[1][4]["sinks"]["sinks"]) == sinks.ptr
