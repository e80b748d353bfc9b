"""cuinfer.compat.flashinfer against real FlashInfer 0.7.2, in one process on torch tensors.

Every case is one function written against the FlashInfer API; it runs twice on the same inputs, once with
``flashinfer`` and once with ``cuinfer.compat.flashinfer`` as the module, and every tensor it returns must agree
within 1e-3 (float16) / 1e-2 (bfloat16), as ``|compat - flashinfer| <= tol + tol * |flashinfer|`` elementwise
(equal infinities, e.g. the lse of an empty row, agree). The drop-in must also return torch tensors of FlashInfer's
dtype and shape. Skipped without a GPU, torch or an importable FlashInfer (the peer pack, docs/benchmarks.md).

As pytest (the ``gpu`` marker)::

    python -m pytest tests/gpu/test_compat_parity.py -q

As a script, a table of every case (``--cases`` / ``--dtypes`` pick some; ``--peers DIR`` puts a ``pip --target``
directory on the path)::

    python tests/gpu/test_compat_parity.py [--peers /tmp/peers] [--cases decode,merge] [--dtypes float16]

FlashInfer JIT-compiles one module per (kernel, dtype, options) on first use, about 20 here, cached in
bench/.peer-cache as the benchmark suites do: on a cold machine run the table in parts (``--cases decode,merge`` then
``--cases prefill,single,errors,utilities``) to stay inside a 10-minute command. The option cases (window, soft cap,
RoPE, ALiBi) run in float16 only unless ``--dtypes`` says otherwise; the prefill cases ask FlashInfer for
``backend="fa2"`` unless ``--backend auto`` (FlashInfer's Hopper kernels, more modules to compile).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TOL = {"float16": 1e-3, "bfloat16": 1e-2}
DTYPES = tuple(TOL)
HQ, HKV, D, PAGE = 32, 8, 128, 16  # Llama-3.1-8B heads, as the benchmark suites use
# The prefill backend the cases ask for. "fa2" keeps FlashInfer to one prefill module per (dtype, options); "auto"
# (--backend auto) also exercises FlashInfer's Hopper kernels, which the drop-in maps to cuinfer's best kernel.
BACKEND = {"name": "fa2"}

pytestmark = pytest.mark.gpu


# ---- inputs ----------------------------------------------------------------------------------------------------------


@dataclass
class Ctx:
    """What a case builds its inputs from: torch, the dtype, and a seeded NumPy generator (so both runs of a case
    see the same numbers)."""

    torch: Any
    dtype_name: str
    seed: int
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    @property
    def dtype(self) -> Any:
        return getattr(self.torch, self.dtype_name)

    def randn(self, *shape: int, dtype: Any = None, scale: float = 1.0) -> Any:
        x = self.torch.from_numpy((self.rng.standard_normal(shape) * scale).astype(np.float32))
        return x.to(device="cuda", dtype=dtype or self.dtype)

    def ints(self, values: Any) -> Any:
        return self.torch.tensor(np.asarray(values), dtype=self.torch.int32, device="cuda")

    def workspace(self) -> Any:
        return self.torch.zeros(128 << 20, dtype=self.torch.uint8, device="cuda")

    def paged(self, kv_lens: list[int], layout: str = "NHD", page_size: int = PAGE, spare: int = 5) -> tuple:
        """A 5-D cache over permuted pages (plus ``spare`` ones) and its CSR page table, on the GPU."""
        pages = [-(-n // page_size) for n in kv_lens]
        indptr = np.cumsum([0, *pages])
        total = int(indptr[-1]) + spare
        indices = self.rng.permutation(total)[: indptr[-1]]
        last = [n - page_size * (p - 1) for n, p in zip(kv_lens, pages, strict=True)]
        shape = (total, 2, page_size, HKV, D) if layout == "NHD" else (total, 2, HKV, page_size, D)
        return self.randn(*shape), self.ints(indptr), self.ints(indices), self.ints(last)


def _indptr(lens: list[int]) -> np.ndarray:
    return np.cumsum([0, *lens])


def _packed_mask(ctx: Ctx, qo_lens: list[int], kv_lens: list[int]) -> Any:
    """A random mask packed per request with bitorder 'little' on the host (FlashInfer's own packbits kernel is not
    in the peer pack), as a uint8 GPU tensor."""
    parts = [np.packbits(ctx.rng.random(a * b) < 0.7, bitorder="little") for a, b in zip(qo_lens, kv_lens, strict=True)]
    return ctx.torch.from_numpy(np.concatenate(parts)).cuda()


# ---- the cases: FlashInfer code, run once per module -----------------------------------------------------------------

DECODE_LENS = [1, 15, 16, 17, 100, 513, 1025]
QO_LENS, KV_LENS = [17, 64, 1, 130], [40, 64, 300, 130]


def decode(fi: Any, ctx: Ctx, *, tc: bool, layout: str = "NHD", **opts: Any) -> dict[str, Any]:
    cache, indptr, indices, last = ctx.paged(DECODE_LENS, layout)
    q = ctx.randn(len(DECODE_LENS), HQ, D)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ctx.workspace(), layout, use_tensor_cores=tc)
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=ctx.dtype, kv_data_type=ctx.dtype, **opts)
    o, lse = w.run(q, cache, return_lse=True)
    o2 = w.run(q, (cache[:, 0], cache[:, 1]))  # the tuple form
    return {"o": o, "lse": lse, "o (k, v tuple)": o2}


def decode_graph(fi: Any, ctx: Ctx, *, tc: bool) -> dict[str, Any]:
    """CUDA-graph form: run() captured once, replayed after a re-plan of the same batch size."""
    torch = ctx.torch
    lens1, lens2 = [33, 700, 16, 1, 250], [512, 3, 65, 1000, 17]
    pages2 = [-(-n // PAGE) for n in lens2]
    cache, indptr1, indices1, last1 = ctx.paged(lens1, spare=sum(pages2))  # (pages for the second plan too)
    indptr2 = ctx.ints(_indptr(pages2))
    indices2 = ctx.ints(ctx.rng.permutation(cache.shape[0])[: sum(pages2)])
    last2 = ctx.ints([n - PAGE * (p - 1) for n, p in zip(lens2, pages2, strict=True)])
    batch = len(lens1)
    bufs = [torch.empty(n, dtype=torch.int32, device="cuda") for n in (batch + 1, cache.shape[0], batch)]
    w = fi.BatchDecodeWithPagedKVCacheWrapper(
        ctx.workspace(), "NHD", use_cuda_graph=True, use_tensor_cores=tc, paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2],
    )  # fmt: skip
    kw = dict(q_data_type=ctx.dtype, kv_data_type=ctx.dtype)
    w.plan(indptr1, indices1, last1, HQ, HKV, D, PAGE, **kw)
    q, q2 = ctx.randn(batch, HQ, D), ctx.randn(batch, HQ, D)
    out = torch.empty(batch, HQ, D, dtype=ctx.dtype, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile / load and warm up outside the capture
        for _ in range(2):
            w.run(q, cache, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        w.run(q, cache, out=out)
    graph.replay()
    first = out.clone()
    w.plan(indptr2, indices2, last2, HQ, HKV, D, PAGE, **kw)
    q.copy_(q2)
    graph.replay()
    torch.cuda.synchronize()
    return {"o (first plan)": first, "o (re-planned, replayed)": out.clone()}


def prefill_paged(fi: Any, ctx: Ctx, *, causal: bool, layout: str = "NHD", **opts: Any) -> dict[str, Any]:
    cache, indptr, indices, last = ctx.paged(KV_LENS, layout)
    qo = ctx.ints(_indptr(QO_LENS))
    q = ctx.randn(sum(QO_LENS), HQ, D)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ctx.workspace(), layout, backend=BACKEND["name"])
    w.plan(qo, indptr, indices, last, HQ, HKV, D, PAGE, causal=causal, q_data_type=ctx.dtype, **opts)
    o, lse = w.run(q, cache, return_lse=True)
    return {"o": o, "lse": lse}


# A packed mask reaches FlashInfer 0.7.2's kernel at byte offset sum(qo_len * kv_len) of the requests before (plan()
# computes mask_indptr in bits and the kernel adds it to a byte pointer) when packed_custom_mask is given, so FlashInfer
# reads a batch's later requests' masks from the wrong bytes; cuinfer reads each request's segment where FlashInfer's
# own segment_packbits puts it (docs/compat.md). The two agree while every request before the last has qo_len 0.
MASK_QO_LENS, MASK_KV_LENS = [0, 64], [40, 300]


def prefill_ragged(fi: Any, ctx: Ctx, *, causal: bool, mask: bool = False, **opts: Any) -> dict[str, Any]:
    qo_lens, kv_lens = (MASK_QO_LENS, MASK_KV_LENS) if mask else (QO_LENS, KV_LENS)
    qo, kv = ctx.ints(_indptr(qo_lens)), ctx.ints(_indptr(kv_lens))
    q = ctx.randn(sum(qo_lens), HQ, D)
    k, v = ctx.randn(sum(kv_lens), HKV, D), ctx.randn(sum(kv_lens), HKV, D)
    if mask:
        opts["packed_custom_mask"] = _packed_mask(ctx, qo_lens, kv_lens)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(ctx.workspace(), "NHD", backend=BACKEND["name"])
    w.plan(qo, kv, HQ, HKV, D, causal=causal, q_data_type=ctx.dtype, **opts)
    o, lse = w.run(q, k, v, return_lse=True)
    return {"o": o, "lse": lse}


def prefill_lse_forms(fi: Any, ctx: Ctx) -> dict[str, Any]:
    """lse_base='ln' and lse_layout='HN' of FlashInfer's prefill run()."""
    cache, indptr, indices, last = ctx.paged(KV_LENS)
    qo = ctx.ints(_indptr(QO_LENS))
    q = ctx.randn(sum(QO_LENS), HQ, D)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ctx.workspace(), "NHD", backend=BACKEND["name"])
    w.plan(qo, indptr, indices, last, HQ, HKV, D, PAGE, causal=True, q_data_type=ctx.dtype)
    _, ln = w.run(q, cache, return_lse=True, lse_base="ln")
    _, hn = w.run(q, cache, return_lse=True, lse_layout="HN")
    return {"lse (ln)": ln, "lse (HN)": hn}


