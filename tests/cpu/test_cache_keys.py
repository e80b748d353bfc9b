"""Portable cache keys: what determines the cubin is in the key, paths and mtimes are not (cuinfer/jit/spec.py
``cache_key``, cuinfer/jit/cache.py ``spec_key``, cuinfer/jit/toolchain.py ``fingerprint``)."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import sys

import pytest

from cuinfer.jit import cache, toolchain
from cuinfer.jit.spec import kernel_src_dir
from cuinfer.merge.specs import merge_spec

ARCH = "sm_90a"


@pytest.fixture
def fresh_identity():
    """Forget the include directory and the fingerprint found so far, before and after the test."""

    def clear():
        toolchain.include_dir.cache_clear()
        toolchain.fingerprint.cache_clear()
        toolchain._read_cudart_version.cache_clear()

    clear()
    yield clear
    clear()


def test_key_has_no_path_or_mtime(fresh_identity):
    fp = toolchain.fingerprint()
    assert os.sep not in fp, fp
    assert re.fullmatch(r"nvrtc=.+;headers=\d+:[0-9a-f]{16}", fp), fp
    opts = cache.key_options(ARCH)
    assert "-I<cuda-include>" in opts and "-I<kernel_src>" in opts
    assert not any(os.sep in o for o in opts), opts


def test_touching_the_nvrtc_builtins_library_keeps_the_key(fresh_identity):
    libs = [
        p for root in sys.path for p in glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc-builtins.so.*"))
    ]
    if not libs:
        pytest.skip("no NVRTC wheel on sys.path (a system toolkit): its version is asked from NVRTC")
    spec = merge_spec("float16", 64)
    before = cache.spec_key(spec, ARCH)
    st = os.stat(libs[0])
    try:
        os.utime(libs[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**12))  # touch
        fresh_identity()
        assert cache.spec_key(spec, ARCH) == before
    finally:
        os.utime(libs[0], ns=(st.st_atime_ns, st.st_mtime_ns))


def _copy_headers(dest) -> str:
    src = toolchain.include_dir()
    dest.mkdir(parents=True)
    for name in (*toolchain.KERNEL_CUDA_HEADERS, "cuda_runtime_api.h"):
        if os.path.exists(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), dest / name)
    return str(dest)


def test_headers_at_another_path_keep_the_key_and_other_contents_change_it(tmp_path, monkeypatch, fresh_identity):
    spec = merge_spec("float16", 64)
    before = cache.spec_key(spec, ARCH)
    moved = _copy_headers(tmp_path / "elsewhere" / "include")
    monkeypatch.setenv("CUINFER_CUDA_INCLUDE", moved)
    fresh_identity()
    assert toolchain.include_dir() == moved
    assert cache.spec_key(spec, ARCH) == before  # another machine, another prefix: same key
    with open(os.path.join(moved, "cuda_fp16.hpp"), "a") as fh:
        fh.write("\n// patched\n")
    fresh_identity()
    assert cache.spec_key(spec, ARCH) != before  # a header the kernels include changed: another key


def test_other_cudart_version_changes_the_key(tmp_path, monkeypatch, fresh_identity):
    spec = merge_spec("float16", 64)
    before = cache.spec_key(spec, ARCH)
    moved = _copy_headers(tmp_path / "include")
    api = os.path.join(moved, "cuda_runtime_api.h")
    text = open(api, encoding="utf-8", errors="replace").read()
    with open(api, "w", encoding="utf-8") as fh:
        fh.write(re.sub(r"(#define\s+CUDART_VERSION\s+)\d+", r"\g<1>12080", text, count=1))
    monkeypatch.setenv("CUINFER_CUDA_INCLUDE", moved)
    fresh_identity()
    assert "headers=12080:" in toolchain.fingerprint()
    assert cache.spec_key(spec, ARCH) != before


def test_dynamic_smem_is_in_the_spec_but_not_in_the_key():
    spec = merge_spec("float16", 64)
    assert spec.smem_bytes == 0 and '"smem_bytes": 0' in spec.canonical()
    launched = dataclasses.replace(spec, smem_bytes=64 * 1024)
    assert launched.canonical() != spec.canonical()
    assert cache.spec_key(launched, ARCH) == cache.spec_key(spec, ARCH)  # same cubin
    assert cache.spec_key(dataclasses.replace(spec, extra_options=("-G",)), ARCH) != cache.spec_key(spec, ARCH)


def test_every_cuda_header_the_kernels_include_is_hashed_into_the_key():
    included = set()
    for dirpath, _, files in os.walk(kernel_src_dir()):
        for name in files:
            if name.endswith((".cu", ".cuh")):
                with open(os.path.join(dirpath, name), encoding="utf-8") as fh:
                    included |= set(re.findall(r"^\s*#\s*include\s*<([^>]+)>", fh.read(), re.M))
    missing = included - set(toolchain.KERNEL_CUDA_HEADERS)
    assert not missing, f"kernel_src includes {sorted(missing)}: add them to toolchain.KERNEL_CUDA_HEADERS"
