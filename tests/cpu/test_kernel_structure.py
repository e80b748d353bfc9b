"""The CUDA sources stay readable and composable: no device function over 150 lines, every header self-contained
(compiles on its own), and the shipped kernels carry no A/B or trace switches outside the one debug header."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "kernel_src"
MAX_FUNCTION_LINES = 150
SOURCES = sorted(p for p in ROOT.rglob("*") if p.suffix in (".cuh", ".cu"))


def device_functions(text: str) -> list[tuple[str, int, int]]:
    """``(name, first line, line count)`` of every function whose declaration carries ``__device__`` or
    ``__global__`` (lambdas and local structs inside a function count towards it)."""
    lines = text.splitlines()
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if ("__device__" in line or "__global__" in line) and not line.lstrip().startswith(("//", "#")):
            # the body starts at the first '{' at or after the declaration; a ';' first means a declaration only
            j, col = i, None
            while j < len(lines):
                brace, semi = lines[j].find("{"), lines[j].find(";")
                if brace >= 0 and (semi < 0 or brace < semi):
                    col = brace
                    break
                if semi >= 0:
                    break
                j += 1
            if col is None:
                i = j + 1
                continue
            depth, k = 0, j
            while k < len(lines):
                code = lines[k].split("//")[0]
                start = col if k == j else 0
                for ch in code[start:]:
                    depth += (ch == "{") - (ch == "}")
                if depth <= 0:
                    break
                k += 1
            m = re.search(r"(\w+)\s*\(", " ".join(lines[i : j + 1]).split("__device__")[-1].split("__global__")[-1])
            out.append((m.group(1) if m else "?", i + 1, k - i + 1))
            i = k + 1
        else:
            i += 1
    return out


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_no_device_function_over_150_lines(path):
    long = [(n, line, count) for n, line, count in device_functions(path.read_text()) if count > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines (name, line, lines): {long}"


def test_the_length_check_finds_functions():
    text = "template <int N>\n__device__ void f(int x) {\n" + "  x += 1;\n" * 200 + "}\n__device__ int g();\n"
    assert device_functions(text) == [("f", 2, 202)]


def test_switches_live_in_the_debug_header():
    """`#ifdef CUINFER_*` lab switches (A/B builds, trace stamps) appear only in kernel_src/debug/."""
    offenders = []
    for path in SOURCES:
        if path.parent.name == "debug":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*#\s*(if|ifdef|ifndef|elif)\b.*CUINFER_", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "lab switches outside kernel_src/debug/:\n" + "\n".join(offenders)


def test_kernel_sources_are_package_data():
    """Every CUDA file under kernel_src/ is shipped (pyproject's package-data globs cover it)."""
    import fnmatch

    text = (ROOT.parent / "pyproject.toml").read_text()
    m = re.search(r'"cuinfer\.kernel_src"\s*=\s*\[([^\]]*)\]', text)
    assert m, "no package-data entry for cuinfer.kernel_src"
    globs = re.findall(r'"([^"]+)"', m.group(1))
    for path in SOURCES:
        rel = str(path.relative_to(ROOT))
        ok = any(fnmatch.fnmatch(rel, g) or (g.startswith("**/") and fnmatch.fnmatch(rel, g[3:])) for g in globs)
        assert ok, f"{rel} is not matched by the package-data globs {globs}"