def single(fi: Any, ctx: Ctx, **opts: Any) -> dict[str, Any]:
    q1 = ctx.randn(HQ, D)
    k, v = ctx.randn(2000, HKV, D), ctx.randn(2000, HKV, D)
    out = {}
    for tc in (False, True):
        o, lse = fi.single_decode_with_kv_cache(q1, k, v, use_tensor_cores=tc, return_lse=True, **opts)
        out[f"decode o (tc={tc})"], out[f"decode lse (tc={tc})"] = o, lse
    q = ctx.randn(300, HQ, D)
    kw = dict(backend=BACKEND["name"], **opts)
    o, lse = fi.single_prefill_with_kv_cache_return_lse(q, k[:700], v[:700], causal=True, **kw)
    out["prefill o (causal)"], out["prefill lse (causal)"] = o, lse
    if not opts:
        out["prefill o (non-causal)"] = fi.single_prefill_with_kv_cache(q, k[:700], v[:700], **kw)
    return out


def merges(fi: Any, ctx: Ctx) -> dict[str, Any]:
    rows, heads = 1000, HQ
    va, vb = ctx.randn(rows, heads, D), ctx.randn(rows, heads, D)
    sa, sb = (ctx.randn(rows, heads, dtype=ctx.torch.float32, scale=4.0) for _ in range(2))
    sa[0] = -math.inf  # an empty state merges as the identity
    v, s = fi.merge_state(va, sa, vb, sb)
    vi, si = va.clone(), sa.clone()
    mask = ctx.torch.arange(rows, device="cuda") % 3 != 0
    fi.merge_state_in_place(vi, si, vb, sb, mask=mask)
    vs = ctx.randn(rows, 7, heads, D)
    ss = ctx.randn(rows, 7, heads, dtype=ctx.torch.float32, scale=4.0)
    vm, sm = fi.merge_states(vs, ss)
    return {"merge_state v": v, "merge_state s": s, "in_place v": vi, "in_place s": si, "merge_states v": vm,
            "merge_states s": sm}  # fmt: skip


