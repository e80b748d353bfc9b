"""Cache bundles (cuinfer/jit/bundle.py, ``cuinfer bundle export|import``): a warmed cache moved to another path and
used without one NVRTC call; any altered entry or manifest refused before anything is written."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

from cuinfer.cli import main
from cuinfer.jit import cache, get_compiled, toolchain
from cuinfer.jit.bundle import BundleError, export_bundle, import_bundle, read_bundle
from cuinfer.merge.specs import merge_spec

ARCH = "sm_90a"
SPECS = (("float16", 64), ("bfloat16", 64))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """A cache warmed with two merge modules (compiled once for the whole module)."""
    root = tmp_path_factory.mktemp("warmed")
    old = os.environ.get("CUINFER_CACHE_DIR")
    os.environ["CUINFER_CACHE_DIR"] = str(root / "cache")
    try:
        for dtype, d in SPECS:
            get_compiled(merge_spec(dtype, d), ARCH)
    finally:
        if old is None:
            del os.environ["CUINFER_CACHE_DIR"]
        else:
            os.environ["CUINFER_CACHE_DIR"] = old
    return root / "cache"


@pytest.fixture
def source(warmed, tmp_path, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(warmed))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CUINFER_CACHE_MODE", raising=False)
    return warmed


def _target(monkeypatch, tmp_path):
    target = tmp_path / "deploy" / "other" / "prefix" / "cache"
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(target))
    return target


def test_round_trip_to_another_path_never_compiles(source, tmp_path, monkeypatch):
    bundle = str(tmp_path / "kernels.tar.gz")
    manifest, digest = export_bundle(bundle)
    assert len(manifest["entries"]) == len(SPECS)
    assert {e["spec"] for e in manifest["entries"]} == {merge_spec(t, d).name for t, d in SPECS}
    assert all(e["arch"] == ARCH and len(e["sha256"]) == 64 for e in manifest["entries"])
    assert manifest["toolchain"] == toolchain.fingerprint() and manifest["cuinfer"]
    assert export_bundle(str(tmp_path / "again.tar.gz"))[1] == digest  # reproducible
    target = _target(monkeypatch, tmp_path)

    def no_nvrtc(spec, arch):
        raise AssertionError(f"NVRTC called for {spec.name}: the imported cache missed")

    monkeypatch.setattr(cache, "compile_spec", no_nvrtc)  # an air-gapped deploy never compiles
    report = import_bundle(bundle, sha256=digest)
    assert (report.directory, report.imported, report.present) == (str(target), len(SPECS), 0)
    compiles = cache.stats.compiles
    for dtype, d in SPECS:
        r = cache.fetch(merge_spec(dtype, d), ARCH)
        assert not r.compiled and r.directory == str(target)
    assert cache.stats.compiles == compiles
    assert import_bundle(bundle).present == len(SPECS)  # importing again changes nothing
    assert {os.stat(target / n).st_mode & 0o777 for n in os.listdir(target)} == {0o600}


def _rewrite(bundle: str, out: str, edit) -> None:
    """Copy a bundle, letting ``edit(members: dict[name, bytes])`` change its members."""
    with tarfile.open(bundle) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    edit(members)
    with tarfile.open(out, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _manifest_edit(fn):
    def edit(members):
        m = json.loads(members["manifest.json"])
        fn(m, members)
        members["manifest.json"] = json.dumps(m).encode()

    return edit


def _flip_entry_byte(members):
    name = next(n for n in members if n.startswith("entries/"))
    blob = bytearray(members[name])
    blob[-100] ^= 0x01
    members[name] = bytes(blob)


def _swap_entries(m, members):
    """Two valid entries under each other's names, the manifest's digests updated to match: only the keys embedded in
    the entries tell."""
    a, b = m["entries"]
    na, nb = f"entries/{a['key']}.cubin", f"entries/{b['key']}.cubin"
    members[na], members[nb] = members[nb], members[na]
    for e, name in ((a, na), (b, nb)):
        e["sha256"], e["bytes"] = hashlib.sha256(members[name]).hexdigest(), len(members[name])


@pytest.mark.parametrize(
    ("edit", "refusal"),
    [
        (_flip_entry_byte, "does not match the SHA-256 and size in manifest.json"),
        (_manifest_edit(lambda m, _: m["entries"][0].update(spec="merge/evil")), "disagrees with manifest.json"),
        (_manifest_edit(lambda m, _: m["entries"][0].update(arch="sm_80")), "arch: manifest 'sm_80'"),
        (_manifest_edit(lambda m, _: m.update(toolchain="nvrtc=99.0")), "toolchain: manifest 'nvrtc=99.0'"),
        (_manifest_edit(_swap_entries), "key: manifest"),
        (_manifest_edit(lambda m, _: m["entries"].pop()), "1 present are not listed"),
        (lambda members: members.pop(next(n for n in members if n.startswith("entries/"))), "1 entries listed"),
        (lambda members: members.update({"../../evil.sh": b"#!/bin/sh\n"}), "unexpected member '../../evil.sh'"),
        (lambda members: members.pop("manifest.json"), "has no manifest.json"),
        (lambda members: members.update({"manifest.json": b"{"}), "manifest.json is not valid JSON"),
        (_manifest_edit(lambda m, _: m.update(format="cuinfer-bundle/9")), "format 'cuinfer-bundle/9'"),
    ],
    ids=["entry-byte", "spec", "arch", "toolchain", "swapped", "unlisted", "missing", "member", "no-manifest",
         "bad-json", "format"],
)  # fmt: skip
def test_altered_bundle_is_refused_and_nothing_is_written(source, tmp_path, monkeypatch, edit, refusal):
    bundle, altered = str(tmp_path / "b.tar"), str(tmp_path / "altered.tar")
    export_bundle(bundle)
    _rewrite(bundle, altered, edit)
    target = _target(monkeypatch, tmp_path)
    with pytest.raises(BundleError, match="refused|not a cuinfer bundle") as info:
        import_bundle(altered)
    assert refusal in str(info.value)
    assert not target.exists()


def test_sha256_checked_out_of_band(source, tmp_path, monkeypatch):
    bundle = str(tmp_path / "b.tar")
    _, digest = export_bundle(bundle)
    _target(monkeypatch, tmp_path)
    with pytest.raises(BundleError, match=f"expected {'0' * 64}: not the bundle that was exported"):
        import_bundle(bundle, sha256="0" * 64)
    assert read_bundle(bundle, sha256=digest.upper())[0]["entries"]


def test_bundle_of_another_toolchain_is_refused_unless_forced(source, tmp_path, monkeypatch):
    bundle = str(tmp_path / "b.tar")
    export_bundle(bundle)
    target = _target(monkeypatch, tmp_path)
    monkeypatch.setattr(toolchain, "fingerprint", lambda: "nvrtc=13.0;headers=13000:0")
    with pytest.raises(BundleError, match="none of its entries would be looked up here.*--force"):
        import_bundle(bundle)
    assert not target.exists()
    assert import_bundle(bundle, force=True).imported == len(SPECS)


def test_export_of_an_empty_cache_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(BundleError, match=r"no cache entries to export in .*empty: warm the cache first"):
        export_bundle(str(tmp_path / "b.tar"))


def test_cli_export_then_import(source, tmp_path, monkeypatch, capsys):
    bundle = str(tmp_path / "kernels.tar")
    assert main(["bundle", "export", bundle, "--arch", ARCH]) == 0
    out = capsys.readouterr().out
    assert f"exported {len(SPECS)} cache entries" in out
    digest = out.split("sha256 ")[1].split()[0]
    target = _target(monkeypatch, tmp_path)
    assert main(["bundle", "import", bundle, "--sha256", digest]) == 0
    out = capsys.readouterr().out
    assert f"verified {len(SPECS)} entries" in out and f"imported {len(SPECS)} into {target}, 0 already there" in out
    _rewrite(bundle, str(tmp_path / "bad.tar"), _flip_entry_byte)
    assert main(["bundle", "import", str(tmp_path / "bad.tar")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cuinfer bundle: error: bundle ") and "refused" in err and "Traceback" not in err
    assert main(["bundle", "export", str(tmp_path / "none.tar"), "--arch", "sm_80"]) == 1
    assert "no cache entries for sm_80" in capsys.readouterr().err
    assert main(["bundle", "import", str(tmp_path / "missing.tar"), "--sha256", digest]) == 1
    assert capsys.readouterr().err.startswith(f"cuinfer bundle: error: import {tmp_path / 'missing.tar'}: [Errno 2]")
    assert main(["bundle", "export", str(tmp_path / "no" / "such" / "dir.tar")]) == 1
    assert "cuinfer bundle: error: export " in capsys.readouterr().err
