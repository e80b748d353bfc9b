"""Compiled-module cache: on disk across processes, in memory within one.

Disk entries are written atomically (temporary file + rename) and carry a SHA-256 of their payload; a corrupt or
truncated entry is recompiled, never trusted. A warm cache never calls NVRTC (``stats.compiles`` stays 0, which the
tests assert), so a second process pays only a file read and a module load.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass

from cuinfer.jit.compiler import CompiledModule, ResourceUsage, compile_spec, nvrtc_options
from cuinfer.jit.spec import KernelSpec, cache_key
from cuinfer.jit.toolchain import fingerprint

_MAGIC = b"CUINFER-CUBIN-1\n"


@dataclass
class CacheStats:
    compiles: int = 0
    disk_hits: int = 0
    disk_corrupt: int = 0


stats = CacheStats()
_lock = threading.Lock()
_key_locks: dict[str, threading.Lock] = {}


def cache_dir() -> str:
    """``$CUINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/cuinfer``, else ``~/.cache/cuinfer``."""
    explicit = os.environ.get("CUINFER_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cuinfer")


def cache_size() -> tuple[int, int]:
    """(entries, bytes) currently in the disk cache."""
    root = cache_dir()
    if not os.path.isdir(root):
        return 0, 0
    n = size = 0
    for name in os.listdir(root):
        if name.endswith(".cubin"):
            n += 1
            size += os.path.getsize(os.path.join(root, name))
    return n, size


def spec_key(spec: KernelSpec, arch: str) -> str:
    return cache_key(spec, spec.render(), nvrtc_options(arch) + list(spec.extra_options), fingerprint(), arch)


def _encode(mod: CompiledModule) -> bytes:
    meta = {
        "arch": mod.arch,
        "lowered": mod.lowered,
        "log": mod.log,
        "options": mod.options,
        "compile_seconds": mod.compile_seconds,
        "resources": {k: asdict(v) for k, v in mod.resources.items()},
    }
    meta_b = json.dumps(meta, sort_keys=True).encode()
    payload = len(meta_b).to_bytes(8, "little") + meta_b + mod.cubin
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def _decode(spec: KernelSpec, blob: bytes) -> CompiledModule | None:
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 40:
        return None
    digest = blob[len(_MAGIC) : len(_MAGIC) + 32]
    payload = blob[len(_MAGIC) + 32 :]
    if hashlib.sha256(payload).digest() != digest:
        return None
    n = int.from_bytes(payload[:8], "little")
    try:
        meta = json.loads(payload[8 : 8 + n])
    except ValueError:
        return None
    return CompiledModule(
        spec=spec,
        arch=meta["arch"],
        cubin=payload[8 + n :],
        lowered=meta["lowered"],
        log=meta["log"],
        options=meta["options"],
        compile_seconds=meta["compile_seconds"],
        resources={k: ResourceUsage(**v) for k, v in meta["resources"].items()},
    )


def _write_atomic(path: str, blob: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def get_compiled(spec: KernelSpec, arch: str) -> CompiledModule:
    """The compiled module for ``spec`` on ``arch``: from disk if a valid entry exists, else NVRTC (then stored)."""
    key = spec_key(spec, arch)
    path = os.path.join(cache_dir(), f"{key}.cubin")
    with _lock:
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:  # two threads warming the same spec compile it once
        try:
            with open(path, "rb") as fh:
                blob = fh.read()
        except OSError:
            blob = None
        if blob is not None:
            mod = _decode(spec, blob)
            if mod is not None:
                stats.disk_hits += 1
                return mod
            stats.disk_corrupt += 1
        mod = compile_spec(spec, arch)
        stats.compiles += 1
        try:
            _write_atomic(path, _encode(mod))
        except OSError:
            pass  # a read-only cache directory costs a recompile next time, not a failure
        return mod
