"""Compiled-module cache on disk, shared across processes: where it lives, whom it trusts, how it is keyed and locked.

A cubin is code that runs on the GPU, so whoever can write the cache can run code in every process that uses it.
docs/cache.md describes the rules below for users; this is the reference.

Where
    ``$CUINFER_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/cuinfer``, else ``~/.cache/cuinfer``: the *primary*
    directory. When ``CUINFER_CACHE_DIR`` is set and this process cannot write it (a read-only cache baked into an
    image, a read-only mount), it is a *read tier* and the per-user directory (``$XDG_CACHE_HOME/cuinfer`` or
    ``~/.cache/cuinfer``) stands behind it as the *write tier*: lookups try the read tier first, then the user tier,
    and what is compiled is stored in the user tier. When the primary directory is writable it is the whole cache
    (the user tier is not read, so a test or deployment that points ``CUINFER_CACHE_DIR`` somewhere is isolated).
    A directory is writable when this process owns it, its owner-write bit is set and ``access(W_OK)`` agrees (a
    read-only file system says no): ``chmod a-w DIR`` turns any cache into a read tier, even for root.

Trust
    Every directory read and every entry opened must be (1) writable by its owner only (no group or other write bit)
    and (2) owned by this process's effective user, or by root (a root-owned cache that only root can write is the
    shared image case). A violation raises :class:`CacheTrustError` naming the rule, what was found and the fix; it is
    never skipped silently, since a cache that others can write may already hold forged entries. Entries are opened
    with ``O_NOFOLLOW`` (a symbolic link is refused) and the rules are checked on the open file, so a rename between
    check and read changes nothing. The SHA-256 inside each entry catches damage (a corrupt entry is recompiled), not
    forgery: ownership and modes are what keep others out.

Modes
    ``CUINFER_CACHE_MODE=private`` (the default): directories are created 0700, entries 0600. ``shared``: directories
    0755, entries 0644 (readable by all, writable by the owner only), for caches warmed at image-build time by one user
    (often root) and read by servers running as another. Reading a private cache of another user fails with EACCES;
    that is reported once per directory as a :class:`CacheWarning` (never a silent miss) and the lookup goes on.

Locking
    Processes compiling the same key into the same directory compile it once: the compiler holds ``flock`` on
    ``.<key>.lock`` beside the entry, the others wait, then read the entry it stored. The kernel drops a lock when its
    holder dies, so a crashed compiler never blocks anyone (a lock file it left behind is simply locked again); a
    holder that hangs is given up on after ``CUINFER_CACHE_LOCK_TIMEOUT`` seconds (default 300), after which the
    waiter compiles by itself. Lock files are unlinked by their holder; entries are written to a temporary file and
    renamed into place, so a reader sees a whole entry or none.

Keys
    :func:`spec_key`: the spec (less launch-only fields), the rendered source, a digest of the kernel_src tree, the
    NVRTC options with the two ``-I`` directories of every compile replaced by placeholders, the toolchain identity
    (:func:`cuinfer.jit.toolchain.fingerprint`: NVRTC release from file names, header version and contents), the arch
    and the package version. No absolute path or mtime, so a cache copied to another machine or prefix with the same
    releases hits; ``cuinfer bundle export`` / ``import`` (:mod:`cuinfer.jit.bundle`) move one with a manifest.

A warm cache never calls NVRTC nor loads libnvrtc (``stats.compiles`` stays 0, which the tests assert).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass

from cuinfer.errors import CuinferError
from cuinfer.jit.compiler import CompiledModule, ResourceUsage, compile_spec, nvrtc_options
from cuinfer.jit.spec import KernelSpec, cache_key, kernel_src_dir
from cuinfer.jit.toolchain import fingerprint, include_dir

_MAGIC = b"CUINFER-CUBIN-2\n"
ENTRY_SUFFIX = ".cubin"
MODES = {"private": (0o700, 0o600), "shared": (0o755, 0o644)}  # (directories, entries)
DEFAULT_LOCK_TIMEOUT = 300.0


class CacheTrustError(CuinferError):
    """A cache directory or entry that others could have written: refused, never loaded."""


class CacheWarning(UserWarning):
    """Something about the cache costs time (an unreadable tier, nowhere to store) but does not stop the work."""


@dataclass
class CacheStats:
    compiles: int = 0
    disk_hits: int = 0
    disk_corrupt: int = 0
    lock_waits: int = 0  # another process was compiling the same key: waited for it
    not_stored: int = 0  # compiled but no writable cache directory took it


@dataclass
class Fetched:
    """What :func:`fetch` did: the module, whether it came from disk or NVRTC, and where it is stored."""

    module: CompiledModule
    compiled: bool  # False: read from ``directory``
    directory: str | None  # where the entry was read or stored; None when it could not be stored
    store_error: str = ""  # why a compiled module was not stored ("" otherwise)
    waited: bool = False  # waited for another process that was compiling the same key


stats = CacheStats()
_lock = threading.Lock()
_key_locks: dict[str, threading.Lock] = {}
_warned: set[str] = set()


# ---- where -----------------------------------------------------------------------------------------------------------


def user_cache_dir() -> str:
    """``$XDG_CACHE_HOME/cuinfer``, else ``~/.cache/cuinfer``: the per-user cache (the write tier behind a read-only
    ``CUINFER_CACHE_DIR``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cuinfer")


def cache_dir() -> str:
    """The primary cache directory: ``$CUINFER_CACHE_DIR``, else :func:`user_cache_dir`."""
    return os.environ.get("CUINFER_CACHE_DIR") or user_cache_dir()


def cache_mode() -> str:
    """``private`` (default) or ``shared`` from ``$CUINFER_CACHE_MODE``; anything else is a ValueError."""
    mode = os.environ.get("CUINFER_CACHE_MODE", "").strip().lower() or "private"
    if mode not in MODES:
        raise ValueError(
            f"CUINFER_CACHE_MODE={os.environ['CUINFER_CACHE_MODE']!r} is not a cache mode: use 'private' (dirs 0700, "
            "entries 0600, the default) or 'shared' (dirs 0755, entries 0644: readable by all, writable by the owner)"
        )
    return mode


def _candidates() -> list[str]:
    """The primary directory, then the per-user one when ``CUINFER_CACHE_DIR`` names another directory."""
    primary = cache_dir()
    user = user_cache_dir()
    if os.environ.get("CUINFER_CACHE_DIR") and os.path.abspath(user) != os.path.abspath(primary):
        return [primary, user]
    return [primary]


@dataclass(frozen=True)
class Tier:
    """One cache directory as this process sees it."""

    path: str
    exists: bool
    writable: bool  # this process may store here (a missing directory: if it can be created)
    why_read_only: str = ""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


_RULE = (
    "Rule: a cubin is code that runs on the GPU, so cache directories and entries must be writable by their owner "
    "only, and owned by you or by root."
)


def check_trusted(path: str, st: os.stat_result, what: str = "directory") -> None:
    """Raise CacheTrustError unless ``st`` (of ``path``, a cache ``directory`` or ``entry``) may be trusted."""
    euid = os.geteuid()
    kind_ok = stat.S_ISDIR(st.st_mode) if what == "directory" else stat.S_ISREG(st.st_mode)
    if what == "directory":
        fix = (
            f"Fix: remove it (rm -rf {path}: its entries may have been replaced) and let cuinfer recreate it, or point "
            "CUINFER_CACHE_DIR at a directory only you can write."
        )
    else:
        fix = f"Fix: remove the entry (rm {path}); it is recompiled, or imported again from a bundle."
    found = None
    if not kind_ok:
        found = f"it is not a {'directory' if what == 'directory' else 'regular file'}"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit)
        found = f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    elif st.st_uid not in (euid, 0):
        found = f"it is owned by {_owner(st.st_uid)}, not by you ({_owner(euid)}) or root"
    if found:
        raise CacheTrustError(f"untrusted kernel cache {what} {path}: {found}. {_RULE} {fix}")


