"""The standard cases of docs/benchmarks.md: shapes, length distributions with fixed seeds, targets, byte and FLOP
counts.

Pure NumPy (no torch, no GPU): the CPU tests check these definitions against docs/benchmarks.md. Tensors on the device
are built from these in ``bench/inputs.py``.

Every case draws its lengths from ``numpy.random.default_rng(case.seed)`` so every run (and every machine) sees the
same lengths. The seeds differ from the single ``default_rng(0)`` stream of the anchor script, so uniform and zipf
lengths are not the anchor's exact draws; their distributions are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

DISTRIBUTIONS = ("const", "uniform", "zipf", "onelong")


@dataclass(frozen=True)
class Shape:
    """Attention shape of one layer. The default is Llama-3.1-8B: 32 query heads, 8 KV heads, d128, bf16, page 16."""

    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    dtype: str = "bfloat16"
    kv_layout: str = "NHD"


LLAMA31_8B = Shape()

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float32": 4}


@dataclass(frozen=True)
class Lengths:
    """A batch of sequence lengths drawn from one of the docs/benchmarks.md distributions.

    - ``const``: every request ``mean``.
    - ``uniform``: integers in ``[lo, hi]``, both ends included (docs/benchmarks.md's "uniform[512,1024]").
    - ``zipf``: ``rng.zipf(1.5, batch)`` scaled so its mean is ``mean``, truncated to int, clipped to
      ``[16, 64·mean]`` (after clipping the mean is no longer exactly ``mean``; the anchor does the same).
    - ``onelong``: request 0 is ``32·mean``, the rest ``mean``: the imbalance a planner must split.
    """

    dist: str
    batch: int
    mean: int = 0
    lo: int = 0
    hi: int = 0

    def __post_init__(self) -> None:
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"length distribution must be one of {DISTRIBUTIONS}, got {self.dist!r}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.dist == "uniform" and not (1 <= self.lo <= self.hi):
            raise ValueError(f"uniform lengths need 1 <= lo <= hi, got lo={self.lo} hi={self.hi}")
        if self.dist != "uniform" and self.mean < 1:
            raise ValueError(f"{self.dist} lengths need mean >= 1, got {self.mean}")

    def draw(self, seed: int) -> np.ndarray:
        """The lengths (int64, shape [batch]) for this seed; the same seed always gives the same lengths."""
        rng = np.random.default_rng(seed)
        if self.dist == "const":
            return np.full(self.batch, self.mean, dtype=np.int64)
        if self.dist == "uniform":
            return rng.integers(self.lo, self.hi + 1, size=self.batch).astype(np.int64)
        if self.dist == "zipf":
            x = rng.zipf(1.5, size=self.batch).astype(np.float64)
            x = x / x.mean() * self.mean
            return np.clip(x.astype(np.int64), 16, 64 * self.mean)
        x = np.full(self.batch, self.mean, dtype=np.int64)  # onelong
        x[0] = 32 * self.mean
        return x

    def describe(self) -> str:
        if self.dist == "const":
            return f"{self.batch} × {self.mean}"
        if self.dist == "uniform":
            return f"{self.batch} × uniform[{self.lo},{self.hi}]"
        if self.dist == "zipf":
            return f"{self.batch} × zipf mean {self.mean}"
        return f"{self.batch} × onelong({self.mean})"


@dataclass(frozen=True)
class Target:
    """A docs/benchmarks.md target on one metric: ``us`` is an upper bound, ``gbps``/``tflops``/``pct_copy`` lower
    bounds."""

    metric: str
    value: float
    text: str

    def check(self, values: dict) -> bool | None:
        """True/False when the metric was measured, None when it is missing (error rows)."""
        got = values.get(self.metric)
        if got is None:
            return None
        return got <= self.value if self.metric == "us" else got >= self.value


@dataclass(frozen=True)
class AllOf:
    """Several targets of one row, each on its own metric (``ratio``: the speed-up over the ``compare_to`` case in the
    same run; ``vs_peer``: over the best peer); met when every one is, unknown while one is unmeasured."""

    parts: tuple[Target, ...]

    @property
    def text(self) -> str:
        return "; ".join(p.text for p in self.parts)

    def check(self, values: dict) -> bool | None:
        got = [p.check(values) for p in self.parts]
        return False if False in got else None if None in got else True


@dataclass(frozen=True)
class DecodeCase:
    id: str
    lengths: Lengths
    seed: int
    target: Target | AllOf
    anchor: str  # FlashInfer's best in docs/benchmarks.md, for the record
    kv_dtype: str = "bfloat16"
    shape: Shape = LLAMA31_8B
    compare_to: str = ""  # the 16-bit-KV case of the same shape (fp8 cases: their ratio target)

    def describe(self) -> str:
        kv = "" if self.kv_dtype == self.shape.dtype else f", {self.kv_dtype} KV"
        return self.lengths.describe() + kv


@dataclass(frozen=True)
class PrefillCase:
    id: str
    layout: str  # "ragged" | "paged"
    lengths: Lengths
    seed: int
    target_fa2: Target
    target_hopper: Target
    anchor: dict = field(default_factory=dict)  # docs/benchmarks.md TFLOP/s of the peers, for the record
    causal: bool = True
    shape: Shape = LLAMA31_8B
    kv_dtype: str = "bfloat16"
    compare_to: str = ""  # the 16-bit-KV case of the same shape (fp8 cases: their ratio target)

    def describe(self) -> str:
        kv = "" if self.kv_dtype == self.shape.dtype else f", {self.kv_dtype} KV"
        return f"{self.layout} {self.lengths.describe()}{kv}"


@dataclass(frozen=True)
class MergeCase:
    id: str
    rows: int
    num_states: int
    seed: int
    target: Target
    num_heads: int = 32
    head_dim: int = 128
    dtype: str = "bfloat16"

    def describe(self) -> str:
        return f"{self.num_states} states × [{self.rows}, {self.num_heads}, {self.head_dim}] {self.dtype}"


@dataclass(frozen=True)
class PlanCase:
    id: str
    kind: str  # "decode" | "prefill"
    lengths: Lengths
    seed: int
    target: Target
    shape: Shape = LLAMA31_8B

    def describe(self) -> str:
        return f"{self.kind} plan, {self.lengths.describe()}"


def _us(v: float) -> Target:
    return Target("us", v, f"≤ {v:g} µs")


def _tbps(v: float, extra: str = "") -> Target:
    return Target("gbps", v * 1000.0, f"≥ {v:g} TB/s{extra}")


def _tflops(v: float) -> Target:
    return Target("tflops", v, f"≥ {v:g} TFLOP/s")


def _ratio(v: float, base: str) -> Target:
    return Target("ratio", v, f"≥ {v:g}× {base}")


def _vs_peer(v: float, peer: str) -> Target:
    return Target("vs_peer", v, f"≥ {v:g}× {peer}")


# The small decode steps' targets: a margin over the floor of reading their bytes in page order by the same method
# (python -m bench.lab.stream_floor; docs/benchmarks.md, "The floor of a decode step", measured 2026-11-30).
DECODE_FLOOR_US = {"D1": 23.3, "D2": 19.0, "D3": 23.2, "D4": 40.2}
DECODE_FLOOR_MARGIN_US = 3.0


def _over_floor(case_id: str) -> Target:
    floor = DECODE_FLOOR_US[case_id]
    v = round(floor + DECODE_FLOOR_MARGIN_US, 1)
    return Target("us", v, f"≤ {v:.1f} µs (floor {floor:.1f} + {DECODE_FLOOR_MARGIN_US:g})")


DECODE_CASES: tuple[DecodeCase, ...] = (
    DecodeCase("D1", Lengths("const", 16, 1024), 1, _over_floor("D1"), "34.8 µs, 1.93 TB/s (decode, CUDA cores)"),
    DecodeCase(
        "D2", Lengths("uniform", 16, lo=512, hi=1024), 2, _over_floor("D2"), "30.8 µs, 1.68 TB/s (tensor cores)"
    ),
    DecodeCase("D3", Lengths("zipf", 16, 1024), 3, _over_floor("D3"), "35.9 µs, 1.88 TB/s (tensor cores)"),
    DecodeCase("D4", Lengths("const", 1, 32768), 4, _over_floor("D4"), "52.4 µs, 2.56 TB/s (tensor cores)"),
    DecodeCase("D5", Lengths("const", 64, 4096), 5, _tbps(4.1), "256.6 µs, 4.19 TB/s (tensor cores)"),
    DecodeCase("D6", Lengths("const", 128, 2048), 6, _tbps(4.1), "259.9 µs, 4.14 TB/s (tensor cores)"),
    DecodeCase("D7", Lengths("const", 256, 1024), 7, _tbps(4.1), "266.2 µs, 4.05 TB/s (tensor cores)"),
    DecodeCase("D8", Lengths("onelong", 128, 1024), 8, _tbps(3.9), "174.6 µs, 3.83 TB/s (BatchAttention)"),
    DecodeCase("D9", Lengths("zipf", 128, 2048), 9, _tbps(3.9), "3.29 TB/s (BatchAttention)"),
    # fp8 KV (issue 18): D10 against cuinfer's bf16 D6 and FlashInfer's fp8 decode in the same run; the D5 and D9
    # shapes (their lengths: the same seeds) in TB/s of fp8 bytes
    DecodeCase(
        "D10",
        Lengths("const", 128, 2048),
        10,
        AllOf((_tbps(3.6, " (≤ 150 µs)"), _ratio(1.8, "D6 (bf16 KV)"), _vs_peer(1.5, "FlashInfer fp8"))),
        "229.7 µs, 2.35 TB/s (tensor cores)",
        kv_dtype="float8_e4m3fn",
        compare_to="D6",
    ),
    DecodeCase("D5-e4m3", Lengths("const", 64, 4096), 5, _tbps(3.6), "", kv_dtype="float8_e4m3fn", compare_to="D5"),
    DecodeCase("D9-e4m3", Lengths("zipf", 128, 2048), 9, _tbps(3.6), "", kv_dtype="float8_e4m3fn", compare_to="D9"),
)

_P_UNIFORM = Lengths("uniform", 16, lo=512, hi=2048)
PREFILL_CASES: tuple[PrefillCase, ...] = (
    PrefillCase(
        "P1",
        "ragged",
        Lengths("const", 1, 8192),
        101,
        _tflops(375),
        _tflops(680),
        {"fa2": 357, "fa3": 666, "cudnn": 609, "sdpa-flash": 317},
    ),  # fmt: skip
    PrefillCase(
        "P2",
        "ragged",
        Lengths("const", 4, 4096),
        102,
        _tflops(390),
        _tflops(660),
        {"fa2": 370, "fa3": 639, "cudnn": 595, "sdpa-flash": 326},
    ),  # fmt: skip
    PrefillCase("P3", "ragged", _P_UNIFORM, 103, _tflops(350), _tflops(500), {"fa2": 331, "fa3": 461}),
    PrefillCase("P4", "paged", Lengths("const", 1, 8192), 104, _tflops(340), _tflops(620), {"fa2": 324, "fa3": 544}),
    PrefillCase("P5", "paged", Lengths("const", 4, 4096), 105, _tflops(345), _tflops(560), {"fa2": 328, "fa3": 476}),
    PrefillCase("P6", "paged", _P_UNIFORM, 106, _tflops(300), _tflops(440), {"fa2": 286, "fa3": 364}),
)


def _fp8_prefill(p: PrefillCase) -> PrefillCase:
    """fp8 KV (issue 18) on a paged shape (the same lengths: the same seed), judged against cuinfer's bf16-KV case of
    that shape in the same run."""
    t = _ratio(1.0, f"{p.id} (bf16 KV)")
    return replace(p, id=f"{p.id}-e4m3", target_fa2=t, target_hopper=t, anchor={}, kv_dtype="float8_e4m3fn",
                   compare_to=p.id)  # fmt: skip


PREFILL_CASES += tuple(_fp8_prefill(p) for p in PREFILL_CASES if p.layout == "paged")

MERGE_CASES: tuple[MergeCase, ...] = (MergeCase("M1", 16384, 8, 201, Target("pct_copy", 80.0, "≥ 80 % of copy")),)

# Decode plans reuse the lengths (and seeds) of D6, D8, D9: batch 128, even, one long request, zipf.
PLAN_CASES: tuple[PlanCase, ...] = (
    PlanCase("plan-D6", "decode", Lengths("const", 128, 2048), 6, _us(50)),
    PlanCase("plan-D8", "decode", Lengths("onelong", 128, 1024), 8, _us(50)),
    PlanCase("plan-D9", "decode", Lengths("zipf", 128, 2048), 9, _us(50)),
    PlanCase("plan-P64", "prefill", Lengths("uniform", 64, lo=512, hi=2048), 301, _us(80)),
)

ALL_CASES = {"merge": MERGE_CASES, "decode": DECODE_CASES, "prefill": PREFILL_CASES, "plan": PLAN_CASES}


def select(suite: str, ids: list[str] | None) -> tuple:
    """The cases of ``suite`` named in ``ids`` (all of them when ``ids`` is None), in the suite's order."""
    cases = ALL_CASES[suite]
    if ids is None:
        return cases
    wanted = {i.strip().lower() for i in ids}
    return tuple(c for c in cases if c.id.lower() in wanted)


def known_ids() -> list[str]:
    return [c.id for cases in ALL_CASES.values() for c in cases]


# ----------------------------------------------------------------------------------------------- counting


def decode_bytes(kv_lens, shape: Shape = LLAMA31_8B, kv_dtype: str | None = None) -> int:
    """Bytes a decode step must move: K and V of every token actually attended, plus q read and o written.

    K and V: ``sum(kv_lens) · num_kv_heads · head_dim · 2 · itemsize(kv)``; q and o: ``2 · B · num_qo_heads ·
    head_dim · itemsize(q)``. Page padding past ``kv_last_page_len`` is not counted (it need not be read).
    """
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    kv_item = ITEMSIZE[kv_dtype or shape.dtype]
    kv = int(kv_lens.sum()) * shape.num_kv_heads * shape.head_dim * 2 * kv_item
    qo = 2 * len(kv_lens) * shape.num_qo_heads * shape.head_dim * ITEMSIZE[shape.dtype]
    return kv + qo


def attended_pairs(qo_len: int, kv_len: int, causal: bool = True) -> int:
    """Query-key pairs one request attends. Causal is bottom-right aligned (docs/api.md): row i sees kv j iff
    ``j <= i + kv_len - qo_len``, so row i sees ``clip(i + kv_len - qo_len + 1, 0, kv_len)`` keys."""
    if not causal:
        return qo_len * kv_len
    seen = np.clip(np.arange(qo_len, dtype=np.int64) + (kv_len - qo_len) + 1, 0, kv_len)
    return int(seen.sum())


def prefill_flops(qo_lens, kv_lens=None, shape: Shape = LLAMA31_8B, causal: bool = True) -> int:
    """FLOPs of a prefill: ``4 · num_qo_heads · head_dim · (attended q-k pairs)`` (QK^T and PV, 2 FLOPs a MAC)."""
    qo_lens = np.asarray(qo_lens, dtype=np.int64)
    kv_lens = qo_lens if kv_lens is None else np.asarray(kv_lens, dtype=np.int64)
    pairs = sum(attended_pairs(int(q), int(k), causal) for q, k in zip(qo_lens, kv_lens, strict=True))
    return 4 * shape.num_qo_heads * shape.head_dim * pairs


def merge_bytes(case: MergeCase) -> int:
    """Bytes of merge_states: every state read (o and float32 lse) and the merged state written (o and lse)."""
    item = ITEMSIZE[case.dtype]
    per_state = case.num_heads * (case.head_dim * item + 4)
    return case.rows * per_state * (case.num_states + 1)


@dataclass(frozen=True)
class PageTable:
    """CSR page table (docs/api.md): request i owns pages ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``."""

    kv_indptr: np.ndarray  # int32 [B+1]
    kv_indices: np.ndarray  # int32 [total pages]
    kv_last_page_len: np.ndarray  # int32 [B], in [1, page_size]
    num_pages: int  # size of the pool the indices point into

    def kv_lens(self, page_size: int) -> np.ndarray:
        pages = np.diff(self.kv_indptr).astype(np.int64)
        return page_size * (pages - 1) + self.kv_last_page_len


def page_table(kv_lens, page_size: int, seed: int) -> PageTable:
    """Pages for ``kv_lens`` scattered over a pool of exactly that many pages by a random permutation (seeded):
    consecutive pages of a request are not adjacent in memory, as in a serving engine after some churn."""
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    if (kv_lens < 1).any():
        raise ValueError(f"every kv length must be >= 1 for a paged cache, got min {int(kv_lens.min())}")
    pages = (kv_lens + page_size - 1) // page_size
    total = int(pages.sum())
    perm = np.random.default_rng(seed + 7919).permutation(total).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = ((kv_lens - 1) % page_size + 1).astype(np.int32)
    return PageTable(indptr, perm, last, total)


def indptr(lens) -> np.ndarray:
    """Ragged offsets: request i owns rows ``indptr[i]:indptr[i+1]``."""
    return np.concatenate([[0], np.cumsum(np.asarray(lens, dtype=np.int64))]).astype(np.int32)
