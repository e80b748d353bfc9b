"""Cache bundles: move a warmed kernel cache to another machine or prefix (``cuinfer bundle export`` / ``import``).

A bundle is a tar file (gzip-compressed when its name ends in ``.gz`` or ``.tgz``) holding exactly

- ``manifest.json``: ``{"format": "cuinfer-bundle/1", "cuinfer": <package version>, "toolchain": <fingerprint>,
  "entries": [{"key", "spec", "arch", "sha256", "bytes"}, ...]}``, entries sorted by key;
- ``entries/<key>.cubin``: the cache entries, byte for byte.

Export is reproducible (fixed member metadata, gzip without a timestamp): the same cache gives the same bundle, and
its SHA-256 is printed so it can be checked on the other side (``import --sha256``). Import reads the bundle without
extracting anything to disk and verifies all of it before writing one entry: only those members, each listed entry
present and each present entry listed, its SHA-256 and size as listed, its own embedded SHA-256 intact, and its
embedded key, spec, arch, toolchain and package version equal to the manifest's. Any mismatch refuses the whole
bundle (:class:`BundleError`). A bundle built with another toolchain or package version is refused too, unless
forced, since none of its keys could ever be looked up here. Entries are then stored in the cache's write tier with
the mode and trust rules of :mod:`cuinfer.jit.cache`; an entry already there is kept.

The checks catch damage and inconsistent edits; a forger who rewrites entries and manifest together is caught only
by the bundle's SHA-256 compared against one obtained out of band (``--sha256``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass

from cuinfer.errors import CuinferError
from cuinfer.jit import cache

BUNDLE_FORMAT = "cuinfer-bundle/1"
MANIFEST = "manifest.json"
_ENTRY_MEMBER = re.compile(r"^entries/([0-9a-f]{64})\.cubin$")
_ENTRY_FILE = re.compile(r"^([0-9a-f]{64})\.cubin$")
_MAX_MEMBER = 1 << 30  # no cache entry comes near 1 GiB
_ENTRY_FIELDS = ("key", "spec", "arch", "sha256", "bytes")


class BundleError(CuinferError):
    """A bundle that cannot be exported or imported: the message says which check failed and what to do."""


@dataclass
class ImportReport:
    directory: str
    imported: int
    present: int
    manifest: dict


def collect(arch: str | None = None) -> tuple[dict, dict[str, bytes]]:
    """(manifest, key -> entry bytes) of every valid entry in the cache tiers (first tier wins), optionally of one
    arch. Damaged entries and entries of an older format are left out."""
    from cuinfer.jit.toolchain import fingerprint
    from cuinfer.version import __version__

    blobs: dict[str, bytes] = {}
    rows = []
    for tier in cache.cache_tiers():
        if not tier.exists:
            continue
        for name in sorted(os.listdir(tier.path)):
            m = _ENTRY_FILE.match(name)
            if not m or m.group(1) in blobs:
                continue
            blob = cache.read_entry(tier.path, m.group(1))
            decoded = cache.decode_entry(blob) if blob is not None else None
            if decoded is None or decoded[0].get("key") != m.group(1):
                continue
            meta = decoded[0]
            if arch is not None and meta.get("arch") != arch:
                continue
            blobs[m.group(1)] = blob
            row = {"key": m.group(1), "spec": meta.get("spec"), "arch": meta.get("arch")}
            rows.append({**row, "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)})
    manifest = {
        "format": BUNDLE_FORMAT,
        "cuinfer": __version__,
        "toolchain": fingerprint(),
        "entries": sorted(rows, key=lambda r: r["key"]),
    }
    return manifest, blobs


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def export_bundle(path: str, arch: str | None = None) -> tuple[dict, str]:
    """Write the bundle of the cache to ``path`` (atomically); returns (manifest, SHA-256 of the bundle file)."""
    manifest, blobs = collect(arch)
    if not blobs:
        where = ", ".join(t.path for t in cache.cache_tiers())
        only = f" for {arch}" if arch else ""
        raise BundleError(f"no cache entries{only} to export in {where}: warm the cache first (cuinfer warmup)")
    raw = io.BytesIO()
    gz = path.endswith((".gz", ".tgz"))
    stream = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if gz else raw
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        for row in manifest["entries"]:
            _add(tar, f"entries/{row['key']}.cubin", blobs[row["key"]])
    if gz:
        stream.close()
    data = raw.getvalue()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-bundle-")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return manifest, hashlib.sha256(data).hexdigest()


def _members(path: str) -> dict[str, bytes]:
    """Name -> bytes of the bundle's members, refusing anything but the regular files a bundle holds."""
    try:
        tar = tarfile.open(path, mode="r:*")
    except (tarfile.TarError, OSError) as exc:
        raise BundleError(f"{path} is not a cuinfer bundle (a tar file): {exc}") from None
    out: dict[str, bytes] = {}
    with tar:
        for member in tar:
            name = member.name
            if not (member.isfile() and (name == MANIFEST or _ENTRY_MEMBER.match(name))):
                raise BundleError(
                    f"bundle {path} holds an unexpected member {name!r}: refused (a bundle holds "
                    f"{MANIFEST} and entries/<key>.cubin files only)"
                )
            if name in out:
                raise BundleError(f"bundle {path} holds {name!r} twice: refused")
            if member.size > _MAX_MEMBER:
                raise BundleError(f"bundle {path}: member {name!r} is {member.size} bytes: refused")
            out[name] = tar.extractfile(member).read()
    return out