def _probe(path: str) -> Tier:
    """Trust-check an existing directory (raises CacheTrustError) and say whether this process may write it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Tier(path, exists=False, writable=True)
    check_trusted(path, st)
    if st.st_uid != os.geteuid():
        why = f"owned by {_owner(st.st_uid)}"
    elif not st.st_mode & stat.S_IWUSR:
        why = f"mode {stat.S_IMODE(st.st_mode):04o} (no owner write bit)"
    elif not os.access(path, os.W_OK | os.X_OK):
        why = "not writable (read-only file system?)"
    else:
        return Tier(path, exists=True, writable=True)
    return Tier(path, exists=True, writable=False, why_read_only=why)


def cache_tiers() -> list[Tier]:
    """The directories a lookup reads, in order; the first writable one takes new entries. Raises CacheTrustError."""
    tiers = []
    for path in _candidates():
        tier = _probe(path)
        tiers.append(tier)
        if tier.writable:
            break
    return tiers


def cache_size(path: str | None = None) -> tuple[int, int]:
    """(entries, bytes) in one cache directory (default: the primary one)."""
    root = path or cache_dir()
    if not os.path.isdir(root):
        return 0, 0
    n = size = 0
    for name in os.listdir(root):
        if name.endswith(ENTRY_SUFFIX) and not name.startswith("."):
            n += 1
            size += os.path.getsize(os.path.join(root, name))
    return n, size


def _warn_once(tag: str, message: str) -> None:
    with _lock:
        if tag in _warned:
            return
        _warned.add(tag)
    warnings.warn(message, CacheWarning, stacklevel=4)


# ---- keys and entries ------------------------------------------------------------------------------------------------


def key_options(arch: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The NVRTC options as they enter the key: the include directories of every compile as placeholders."""
    paths = {f"-I{include_dir()}": "-I<cuda-include>", f"-I{kernel_src_dir()}": "-I<kernel_src>"}
    return [paths.get(o, o) for o in nvrtc_options(arch) + list(extra)]