def errors(fi: Any, ctx: Ctx) -> dict[str, Any]:
    """Errors FlashInfer raises, by class: a q dtype other than the plan's (ValueError), an unknown
    pos_encoding_mode (KeyError). The table compares which classes each raised."""
    cache, indptr, indices, last = ctx.paged([20, 40])
    q = ctx.randn(2, HQ, D)
    other = ctx.torch.bfloat16 if ctx.dtype_name == "float16" else ctx.torch.float16
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ctx.workspace(), "NHD")
    found = {}
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=other, kv_data_type=other)
    found["q dtype != plan's"] = _raised(lambda: w.run(q, cache), (ValueError,))
    found["pos_encoding_mode='rope'"] = _raised(
        lambda: w.plan(indptr, indices, last, HQ, HKV, D, PAGE, pos_encoding_mode="rope"), (KeyError,)
    )
    return found


def utilities_positions(fi: Any, ctx: Ctx) -> dict[str, Any]:
    """get_seq_lens, and get_batch_indices_positions with two padding rows (FlashInfer: batch index -1, position 0)
    into fresh and into given buffers."""
    torch = ctx.torch
    out = {"get_seq_lens": fi.get_seq_lens(ctx.ints([0, 3, 3, 7]), ctx.ints([5, 1, 16]), PAGE)}
    append_indptr, seq_lens = ctx.ints([0, 9, 26, 26]), ctx.ints([30, 17, 5])
    out["batch_indices"], out["positions"] = fi.get_batch_indices_positions(append_indptr, seq_lens, 28)
    given = [torch.full((28,), 7, dtype=torch.int32, device="cuda") for _ in range(2)]
    fi.get_batch_indices_positions(append_indptr, seq_lens, 28, *given)
    out["batch_indices (given)"], out["positions (given)"] = given
    return out