def _manifest(path: str, raw: bytes | None) -> dict:
    if raw is None:
        raise BundleError(f"bundle {path} has no {MANIFEST}: not a cuinfer bundle")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise BundleError(f"bundle {path}: {MANIFEST} is not valid JSON ({exc}): refused") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"bundle {path}: format {found!r}, expected {BUNDLE_FORMAT!r}: refused")
    entries = manifest.get("entries")
    ok = isinstance(entries, list) and all(isinstance(e, dict) and set(_ENTRY_FIELDS) <= set(e) for e in entries)
    if not ok or not isinstance(manifest.get("toolchain"), str) or not isinstance(manifest.get("cuinfer"), str):
        raise BundleError(
            f"bundle {path}: {MANIFEST} lacks fields (toolchain, cuinfer, entries with "
            f"{', '.join(_ENTRY_FIELDS)}): refused"
        )
    return manifest


def _check_entry(path: str, manifest: dict, row: dict, blob: bytes) -> None:
    key = row["key"]
    tampered = f"bundle {path}: entry {key[:16]}... ({row.get('spec')}, {row.get('arch')})"
    if hashlib.sha256(blob).hexdigest() != row["sha256"] or len(blob) != row["bytes"]:
        raise BundleError(
            f"{tampered} does not match the SHA-256 and size in {MANIFEST}: the entry or the manifest "
            "was altered or damaged; refused. Export the bundle again."
        )
    decoded = cache.decode_entry(blob)
    if decoded is None:
        raise BundleError(f"{tampered} fails its own checksum: damaged; refused. Export the bundle again.")
    meta = decoded[0]
    want = {"key": key, "spec": row["spec"], "arch": row["arch"]}
    want |= {"toolchain": manifest["toolchain"], "cuinfer": manifest["cuinfer"]}
    wrong = [f"{k}: manifest {v!r}, entry {meta.get(k)!r}" for k, v in want.items() if meta.get(k) != v]
    if wrong:
        raise BundleError(
            f"{tampered} disagrees with {MANIFEST} ({'; '.join(wrong)}): the manifest or the entry "
            "was altered; refused. Export the bundle again."
        )


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_bundle(path: str, sha256: str | None = None) -> tuple[dict, dict[str, bytes]]:
    """(manifest, key -> entry bytes) of a bundle that passes every check; raises BundleError otherwise."""
    if sha256 is not None:
        actual = file_sha256(path)
        if actual != sha256.strip().lower():
            raise BundleError(
                f"bundle {path} has SHA-256 {actual}, expected {sha256}: not the bundle that was exported; refused"
            )
    members = _members(path)
    manifest = _manifest(path, members.pop(MANIFEST, None))
    listed = {row["key"]: row for row in manifest["entries"]}
    if len(listed) != len(manifest["entries"]):
        raise BundleError(f"bundle {path}: {MANIFEST} lists a key twice: refused")
    present = {_ENTRY_MEMBER.match(name).group(1): blob for name, blob in members.items()}
    missing, unlisted = sorted(set(listed) - set(present)), sorted(set(present) - set(listed))
    if missing or unlisted:
        raise BundleError(
            f"bundle {path}: {len(missing)} entries listed in {MANIFEST} are missing and "
            f"{len(unlisted)} present are not listed: the bundle was altered; refused"
        )
    for key, row in listed.items():
        _check_entry(path, manifest, row, present[key])
    return manifest, present


def import_bundle(path: str, sha256: str | None = None, force: bool = False) -> ImportReport:
    """Verify the bundle at ``path`` (all of it, before writing anything), then store its entries in the cache's write
    tier. Raises BundleError (bad bundle, other toolchain unless ``force``, no writable cache directory)."""
    from cuinfer.jit.toolchain import fingerprint
    from cuinfer.version import __version__

    manifest, blobs = read_bundle(path, sha256)
    here = {"toolchain": fingerprint(), "cuinfer": __version__}
    differ = [f"{k} {manifest[k]!r} (here {v!r})" for k, v in here.items() if manifest[k] != v]
    if differ and not force:
        raise BundleError(
            f"bundle {path} was built with {'; '.join(differ)}: none of its entries would be looked up "
            "here. Export it from a machine with the same NVRTC, CUDA headers and cuinfer version, or "
            "pass --force to import it anyway."
        )
    tiers = cache.cache_tiers()
    target = next((t.path for t in tiers if t.writable), None)
    if target is None:
        why = "; ".join(f"{t.path}: {t.why_read_only}" for t in tiers)
        raise BundleError(
            f"no writable kernel cache directory to import into ({why}). Set CUINFER_CACHE_DIR or "
            "XDG_CACHE_HOME to a directory you own."
        )
    imported = present = 0
    for key in sorted(blobs):
        existing = cache.read_entry(target, key) if os.path.isdir(target) else None
        decoded = cache.decode_entry(existing) if existing is not None else None
        if decoded is not None and decoded[0].get("key") == key:
            present += 1
            continue
        cache.write_entry(target, key, blobs[key])
        imported += 1
    return ImportReport(target, imported, present, manifest)