def spec_key(spec: KernelSpec, arch: str) -> str:
    return cache_key(spec, spec.render(), key_options(arch, spec.extra_options), fingerprint(), arch)


def _encode(mod: CompiledModule, key: str) -> bytes:
    from cuinfer.version import __version__

    meta = {
        "key": key,
        "spec": mod.spec.name,
        "arch": mod.arch,
        "toolchain": fingerprint(),
        "cuinfer": __version__,
        "lowered": mod.lowered,
        "log": mod.log,
        "options": mod.options,
        "compile_seconds": mod.compile_seconds,
        "resources": {k: asdict(v) for k, v in mod.resources.items()},
    }
    meta_b = json.dumps(meta, sort_keys=True).encode()
    payload = len(meta_b).to_bytes(8, "little") + meta_b + mod.cubin
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def decode_entry(blob: bytes) -> tuple[dict, bytes] | None:
    """(metadata, cubin) of an entry whose embedded SHA-256 holds; None for a damaged or foreign file."""
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
    return (meta, payload[8 + n :]) if isinstance(meta, dict) else None


def _module(spec: KernelSpec, key: str, blob: bytes) -> CompiledModule | None:
    decoded = decode_entry(blob)
    if decoded is None or decoded[0].get("key") != key:  # stored under another key's name: not this module
        return None
    meta, cubin = decoded
    try:
        return CompiledModule(
            spec=spec,
            arch=meta["arch"],
            cubin=cubin,
            lowered=meta["lowered"],
            log=meta["log"],
            options=meta["options"],
            compile_seconds=meta["compile_seconds"],
            resources={k: ResourceUsage(**v) for k, v in meta["resources"].items()},
        )
    except (KeyError, TypeError, AttributeError):
        return None


def entry_path(directory: str, key: str) -> str:
    return os.path.join(directory, key + ENTRY_SUFFIX)


def read_entry(directory: str, key: str) -> bytes | None:
    """The bytes of a trusted entry, or None when absent or unreadable (EACCES: warned once per directory)."""
    path = entry_path(directory, key)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except PermissionError:
        _warn_unreadable(directory)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheTrustError(
                f"untrusted kernel cache entry {path}: it is a symbolic link. {_RULE} Fix: remove it (rm {path})."
            ) from None
        raise
    with os.fdopen(fd, "rb") as fh:
        check_trusted(path, os.fstat(fd), "entry")
        return fh.read()


def _warn_unreadable(directory: str) -> None:
    try:
        st = os.stat(directory)
        found = f"owned by {_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}"
    except OSError as exc:
        found = str(exc)
    _warn_once(
        f"unreadable:{directory}",
        f"cannot read the kernel cache entries in {directory} ({found}): a cache warmed in private mode is readable "
        "by its owner only, so every kernel is compiled again. Warm caches meant for other users with "
        "CUINFER_CACHE_MODE=shared (dirs 0755, entries 0644), or run as the cache's owner.",
    )


def _makedirs(path: str, mode: int) -> None:
    """mkdir -p with ``mode`` on every directory it creates (set exactly, whatever the umask)."""
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        _makedirs(parent, mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return
    os.chmod(path, mode)


def ensure_dir(path: str) -> None:
    """Create a cache directory with the mode of :func:`cache_mode`; in shared mode, open an own one for reading."""
    dir_mode, _ = MODES[cache_mode()]
    _makedirs(path, dir_mode)
    st = os.stat(path)
    check_trusted(path, st)
    if dir_mode == MODES["shared"][0] and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != dir_mode:
        os.chmod(path, dir_mode)


def write_entry(directory: str, key: str, blob: bytes) -> str:
    """Store ``blob`` atomically (temporary file, then rename) with the entry mode of :func:`cache_mode`."""
    _, file_mode = MODES[cache_mode()]
    ensure_dir(directory)
    path = entry_path(directory, key)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=ENTRY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), file_mode)
            fh.write(blob)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


