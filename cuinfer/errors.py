"""Exceptions raised by cuinfer (bad input is a plain ``ValueError``; these cover the toolchain and the device)."""

from __future__ import annotations


class CuinferError(RuntimeError):
    """Base class of cuinfer's own runtime errors."""


class NoGPUError(CuinferError):
    """No usable CUDA GPU: the driver is missing or reports no device."""


class ToolchainError(CuinferError):
    """The NVRTC compiler or the CUDA runtime headers are missing or do not match."""


def _head(log: str, lines: int = 40) -> str:
    text = log.strip().splitlines()
    more = f"\n... ({len(text) - lines} more lines in .log)" if len(text) > lines else ""
    return "\n".join(text[:lines]) + more


class CompileError(CuinferError):
    """NVRTC rejected a kernel. Carries the compiler log, the options and the numbered source."""

    def __init__(self, spec_name: str, log: str, options: list[str], source: str) -> None:
        self.spec_name = spec_name
        self.log = log
        self.options = list(options)
        self.source = source
        numbered = "\n".join(f"{i + 1:5d}  {line}" for i, line in enumerate(source.splitlines()))
        super().__init__(
            f"NVRTC failed to compile {spec_name}:\n{_head(log)}\n\noptions: {' '.join(options)}\n"
            f"(the numbered source is in .source_listing)"
        )
        self.source_listing = numbered