def utilities_append(fi: Any, ctx: Ctx) -> dict[str, Any]:
    """append_paged_kv_cache in FlashInfer's argument order: the 5-D cache and the (k_cache, v_cache) tuple, NHD and
    HND. The rows' places are computed on the host (FlashInfer's get_batch_indices_positions needs Triton); no
    padding row (batch index -1: cuinfer skips it, FlashInfer's kernel reads kv_indptr[-1])."""
    kv_lens, append = [30, 17, 5], [9, 17, 0]
    bidx = np.concatenate([np.full(n, i) for i, n in enumerate(append)])
    pos = np.concatenate([np.arange(kv - n, kv) for kv, n in zip(kv_lens, append, strict=True)])
    b, p = ctx.ints(bidx), ctx.ints(pos)
    out = {}
    for layout in ("NHD", "HND"):
        cache, kv_indptr, kv_indices, kv_last = ctx.paged(kv_lens, layout)
        k, v = ctx.randn(len(bidx), HKV, D), ctx.randn(len(bidx), HKV, D)
        fi.append_paged_kv_cache(k, v, b, p, cache, kv_indices, kv_indptr, kv_last, layout)
        out[f"cache 5-D {layout}"] = cache
        cache2 = ctx.paged(kv_lens, layout)[0]
        fi.append_paged_kv_cache(k, v, b, p, (cache2[:, 0], cache2[:, 1]), kv_indices, kv_indptr, kv_last,
                                 kv_layout=layout)  # fmt: skip
        out[f"cache (k, v) {layout}"] = cache2
    return out


