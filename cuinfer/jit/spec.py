"""Kernel specs: the frozen description of one compiled artefact, its rendering and its cache key."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import string
from dataclasses import asdict, dataclass, field
from importlib import resources

KERNEL_SRC_PACKAGE = "cuinfer.kernel_src"


@functools.lru_cache(maxsize=1)
def kernel_src_dir() -> str:
    """Directory of the CUDA sources (the include path ``-I`` of every compile)."""
    return str(resources.files(KERNEL_SRC_PACKAGE))


@functools.lru_cache(maxsize=1)
def kernel_src_digest() -> str:
    """Hash of every CUDA file under kernel_src/: any header edit invalidates every cached cubin.

    Hashing the whole tree (a few hundred KB) is simpler and safer than tracking each spec's include graph.
    """
    h = hashlib.sha256()
    root = kernel_src_dir()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith((".cu", ".cuh")):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


@dataclass(frozen=True)
class KernelSpec:
    """One NVRTC module: a source file, the template instances to emit, and generated text around it.

    ``substitutions`` fill ``$placeholders`` of the source with ``string.Template.substitute``, so a misspelt
    placeholder raises instead of compiling something else. ``sass_expect`` / ``sass_forbid`` are SASS opcode
    prefixes that CI checks in the cubin (``HMMA``, ``LDGSTS``; ``LDL``/``STL`` mean local-memory traffic).
    """

    name: str
    source: str
    name_exprs: tuple[str, ...]
    preamble: str = ""
    substitutions: tuple[tuple[str, str], ...] = ()
    sass_expect: tuple[str, ...] = ()
    sass_forbid: tuple[str, ...] = (r"LDL", r"STL")
    extra_options: tuple[str, ...] = field(default=())

    def render(self) -> str:
        """The full translation unit handed to NVRTC."""
        path = os.path.join(kernel_src_dir(), self.source)
        with open(path, encoding="utf-8") as fh:
            body = fh.read()
        if self.substitutions:
            try:
                body = string.Template(body).substitute(dict(self.substitutions))
            except KeyError as exc:
                raise ValueError(
                    f"{self.source} uses placeholder ${exc.args[0]} but {self.name} provides only "
                    f"{sorted(k for k, _ in self.substitutions)}; fix the spelling of the placeholder or the snippet"
                ) from None
        parts = []
        if self.preamble:
            parts.append(f'#line 1 "{self.name}:preamble"\n{self.preamble}')
        parts.append(f'#line 1 "{self.source}"\n{body}')
        return "\n".join(parts)

    def canonical(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def cache_key(spec: KernelSpec, rendered: str, options: list[str], toolchain_id: str, arch: str) -> str:
    """Key of a compiled module: the canonical spec, the rendered source, kernel headers, options, the NVRTC and CUDA
    header identity, the target arch and the package version."""
    from cuinfer.version import __version__

    h = hashlib.sha256()
    for part in (
        spec.canonical(),
        rendered,
        kernel_src_digest(),
        "\0".join(options),
        f"toolchain={toolchain_id}",
        f"arch={arch}",
        f"cuinfer={__version__}",
    ):
        h.update(part.encode())
        h.update(b"\x1e")
    return h.hexdigest()
