"""Who may write the kernel cache: trust rules, private / shared modes, read-only tiers (cuinfer/jit/cache.py).

A cubin is code that runs on the GPU, so a cache that others can write lets them run code in every process that uses
it. Other users are simulated without root: modes are real (chmod), other owners and another effective uid are faked
by wrapping ``os.stat`` / ``os.fstat`` / ``os.geteuid`` (``fake_ids``); where the suite runs as root, one test also
chowns a file for real.
"""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from cuinfer.jit import KernelSpec, cache, fetch, get_compiled
from cuinfer.jit.cache import CacheTrustError, CacheWarning, check_trusted

ARCH = "sm_80"
TINY = "template <int N>\n__global__ void tiny(float* x) { x[threadIdx.x] += N * $v; }\n"


def tiny(tmp_path, v: str = "1.0f") -> KernelSpec:
    src = tmp_path / "tiny.cu"
    if not src.exists():
        src.write_text(TINY)
    return KernelSpec(f"test/tiny/{v}", str(src), ("tiny<1>",), substitutions=(("v", v),))


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A fresh primary cache (CUINFER_CACHE_DIR) and per-user cache (XDG_CACHE_HOME); writable again at teardown."""
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CUINFER_CACHE_MODE", raising=False)
    monkeypatch.setattr(cache, "_warned", set())
    yield SimpleNamespace(cache=tmp_path / "cache", user=tmp_path / "xdg" / "cuinfer", tmp=tmp_path)
    for dirpath, _, _ in os.walk(tmp_path):
        os.chmod(dirpath, 0o755)


def entries(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".cubin")) if os.path.isdir(d) else []


class _Owned:
    """A stat result with another owner."""

    def __init__(self, st, uid: int) -> None:
        self._st, self.st_uid = st, uid

    def __getattr__(self, name):
        return getattr(self._st, name)


def fake_ids(monkeypatch, euid: int, owners: dict) -> None:
    """Pretend this process runs as ``euid`` and that the files under each path of ``owners`` belong to its uid."""
    real_stat, real_fstat = os.stat, os.fstat

    def owner(path: str):
        path = os.path.abspath(path)
        hits = [(len(str(p)), uid) for p, uid in owners.items() if path == str(p) or path.startswith(f"{p}{os.sep}")]
        return max(hits)[1] if hits else None

    def fake_stat(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        uid = None if isinstance(path, int) else owner(os.fspath(path))
        return st if uid is None else _Owned(st, uid)

    def fake_fstat(fd):
        st = real_fstat(fd)
        uid = owner(os.readlink(f"/proc/self/fd/{fd}"))
        return st if uid is None else _Owned(st, uid)

    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setattr(os, "stat", fake_stat)
    monkeypatch.setattr(os, "fstat", fake_fstat)


# ---- the rules ----------------------------------------------------------------------------------------------------


def _st(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, uid, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("what", "mode", "uid", "euid", "refused"),
    [
        ("directory", 0o40700, 1000, 1000, None),
        ("directory", 0o40755, 1000, 1000, None),
        ("directory", 0o40755, 0, 1000, None),  # a root-owned image cache others may read
        ("entry", 0o100644, 0, 1000, None),
        ("entry", 0o100600, 1000, 1000, None),
        ("directory", 0o40777, 1000, 1000, "writable by group and others (mode 0777)"),
        ("directory", 0o40775, 1000, 1000, "writable by group (mode 0775)"),
        ("entry", 0o100646, 1000, 1000, "writable by others (mode 0646)"),
        ("directory", 0o40777, 0, 1000, "writable by group and others"),  # root's, but open to all
        ("directory", 0o40755, 1001, 1000, "owned by uid 1001"),
        ("entry", 0o100600, 1001, 1000, "owned by uid 1001"),
        ("entry", 0o100644, 1000, 0, "owned by uid 1000"),  # root does not run a user's cubins either
        ("entry", 0o40700, 1000, 1000, "not a regular file"),
        ("directory", 0o100700, 1000, 1000, "not a directory"),
    ],
)
def test_trust_rules(monkeypatch, what, mode, uid, euid, refused):
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    if refused is None:
        check_trusted("/c", _st(mode, uid), what)
        return
    with pytest.raises(CacheTrustError) as info:
        check_trusted("/c", _st(mode, uid), what)
    msg = str(info.value)
    assert f"untrusted kernel cache {what} /c: it is {refused}" in msg
    assert "Rule: a cubin is code that runs on the GPU" in msg and "Fix: " in msg


# ---- the scenarios that were found --------------------------------------------------------------------------------


def test_forged_entry_in_a_world_writable_cache_is_refused(env):
    spec, other = tiny(env.tmp, "1.0f"), tiny(env.tmp, "2.0f")
    get_compiled(spec, ARCH)
    (name,) = entries(env.cache)
    get_compiled(other, ARCH)
    forged = next(n for n in entries(env.cache) if n != name)
    os.chmod(env.cache, 0o777)  # the cache dir as it was found
    os.replace(env.cache / forged, env.cache / name)  # another user: mv -f forged.bin <key>.cubin
    hits, compiles = cache.stats.disk_hits, cache.stats.compiles
    with pytest.raises(CacheTrustError, match=r"directory .* writable by group and others \(mode 0777\)") as info:
        get_compiled(spec, ARCH)
    assert "rm -rf" in str(info.value)
    assert (cache.stats.disk_hits, cache.stats.compiles) == (hits, compiles)  # neither loaded nor silently replaced


def test_group_writable_entry_is_refused(env):
    spec = tiny(env.tmp)
    get_compiled(spec, ARCH)
    (name,) = entries(env.cache)
    os.chmod(env.cache / name, 0o620)
    with pytest.raises(CacheTrustError, match=r"entry .* writable by group \(mode 0620\).*Fix: remove the entry"):
        get_compiled(spec, ARCH)


def test_entry_owned_by_another_user_is_refused(env, monkeypatch):
    spec = tiny(env.tmp)
    get_compiled(spec, ARCH)
    (name,) = entries(env.cache)
    fake_ids(monkeypatch, euid=1000, owners={env.cache: 1000, env.cache / name: 4242})
    with pytest.raises(CacheTrustError, match=r"entry .* owned by uid 4242, not by you \(uid 1000"):
        get_compiled(spec, ARCH)


def test_cache_dir_owned_by_another_user_is_refused(env, monkeypatch):
    spec = tiny(env.tmp)
    get_compiled(spec, ARCH)
    fake_ids(monkeypatch, euid=1000, owners={env.cache: 4242})
    with pytest.raises(CacheTrustError, match=r"directory .* owned by uid 4242"):
        get_compiled(spec, ARCH)
    with pytest.raises(CacheTrustError):
        cache.cache_tiers()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_entry_chowned_to_another_user_is_refused_for_real(env):
    spec = tiny(env.tmp)
    get_compiled(spec, ARCH)
    (name,) = entries(env.cache)
    os.chown(env.cache / name, 4242, 4242)
    with pytest.raises(CacheTrustError, match="owned by uid 4242"):
        get_compiled(spec, ARCH)


def test_symlinked_entry_is_refused(env):
    spec = tiny(env.tmp)
    get_compiled(spec, ARCH)
    (name,) = entries(env.cache)
    os.replace(env.cache / name, env.tmp / "elsewhere.cubin")
    os.symlink(env.tmp / "elsewhere.cubin", env.cache / name)
    with pytest.raises(CacheTrustError, match="symbolic link"):
        get_compiled(spec, ARCH)


# ---- modes --------------------------------------------------------------------------------------------------------


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_private_mode_creates_0700_dirs_and_0600_entries_whatever_the_umask(env):
    old = os.umask(0)
    try:
        get_compiled(tiny(env.tmp), ARCH)
    finally:
        os.umask(old)
    assert _mode(env.cache) == 0o700
    (name,) = entries(env.cache)
    assert _mode(env.cache / name) == 0o600
    assert os.listdir(env.cache) == [name]  # no lock or temporary file left behind


def test_shared_mode_creates_0755_dirs_and_0644_entries_whatever_the_umask(env, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(env.tmp / "image" / "cuinfer"))
    monkeypatch.setenv("CUINFER_CACHE_MODE", "shared")
    old = os.umask(0o077)
    try:
        get_compiled(tiny(env.tmp), ARCH)
    finally:
        os.umask(old)
    assert _mode(env.tmp / "image") == 0o755 and _mode(env.tmp / "image" / "cuinfer") == 0o755
    (name,) = entries(env.tmp / "image" / "cuinfer")
    assert _mode(env.tmp / "image" / "cuinfer" / name) == 0o644


def test_unknown_cache_mode_is_an_error(env, monkeypatch):
    monkeypatch.setenv("CUINFER_CACHE_MODE", "public")
    with pytest.raises(ValueError, match="use 'private' .* or 'shared'"):
        get_compiled(tiny(env.tmp), ARCH)


# ---- tiers --------------------------------------------------------------------------------------------------------


def test_read_only_cache_dir_is_a_read_tier_with_the_user_cache_behind_it(env):
    env.cache.mkdir(mode=0o555)
    os.chmod(env.cache, 0o555)
    tiers = cache.cache_tiers()
    assert [t.path for t in tiers] == [str(env.cache), str(env.user)]
    assert not tiers[0].writable and "0555" in tiers[0].why_read_only and tiers[1].writable
    spec = tiny(env.tmp)
    first = fetch(spec, ARCH)
    assert first.compiled and first.directory == str(env.user) and not first.store_error
    again = fetch(spec, ARCH)
    assert not again.compiled and again.directory == str(env.user)
    assert entries(env.cache) == [] and len(entries(env.user)) == 1


def test_read_only_everywhere_says_so_instead_of_failing_silently(env):
    env.cache.mkdir(mode=0o555)
    env.user.mkdir(parents=True)
    for d in (env.cache, env.user):
        os.chmod(d, 0o555)
    not_stored = cache.stats.not_stored
    with pytest.warns(CacheWarning, match="cannot be stored, so every process compiles them again"):
        r = fetch(tiny(env.tmp), ARCH)
    assert r.compiled and r.directory is None
    assert str(env.cache) in r.store_error and str(env.user) in r.store_error
    assert cache.stats.not_stored == not_stored + 1


def test_a_writable_cache_dir_is_the_whole_cache(env, monkeypatch):
    spec = tiny(env.tmp)
    monkeypatch.delenv("CUINFER_CACHE_DIR")
    assert fetch(spec, ARCH).directory == str(env.user)  # the default cache is the per-user one
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(env.cache))
    assert cache.cache_tiers()[0].path == str(env.cache) and len(cache.cache_tiers()) == 1
    assert fetch(spec, ARCH).compiled  # the user cache is not read behind a writable CUINFER_CACHE_DIR


def test_shared_image_warmed_by_root_serves_another_user_without_compiling(env, monkeypatch):
    image = env.tmp / "image"
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(image))
    monkeypatch.setenv("CUINFER_CACHE_MODE", "shared")
    specs = [tiny(env.tmp, v) for v in ("1.0f", "2.0f")]
    for s in specs:
        get_compiled(s, ARCH)  # the image build, as root
    monkeypatch.delenv("CUINFER_CACHE_MODE")
    fake_ids(monkeypatch, euid=1000, owners={image: 0, env.tmp / "xdg": 1000})  # the server, as uid 1000
    compiles = cache.stats.compiles
    assert [fetch(s, ARCH).directory for s in specs] == [str(image)] * 2
    assert cache.stats.compiles == compiles
    new = fetch(tiny(env.tmp, "3.0f"), ARCH)  # not in the image: compiled into the server's own cache
    assert new.compiled and new.directory == str(env.user)
    assert len(entries(image)) == 2


def test_private_cache_of_another_user_is_reported_not_missed_silently(env, monkeypatch):
    image = env.tmp / "image"
    monkeypatch.setenv("CUINFER_CACHE_DIR", str(image))
    spec = tiny(env.tmp)
    get_compiled(spec, ARCH)  # warmed in private mode: 0700 / 0600
    fake_ids(monkeypatch, euid=1000, owners={image: 0, env.tmp / "xdg": 1000})
    real_open = os.open

    def open_as_uid_1000(path, flags, *args, **kwargs):  # what EACCES looks like for 0600 entries of root
        if os.fspath(path).startswith(str(image)):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_as_uid_1000)
    with pytest.warns(
        CacheWarning, match=r"cannot read the kernel cache entries in .*image.*CUINFER_CACHE_MODE=shared"
    ):
        r = fetch(spec, ARCH)
    assert r.compiled and r.directory == str(env.user)
