"""Finding the implementations: cuinfer (this checkout), FlashInfer (the peer pack), torch SDPA; run environment.

FlashInfer JIT-compiles each kernel module on first use (15-100 s each, with nvcc). Its compile cache goes to
``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``; unless the caller set it, this points it at
``bench/.peer-cache`` inside the checkout, a git-ignored build output that the GPU machine keeps between calls, so
a second ``python -m bench`` call on a warm machine loads the modules instead of compiling them again.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEER_CACHE = REPO / "bench" / ".peer-cache"


def setup_peer_env() -> None:
    """Defaults for FlashInfer's JIT (before its import): arch of device 0, all cores, a cache in the checkout."""
    from bench.timing import cuda_torch

    torch = cuda_torch()
    major, minor = torch.cuda.get_device_capability(0)
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", f"{major}.{minor}{'a' if major >= 9 else ''}")
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(PEER_CACHE))


@functools.cache
def flashinfer_or_reason() -> tuple[object | None, str]:
    """(module, version) when FlashInfer imports, else (None, why not)."""
    setup_peer_env()
    try:
        import flashinfer
    except Exception as ex:  # noqa: BLE001 - any import failure means the peer is absent, with the reason
        from bench.suite import first_line

        return None, first_line(ex)
    return flashinfer, str(getattr(flashinfer, "__version__", "unknown"))


_SAID_ABSENT: list[bool] = []


def use_flashinfer(ctx) -> bool:
    """Whether the FlashInfer rows run: peers asked for and the module imports. Says once why not."""
    if not ctx.peers:
        return False
    mod, why = flashinfer_or_reason()
    if mod is None and not _SAID_ABSENT:
        _SAID_ABSENT.append(True)
        ctx.log(f"FlashInfer is not importable ({why}): its columns show –")
    return mod is not None


def flashinfer():
    """The FlashInfer module; raises ImportError with the reason when it is not importable."""
    mod, why = flashinfer_or_reason()
    if mod is None:
        raise ImportError(
            f"FlashInfer is not importable ({why}); install the peer pack (docs/benchmarks.md, 'Peers on the GPU "
            "machine')"
        )
    return mod


@functools.cache
def flashinfer_workspace():
    """One 256 MB FlashInfer workspace shared by its wrappers, as in the anchor script (they run one at a time)."""
    from bench.timing import cuda_torch

    torch = cuda_torch()
    return torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")


def cuinfer():
    """The cuinfer package of this checkout; an ImportError says how to make it importable."""
    try:
        import cuinfer.planner  # noqa: F401 - mapped from planner/ by package-dir: needs an install

        import cuinfer as mod
    except ImportError as ex:
        raise ImportError(
            f"cuinfer is not importable ({ex}); install the checkout: "
            "python3 -m pip install --no-deps --no-build-isolation -e ."
        ) from ex
    return mod


def _git_commit() -> str | None:
    """The checkout's commit, read from .git files (no git process); None when there is no .git."""
    try:
        head = (REPO / ".git" / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        path = REPO / ".git" / ref
        if path.exists():
            return path.read_text().strip()
        for line in (REPO / ".git" / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return None


def environment(with_peers: bool) -> dict:
    """What ran: device, versions of torch / CUDA / CuPy / cuinfer / FlashInfer, the commit."""
    from bench.timing import cuda_torch

    torch = cuda_torch()
    p = torch.cuda.get_device_properties(0)
    env = {
        "gpu": p.name,
        "sms": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "capability": f"{p.major}.{p.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "commit": _git_commit(),
    }
    try:
        import cupy

        env["cupy"] = cupy.__version__
    except Exception as ex:  # noqa: BLE001
        env["cupy"] = f"unavailable: {type(ex).__name__}"
    try:
        env["cuinfer"] = str(getattr(cuinfer(), "__version__", "checkout"))
    except ImportError as ex:
        env["cuinfer"] = f"unavailable: {ex}"
    if with_peers:
        mod, info = flashinfer_or_reason()
        env["flashinfer"] = info if mod is not None else f"unavailable: {info}"
    else:
        env["flashinfer"] = "not run (--no-peers)"
    return env
