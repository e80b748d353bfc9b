"""Timing by the docs/benchmarks.md method, and the machine's ceilings measured in the same run.

GPU time: CUDA events through torch on torch's current stream (cuinfer enqueues on it for torch inputs), L2 flushed
before every timed run by writing a 512 MB buffer (the H200's L2 is 60 MB: a decode over a warm L2 would read part
of its KV from cache and beat the HBM roofline), warm-up runs first (they also absorb JIT compiles), median of the
timed runs. Host time (plan()): ``time.perf_counter`` around single calls, median.

Ceilings: ``measure_copy_bandwidth`` (device-to-device copy, bytes read + written, like the anchor script) and
``measure_matmul`` (dense bf16 GEMM) run in the same process as the suites, so every result is reported as a
percentage of what this machine did today, not of a datasheet number.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

FLUSH_BYTES = 512 << 20
#: GPU clock cycles (~1 ms) the stream idles after the L2 flush, before the start event: the host enqueues the timed
#: call meanwhile, so a host slower than the flush (run()'s Python side on a slow CPU) cannot leave the GPU idle
#: inside the timed interval. Without it the same kernel measured up to 9 % slower on one machine's host than on
#: another's, and FlashInfer (less host work per run) did not.
HEAD_START_CYCLES = 2_000_000


class NoDeviceError(RuntimeError):
    """Raised when a suite needs a CUDA GPU and torch sees none."""


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    n: int

    @classmethod
    def from_samples(cls, samples_s: list[float]) -> Timing:
        if not samples_s:
            raise ValueError("a timing needs at least one sample, got none")
        return cls(statistics.median(samples_s), min(samples_s), max(samples_s), len(samples_s))

    @property
    def us(self) -> float:
        return self.median_s * 1e6


@dataclass(frozen=True)
class Roofline:
    copy_gbps: float
    matmul_tflops: float
    copy_bytes: int
    matmul_n: int

    def as_dict(self) -> dict:
        return asdict(self)


def cuda_torch():
    """torch, after checking that it sees a CUDA device (clear message instead of a deep CUDA error)."""
    try:
        import torch
    except ImportError as ex:
        raise NoDeviceError(f"the GPU suites need torch with CUDA; importing torch failed: {ex}") from ex
    if not torch.cuda.is_available():
        raise NoDeviceError(
            f"no CUDA device: torch {torch.__version__} reports torch.cuda.is_available() == False; "
            "run the suites on the GPU machine (python -m bench --help works anywhere)"
        )
    return torch


class CudaTimer:
    """Times GPU work with CUDA events on torch's current stream, flushing L2 before every timed run."""

    def __init__(self, *, flush_bytes: int = FLUSH_BYTES, clean_flush: bool = False) -> None:
        """``clean_flush``: after the write, read a second buffer of the same size, so the timed kernel finds the
        L2 full of clean lines instead of dirty ones it must write back (a diagnostic, not the docs/benchmarks.md
        method)."""
        torch = cuda_torch()
        self._torch = torch
        self._flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda") if flush_bytes else None
        self._clean = torch.ones(flush_bytes, dtype=torch.uint8, device="cuda") if flush_bytes and clean_flush else None

    def sync(self) -> None:
        self._torch.cuda.synchronize()

    def head_start(self) -> None:
        """Let the stream idle ~1 ms (see HEAD_START_CYCLES) so the host is ahead of the GPU at the start event."""
        self._torch.cuda._sleep(HEAD_START_CYCLES)

    def flush_l2(self) -> None:
        if self._flush is not None:
            self._flush.zero_()  # a 512 MB write evicts everything the previous run left in the 60 MB L2
        if self._clean is not None:
            self._clean.sum()  # ... and a read replaces those dirty lines with clean ones

    def time(self, fn: Callable[[], object], *, iters: int, warmup: int, flush: bool = True) -> Timing:
        """Median GPU time of ``fn`` over ``iters`` runs after ``warmup`` untimed runs.

        The flush is enqueued before the start event, so it is not timed but the kernel starts with a cold L2; a
        ~1 ms GPU sleep after it gives the host a head start to enqueue ``fn`` before the GPU reaches the start event
        (the time measured is the device's, whatever the host's speed).
        """
        torch = self._torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(iters):
            if flush:
                self.flush_l2()
            self.head_start()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3)
        return Timing.from_samples(samples)


def time_host(fn: Callable[[], object], *, iters: int = 100, warmup: int = 5) -> Timing:
    """Median host wall time of single calls of ``fn`` (perf_counter), e.g. plan(): what a serving loop pays."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return Timing.from_samples(samples)


def measure_copy_bandwidth(timer: CudaTimer, *, nbytes: int = 4 << 30, iters: int = 20) -> float:
    """Device-to-device copy of ``nbytes``: GB/s counting bytes read + written (the decode/merge ceiling)."""
    torch = cuda_torch()

    def timed() -> Timing:
        a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        a.random_(0, 255)
        # buffers far larger than L2: no flush needed, and a flush would only add noise
        return timer.time(lambda: b.copy_(a), iters=iters, warmup=3, flush=False)

    t = timed()
    torch.cuda.empty_cache()  # the buffers died with timed(): give their 2·nbytes back before the suites
    return 2 * nbytes / t.median_s / 1e9


def measure_matmul(timer: CudaTimer, *, n: int = 8192, iters: int = 20) -> float:
    """Dense bf16 ``n³`` matmul rate in TFLOP/s (``2·n³`` FLOPs): the prefill ceiling."""
    torch = cuda_torch()

    def timed() -> Timing:
        a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        return timer.time(lambda: a @ b, iters=iters, warmup=3, flush=False)

    t = timed()
    torch.cuda.empty_cache()
    return 2 * n**3 / t.median_s / 1e12


def measure_roofline(timer: CudaTimer, *, quick: bool = False) -> Roofline:
    copy_bytes = (1 << 30) if quick else (4 << 30)
    n = 4096 if quick else 8192
    return Roofline(
        copy_gbps=measure_copy_bandwidth(timer, nbytes=copy_bytes, iters=5 if quick else 20),
        matmul_tflops=measure_matmul(timer, n=n, iters=5 if quick else 20),
        copy_bytes=copy_bytes,
        matmul_n=n,
    )