def utilities_rope(fi: Any, ctx: Ctx) -> dict[str, Any]:
    """The apply_rope family: ragged and pos_ids, plain and Llama 3.1 (FlashInfer's defaults, and other factors),
    copies and in place, rotate-half and interleaved, rotary_dim 64 of 128. Positions stay below 2000: FlashInfer
    turns by __sincosf of a float32 angle, whose error grows with the angle."""
    q, k = ctx.randn(50, HQ, D), ctx.randn(50, HKV, D)
    indptr, offsets = ctx.ints([0, 20, 20, 50]), ctx.ints([7, 3, 1900])
    pos_ids = ctx.ints(ctx.rng.integers(0, 2000, 50))
    out = {}
    qr, kr = fi.apply_rope(q, k, indptr, offsets, rope_theta=5e5)
    out["apply_rope q"], out["apply_rope k"] = qr, kr
    qr, kr = fi.apply_rope_pos_ids(q, k, pos_ids, 64, True, 2.0)
    out["apply_rope_pos_ids q"], out["apply_rope_pos_ids k"] = qr, kr
    qr, kr = fi.apply_llama31_rope(q, k, indptr, offsets)
    out["llama31 q"], out["llama31 k"] = qr, kr
    qr, kr = fi.apply_llama31_rope_pos_ids(q, k, pos_ids, 64, False, 16, 1e6, 2, 8, 4096)
    out["llama31_pos_ids q"], out["llama31_pos_ids k"] = qr, kr
    for name, args in {
        "apply_rope_inplace": (indptr, offsets, None, True),
        "apply_rope_pos_ids_inplace": (pos_ids, 64),
        "apply_llama31_rope_inplace": (indptr, offsets, 64, True),
        "apply_llama31_rope_pos_ids_inplace": (pos_ids,),
    }.items():
        qi, ki = q.clone(), k.clone()
        assert getattr(fi, name)(qi, ki, *args) is None
        out[f"{name} q"], out[f"{name} k"] = qi, ki
    return out


def utilities_rope_cos_sin(fi: Any, ctx: Ctx) -> dict[str, Any]:
    """apply_rope_with_cos_sin_cache (+ _inplace) as vLLM calls it: query / key [nnz, heads * head_size], int64
    positions, a float32 table of rotary_dim 128 and 64 (partial), is_neox True and False."""
    torch = ctx.torch
    nnz, max_pos = 40, 4096
    query, key = ctx.randn(nnz, HQ * D), ctx.randn(nnz, HKV * D)
    positions = torch.tensor(ctx.rng.integers(0, max_pos, nnz), dtype=torch.int64, device="cuda")
    out = {}
    for rot in (D, D // 2):
        inv = 1.0 / (1e4 ** (np.arange(0, rot, 2) / rot))
        ang = np.arange(max_pos)[:, None] * inv[None, :]
        table = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], 1).astype(np.float32)).cuda()
        for neox in (True, False):
            qo, ko = fi.apply_rope_with_cos_sin_cache(positions, query, key, D, table, neox)
            out[f"r{rot} neox={neox} q"], out[f"r{rot} neox={neox} k"] = qo, ko
            qi, ki = query.clone(), key.clone()
            fi.apply_rope_with_cos_sin_cache_inplace(positions, qi, ki, D, table, is_neox=neox)
            out[f"r{rot} neox={neox} q (in place)"], out[f"r{rot} neox={neox} k (in place)"] = qi, ki
    return out


