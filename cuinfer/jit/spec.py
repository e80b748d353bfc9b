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
    # Dynamic shared memory of the launch configuration this spec is compiled for; 0 when the launch decides. Shown
    # by ``cuinfer kernels --report``; not part of the cache key (it cannot change the cubin).
    smem_bytes: int = 0
    # The targets the kernel is written for (e.g. ``("sm_90a",)`` for wgmma / TMA code); empty: every target. Not part
    # of the cache key (it selects where a spec compiles, not what).
    archs: tuple[str, ...] = ()

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

    def builds_for(self, arch: str) -> bool:
        """Whether this spec is written for target ``arch`` (``archs`` empty: every target)."""
        return not self.archs or arch in self.archs

    def canonical(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


# Fields of a spec that describe how it is launched, not what is compiled: left out of the cache key.
LAUNCH_ONLY_FIELDS = ("smem_bytes", "archs")


def cache_key(spec: KernelSpec, rendered: str, options: list[str], toolchain_id: str, arch: str) -> str:
    """Key of a compiled module: the canonical spec (less its launch-only fields), the rendered source, a digest of
    the kernel headers, the codegen options, the NVRTC and CUDA header identity, the target arch and the package
    version. ``options`` and ``toolchain_id`` must hold no absolute path or mtime (``cache.spec_key`` replaces the
    ``-I`` directories of every compile by placeholders), so a cache moved to another machine or prefix still hits."""
    from cuinfer.version import __version__

    compiled_fields = {k: v for k, v in asdict(spec).items() if k not in LAUNCH_ONLY_FIELDS}
    h = hashlib.sha256()
    for part in (
        "cuinfer-key/2",
        json.dumps(compiled_fields, sort_keys=True),
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