# ---- locking -------------------------------------------------------------------------------------------------------


def lock_timeout() -> float:
    raw = os.environ.get("CUINFER_CACHE_LOCK_TIMEOUT")
    try:
        return float(raw) if raw else DEFAULT_LOCK_TIMEOUT
    except ValueError:
        raise ValueError(f"CUINFER_CACHE_LOCK_TIMEOUT={raw!r} is not a number of seconds") from None


@contextlib.contextmanager
def key_lock(directory: str, key: str, timeout: float | None = None):
    """Hold the inter-process lock of ``key`` in ``directory``; yields True when it had to wait for another holder.

    ``flock`` is released by the kernel when its holder dies. Past ``timeout`` (a hung holder) this yields without
    the lock, as it does where the file system cannot lock; the caller then compiles on its own.
    """
    path = os.path.join(directory, f".{key}.lock")
    limit = lock_timeout() if timeout is None else timeout
    deadline = time.monotonic() + limit
    waited, pause, fd = False, 0.01, None
    while fd is None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            break  # cannot create a lock file here: go on unlocked
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            fd, waited = None, True
            if time.monotonic() >= deadline:
                _warn_once(
                    f"lock:{path}",
                    f"waited {limit:g}s for the process compiling "
                    f"{key[:12]}... into {directory} (lock {path}); compiling it here as well "
                    "(CUINFER_CACHE_LOCK_TIMEOUT sets the wait)",
                )
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            continue
        except OSError:  # no lock support (some network file systems)
            os.close(fd)
            fd = None
            break
        try:  # the previous holder unlinks the file on release: make sure we locked the one that is there now
            same = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            fd = None
    try:
        yield waited
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
            os.close(fd)


# ---- lookup --------------------------------------------------------------------------------------------------------


def _read_module(spec: KernelSpec, key: str, directory: str, count_corrupt: bool = True) -> CompiledModule | None:
    blob = read_entry(directory, key)
    if blob is None:
        return None
    mod = _module(spec, key, blob)
    if mod is None and count_corrupt:
        stats.disk_corrupt += 1
    return mod


def fetch(spec: KernelSpec, arch: str) -> Fetched:
    """The compiled module for ``spec`` on ``arch``, and how it was obtained: read from the first cache tier that
    holds a valid entry, else compiled by NVRTC (waiting for another process compiling the same key into the same
    directory) and stored in the first writable tier. Raises CacheTrustError for an untrusted directory or entry."""
    key = spec_key(spec, arch)
    with _lock:
        thread_lock = _key_locks.setdefault(key, threading.Lock())
    with thread_lock:  # two threads warming the same spec compile it once
        read_only: list[Tier] = []
        for path in _candidates():
            tier = _probe(path)
            if tier.exists:
                mod = _read_module(spec, key, path)
                if mod is not None:
                    stats.disk_hits += 1
                    return Fetched(mod, compiled=False, directory=path)
            if tier.writable:
                try:
                    ensure_dir(path)
                except OSError as exc:  # e.g. a CUINFER_CACHE_DIR under a read-only mount: try the next tier
                    read_only.append(Tier(path, exists=False, writable=False, why_read_only=f"cannot create: {exc}"))
                    continue
                return _compile_into(spec, arch, key, path)
            read_only.append(tier)
        mod = compile_spec(spec, arch)
        stats.compiles += 1
        stats.not_stored += 1
        why = "; ".join(f"{t.path} is read-only ({t.why_read_only})" for t in read_only)
        _warn_once(f"nowhere:{why}", f"compiled kernels cannot be stored, so every process compiles them again: {why}")
        return Fetched(mod, compiled=True, directory=None, store_error=why)


def _compile_into(spec: KernelSpec, arch: str, key: str, directory: str) -> Fetched:
    with key_lock(directory, key) as waited:
        stats.lock_waits += waited
        mod = _read_module(spec, key, directory, count_corrupt=False)  # stored by another process since we looked?
        if mod is not None:
            stats.disk_hits += 1
            return Fetched(mod, compiled=False, directory=directory, waited=waited)
        mod = compile_spec(spec, arch)
        stats.compiles += 1
        try:
            write_entry(directory, key, _encode(mod, key))
        except OSError as exc:
            stats.not_stored += 1
            return Fetched(mod, compiled=True, directory=None, store_error=f"cannot write to {directory}: {exc}")
        return Fetched(mod, compiled=True, directory=directory, waited=waited)


def get_compiled(spec: KernelSpec, arch: str) -> CompiledModule:
    """The compiled module for ``spec`` on ``arch``: from disk if a valid entry exists, else NVRTC (then stored)."""
    return fetch(spec, arch).module