def _raised(fn: Callable[[], Any], kinds: tuple[type, ...]) -> str:
    try:
        fn()
    except kinds as ex:
        return "+".join(k.__name__ for k in kinds if isinstance(ex, k))
    except Exception as ex:  # noqa: BLE001 - the table shows which class was raised instead
        return f"other: {type(ex).__name__}"
    return "nothing"


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., dict[str, Any]]
    kwargs: dict = field(default_factory=dict)
    dtypes: tuple[str, ...] = DTYPES


def _cases() -> list[Case]:
    out = []
    for tc in (False, True):
        for layout in ("NHD", "HND"):
            out.append(Case(f"decode-tc{int(tc)}-{layout}", decode, dict(tc=tc, layout=layout)))
        out.append(Case(f"decode_graph-tc{int(tc)}", decode_graph, dict(tc=tc)))
    for causal in (True, False):
        out.append(Case(f"prefill_paged-{'causal' if causal else 'noncausal'}", prefill_paged, dict(causal=causal)))
    out.append(Case("prefill_paged-HND", prefill_paged, dict(causal=True, layout="HND")))
    out.append(Case("prefill_ragged-causal", prefill_ragged, dict(causal=True)))
    out.append(Case("prefill_ragged-mask", prefill_ragged, dict(causal=False, mask=True)))
    out.append(Case("prefill_lse_forms", prefill_lse_forms))
    out.append(Case("single", single))
    out.append(Case("merge", merges))
    out.append(Case("errors", errors))
    for fn in (utilities_positions, utilities_append, utilities_rope, utilities_rope_cos_sin):
        out.append(Case(fn.__name__, fn))
    # attention options: one FlashInfer module per option and kernel, so float16 only by default
    options = {
        "window_left": dict(window_left=100),
        "logits_soft_cap": dict(logits_soft_cap=30.0),
        "rope_llama": dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5),
        "alibi": dict(pos_encoding_mode="ALIBI"),
    }
    for name, opts in options.items():
        for tc in (False, True):
            out.append(Case(f"decode-tc{int(tc)}-{name}", decode, dict(tc=tc, **opts), ("float16",)))
        out.append(Case(f"prefill_paged-causal-{name}", prefill_paged, dict(causal=True, **opts), ("float16",)))
        out.append(Case(f"prefill_ragged-causal-{name}", prefill_ragged, dict(causal=True, **opts), ("float16",)))
    out.append(Case("single-rope_llama", single, dict(pos_encoding_mode="ROPE_LLAMA"), ("float16",)))
    return out


CASES = _cases()


# ---- running and comparing -------------------------------------------------------------------------------------------


def modules(peers: str | None = None) -> tuple[Any, Any, Any] | str:
    """(torch, flashinfer, cuinfer.compat.flashinfer), or why they cannot run here."""
    if peers:
        sys.path.insert(0, peers)
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.peers import flashinfer_or_reason  # (FlashInfer's JIT environment, as the benchmark suites set it)

    real, why = flashinfer_or_reason()
    if real is None:
        return f"FlashInfer is not importable ({why}); see docs/benchmarks.md, 'Peers on the GPU machine'"
    import cuinfer.compat.flashinfer as compat

    return torch, real, compat


@dataclass
class Row:
    case: str
    dtype: str
    output: str
    max_abs: float
    ok: bool
    note: str = ""


