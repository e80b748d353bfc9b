"""Variants by name: the built-ins register themselves here, and so can a user's (``register``); plan() accepts a
``Variant`` or a registered name."""

from __future__ import annotations

from cuinfer.variants.spec import Variant

_REGISTRY: dict[str, Variant] = {}


def register(variant: Variant) -> Variant:
    """Make ``variant`` known by its name (returns it). A different variant under a taken name raises."""
    if not isinstance(variant, Variant):
        raise TypeError(f"register() takes a cuinfer.Variant but got {type(variant).__name__}")
    old = _REGISTRY.get(variant.name)
    if old is not None and old != variant:
        raise ValueError(f"a different variant is already registered as {variant.name!r}; pick another name")
    _REGISTRY[variant.name] = variant
    return variant


def lookup(name: str) -> Variant:
    """The variant registered as ``name`` (the built-ins register when ``cuinfer.variants`` is imported)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"no variant is registered as {name!r}; registered: {known}") from None


def registered() -> dict[str, Variant]:
    return dict(_REGISTRY)
