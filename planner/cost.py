"""The cost model that balances work items over CTAs (the paper's ``cost = alpha*rows + beta*kv + gamma``).

A work item is one query tile of one request for one KV head over one KV chunk. Its cost is an estimate of the time
one persistent CTA spends on it, in *KV-token units*: 1.0 is the time to stream the K and V of one token of one head
(head_dim 128, bf16: 512 bytes) through one CTA. Decode is memory bound, so the KV term dominates there; prefill is
compute bound, but every prefill tile has the same number of rows (Br), so its time is still linear in its KV length
and the same model orders and balances the tiles correctly (only the ratio between the terms matters to the planner).

Defaults and why:

- ``alpha = 1.0`` per packed query row: a row reads q (256 B) and writes o (256 B), about one KV token of traffic.
- ``beta = 1.0`` per KV token: the unit.
- ``gamma = 64.0`` per item: the fixed latency of an item (page-table reads, pipeline fill, epilogue), about 1 us of
  memory latency; at ~32 GB/s per SM (4.2 TB/s over 132 SMs) 1 us streams ~64 tokens of K+V.
- ``partial_row = 2.0`` per row a *split* item writes to the workspace: a float32 o row (512 B) plus its lse, read
  back once by the merge, so ~1 KB, two tokens' worth.
- ``split_fixed = 128.0``: the one-time price of splitting at all (the merge phase waits for all partial states), paid
  once on every CTA's timeline, so the split policy only splits when the balance gained is worth more than this.

The numbers are estimates to be calibrated against the kernels; they only steer choices (split or not, chunk size,
which CTA gets which item), never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class CostModel:
    """``cost(item) = alpha*rows + beta*kv_tokens + gamma (+ partial_row*rows if the item is one chunk of a split)``."""

    alpha: float = 1.0
    beta: float = 1.0
    gamma: float = 64.0
    partial_row: float = 2.0
    split_fixed: float = 128.0
    # Decode lane cuts (planner/decode_plan.py) only: the fixed cost of a piece a cut makes inside a request (its q
    # load, epilogue and partial state's merge; None: gamma, which also holds the padding of a request's last tile),
    # and the split policy's thresholds (None: split_kv.BALANCED_EFFICIENCY and MIN_GAIN).
    piece_gamma: float | None = None
    balanced_efficiency: float | None = None
    min_gain: float | None = None
    integral: bool = field(default=False, init=False, compare=False, repr=False)  # set from the terms
    # (int(alpha), int(beta), int(gamma)) when integral, else None: the plan path reads them as ints every call
    int_terms: tuple | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # gamma > 0 keeps every item's cost positive (an empty tile still costs its launch), which the assignment
        # relies on (it divides by item costs); beta > 0 keeps longer KV ranges costlier.
        for name, value, low_ok in (
            ("alpha", self.alpha, True),
            ("beta", self.beta, False),
            ("gamma", self.gamma, False),
            ("partial_row", self.partial_row, True),
            ("split_fixed", self.split_fixed, True),
        ):
            v = float(value)
            if not np.isfinite(v) or v < 0 or (v == 0 and not low_ok):
                need = ">= 0" if low_ok else "> 0"
                raise ValueError(
                    f"CostModel.{name} must be finite and {need}, got {value!r}; use the default "
                    f"{getattr(CostModel, name)!r} unless you have calibrated the kernels"
                )
        for name, value, lo, hi in (
            ("piece_gamma", self.piece_gamma, 0.0, np.inf),
            ("balanced_efficiency", self.balanced_efficiency, 0.0, 1.0),
            ("min_gain", self.min_gain, 0.0, 1.0),
        ):
            if value is not None and not (lo <= float(value) <= hi and np.isfinite(float(value))):
                raise ValueError(
                    f"CostModel.{name} must be None or a finite number in [{lo}, {hi}], got {value!r}; leave it None "
                    "unless you have calibrated the decode kernels"
                )
        # alpha, beta, gamma whole numbers: the costs of whole tiles can be int64 (faster prefix sums)
        integral = all(float(v).is_integer() for v in (self.alpha, self.beta, self.gamma))
        object.__setattr__(self, "integral", integral)
        object.__setattr__(self, "int_terms", (int(self.alpha), int(self.beta), int(self.gamma)) if integral else None)

    def item_cost(self, rows, kv_tokens, split=False):
        """Cost of items with ``rows`` packed query rows over ``kv_tokens`` KV tokens (arrays broadcast)."""
        c = self.alpha * np.asarray(rows, dtype=np.float64) + self.beta * np.asarray(kv_tokens, dtype=np.float64)
        c = c + self.gamma
        if split is not False:
            c = c + self.partial_row * np.asarray(rows, dtype=np.float64) * np.asarray(split, dtype=np.float64)
        return c


#: The default cost model (immutable, shared).
DEFAULT_COST = CostModel()


#: The cost model of decode plans over fp8 K/V (1-byte elements), in the same unit (one KV token streamed through a
#: CTA): such a token streams in half a bf16 token's time, so a query row's traffic and a partial state count twice the
#: tokens (alpha 2, partial_row 4), and a request's fixed cost four times (gamma 256: calibrated on the H200, where 128
#: (twice bf16's) left D9's zipf batch over an e4m3 cache 13 % slower and the other decode shapes within 2 %;
#: docs/results/lab-findings.md). An fp8 CTA computes longer per byte than a 16-bit one (2.1 against 1.9 µs per 32 KB
#: tile in D10's and D6's loops), and a step whose fp8 CTAs run out of work unevenly loses part of the SMs' share where
#: a 16-bit step loses nothing (D6 with the cut: 1.00x). The lane cut pays off on batches that whole requests balance to
#: 97 % (D10: 146.0 against 149.9 µs, D5 over e4m3 144.2 against 147.4, 2026-12-04 on the H200), so fp8 plans cut unless
#: the whole plan is within 1 % of balanced, and a cut must gain 1 %. A piece a cut makes costs 64 (its tiles are whole,
#: without the padding of a request's last tile that gamma holds; 32 and 128 planned D10 and D9-e4m3 within 0.1 %), and
#: the split has no fixed price (the kernel merges a request's pieces itself; the 16-bit split_fixed is the older merge
#: phase's wait). D7 and S2's shapes over e4m3 gained 3.9 % with it too. Prefill, compute bound, keeps DEFAULT_COST.
FP8_COST = CostModel(
    alpha=2.0, gamma=256.0, partial_row=4.0, split_fixed=0.0, piece_gamma=64.0, balanced_efficiency=0.99, min_gain=0.01
)


def kv_itemsize_cost(kv_itemsize: int) -> CostModel:
    """The decode planner's cost model for K/V elements of ``kv_itemsize`` bytes: DEFAULT_COST for 2 (float16 /
    bfloat16), FP8_COST for 1 (fp8).

    >>> kv_itemsize_cost(1).gamma, kv_itemsize_cost(2) is DEFAULT_COST
    (256.0, True)
    """
    if kv_itemsize == 2:
        return DEFAULT_COST
    if kv_itemsize == 1:
        return FP8_COST
    raise ValueError(f"kv_itemsize must be 1 (fp8) or 2 (float16 / bfloat16), got {kv_itemsize!r}")