def compare(torch: Any, case: str, dtype: str, got: dict, want: dict) -> list[Row]:
    tol = TOL[dtype]
    rows = []
    if set(got) != set(want):
        return [Row(case, dtype, "outputs", math.nan, False, f"compat gave {sorted(got)}, FlashInfer {sorted(want)}")]
    for name, w in want.items():
        g = got[name]
        if not torch.is_tensor(w):
            rows.append(Row(case, dtype, name, 0.0, g == w, f"compat: {g}, FlashInfer: {w}"))
            continue
        if not torch.is_tensor(g) or g.dtype != w.dtype or tuple(g.shape) != tuple(w.shape) or g.device != w.device:
            note = f"compat returned {type(g).__name__} {getattr(g, 'dtype', '')} {tuple(getattr(g, 'shape', ()))}"
            rows.append(Row(case, dtype, name, math.nan, False, note + f"; FlashInfer {w.dtype} {tuple(w.shape)}"))
            continue
        a, b = g.double(), w.double()
        diff = (a - b).abs()
        diff[a == b] = 0  # equal infinities
        nan = bool(torch.isnan(diff).any())
        ok = not nan and bool((diff <= tol + tol * b.abs()).all())
        rows.append(Row(case, dtype, name, float(diff.nan_to_num(nan=math.inf).max()), ok, "NaN" if nan else ""))
    return rows


def run_case(torch: Any, real: Any, compat: Any, case: Case, dtype: str, seed: int = 0) -> list[Row]:
    want = case.fn(real, Ctx(torch, dtype, seed), **case.kwargs)
    torch.cuda.synchronize()
    got = case.fn(compat, Ctx(torch, dtype, seed), **case.kwargs)
    torch.cuda.synchronize()
    return compare(torch, case.name, dtype, got, want)


# ---- pytest ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mods():
    found = modules()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.mark.parametrize(
    ("case", "dtype"), [pytest.param(c, d, id=f"{c.name}-{d}") for c in CASES for d in c.dtypes]
)  # fmt: skip
def test_compat_matches_flashinfer(mods, case, dtype):
    rows = run_case(*mods, case, dtype)
    bad = [r for r in rows if not r.ok]
    assert not bad, "\n".join(f"{r.output}: max |Δ| {r.max_abs:.3g} > tol {TOL[dtype]} {r.note}" for r in bad)


# ---- script ----------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", help="a directory to put first on sys.path (pip install --target DIR .peers/*.whl)")
    ap.add_argument("--cases", help="comma-separated case-name prefixes, or whole names ending in '$' (default: all)")
    ap.add_argument("--dtypes", help="comma-separated dtypes for every case (default: each case's own)")
    ap.add_argument("--backend", default="fa2", help="FlashInfer prefill backend the cases ask for (fa2, auto, fa3)")
    args = ap.parse_args(argv)
    BACKEND["name"] = args.backend
    found = modules(args.peers)
    if isinstance(found, str):
        print(f"cannot run: {found}")
        return 2
    torch, real, compat = found
    prefixes = args.cases.split(",") if args.cases else None
    print(f"FlashInfer {real.__version__} vs cuinfer.compat.flashinfer {compat.__version__} on "
          f"{torch.cuda.get_device_name()}, prefill backend={args.backend!r}; tolerance 1e-3 (float16), "
          "1e-2 (bfloat16)")  # fmt: skip
    print(f"{'case':<34} {'dtype':<9} {'output':<28} {'max |Δ|':>10}  result")
    failed = 0
    for case in CASES:
        if prefixes and not any(case.name == p[:-1] if p.endswith("$") else case.name.startswith(p) for p in prefixes):
            continue
        for dtype in args.dtypes.split(",") if args.dtypes else case.dtypes:
            try:
                rows = run_case(torch, real, compat, case, dtype)
            except Exception as ex:  # noqa: BLE001 - one failing case is a row, the others still run
                rows = [Row(case.name, dtype, "(raised)", math.nan, False, f"{type(ex).__name__}: {ex}"[:200])]
                torch.cuda.synchronize()
            for r in rows:
                failed += not r.ok
                note = f"  {r.note}" if r.note else ""
                print(f"{r.case:<34} {r.dtype:<9} {r.output:<28} {r.max_abs:>10.3g}  "
                      f"{'ok' if r.ok else 'FAIL'}{note}", flush=True)  # fmt: skip
    print(f"{failed} output(s) out of tolerance" if failed else "all outputs within tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
