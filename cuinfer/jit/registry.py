"""Every kernel specialisation cuinfer ships, by group, for CI compile checks and ``cuinfer warmup``.

A module that owns kernels registers a function returning its specs; the registry imports those modules on demand so
``import cuinfer`` stays cheap. A provider that fails to import raises (naming it): skipping it would leave its kernels
out of CI's compile checks and of ``cuinfer warmup`` without a word.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from cuinfer.jit.spec import KernelSpec

_GROUPS: dict[str, Callable[[], list[KernelSpec]]] = {}

# Modules that register kernel groups when imported.
_PROVIDERS = ("cuinfer.merge", "cuinfer.decode", "cuinfer.prefill", "cuinfer.utils")


def register(group: str, fn: Callable[[], list[KernelSpec]]) -> None:
    _GROUPS[group] = fn


def _load_providers() -> None:
    for mod in _PROVIDERS:
        try:
            importlib.import_module(mod)
        except Exception as exc:
            raise ImportError(
                f"the kernel provider {mod} failed to import ({type(exc).__name__}: {exc}); its kernel group cannot "
                "be registered"
            ) from exc


def groups() -> list[str]:
    _load_providers()
    return sorted(_GROUPS)


def specs(group: str | None = None) -> list[KernelSpec]:
    """All registered specs, or one group's; unknown group -> ValueError listing the groups."""
    _load_providers()
    if group is None:
        return [s for g in sorted(_GROUPS) for s in _GROUPS[g]()]
    if group not in _GROUPS:
        raise ValueError(f"unknown kernel group {group!r}; groups are {', '.join(sorted(_GROUPS)) or '(none)'}")
    return list(_GROUPS[group]())
