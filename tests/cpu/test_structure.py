"""The shape of the product code (cuinfer/, planner/, interop/), read from the source with ``ast``, nothing imported:
no import cycle among its modules, no private name imported from another module, no module over 600 lines, and a
planner that needs nothing but NumPy.

Both module-level and function-level imports count: a function-level import that closes a cycle only hides the cycle
until that function runs. Relative imports are resolved; ``cuinfer.planner`` is ``planner/``, ``cuinfer.interop`` is
``interop/`` (the package-dir mapping of pyproject.toml) and ``cuinfer.kernel_src`` is data.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# package name -> folder (pyproject.toml [tool.setuptools.package-dir])
PACKAGES = {"cuinfer": ROOT / "cuinfer", "cuinfer.planner": ROOT / "planner", "cuinfer.interop": ROOT / "interop"}
MAX_LINES = 600


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package ``__init__``) for every product module."""
    out: dict[str, tuple[Path, bool]] = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("").parts
            if any(part.startswith(".") or part == "__pycache__" for part in rel):
                continue
            is_pkg = rel[-1] == "__init__"
            parts = rel[:-1] if is_pkg else rel
            out[".".join((pkg, *parts)) if parts else pkg] = (path, is_pkg)
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The product module ``name`` denotes (itself or the closest enclosing package), or None (outside, or data)."""
    if name == "cuinfer.kernel_src" or name.startswith("cuinfer.kernel_src."):
        return None
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> list[tuple[str, list[str], int]]:
    """``(imported module, names imported from it, line)`` for every import statement of ``module`` (any depth)."""
    path, is_pkg = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if is_pkg else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            out.append((src, [alias.name for alias in node.names], node.lineno))
    return out


def _graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: first line}; ``from pkg import sub`` points at the submodule ``pkg.sub``."""
    graph: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    for module in MODULES:
        for src, names, line in _imports(module):
            targets = []
            if names:
                for n in names:
                    sub = f"{src}.{n}"
                    targets.append(sub if sub in MODULES else src)
            else:
                targets.append(src)
            for t in targets:
                r = _resolve(t)
                if r is not None and r != module:
                    graph[module].setdefault(r, line)
    return graph


def _find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        color[m] = grey
        stack.append(m)
        for n in sorted(graph[m]):
            if color[n] == grey:
                return stack[stack.index(n) :] + [n]
            if color[n] == white:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        color[m] = black
        return None

    for m in sorted(graph):
        if color[m] == white:
            found = visit(m)
            if found:
                return found
    return None


def test_the_scan_sees_the_product_modules():
    for name in ("cuinfer", "cuinfer.jit.registry", "cuinfer.planner.work", "cuinfer.interop.arrays"):
        assert name in MODULES
    assert len(MODULES) > 40


def test_no_import_cycle():
    graph = _graph()
    cycle = _find_cycle(graph)
    if cycle:
        steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in zip(cycle, cycle[1:], strict=False)]
        pytest.fail("import cycle: " + "; ".join(steps))


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b": 1}, "b": {}}) is None


def test_no_private_name_crosses_modules():
    bad = []
    for module, (path, _) in MODULES.items():
        for src, names, line in _imports(module):
            if _resolve(src) is None:
                continue
            for n in names:
                if n.startswith("_") and not (n.startswith("__") and n.endswith("__")):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: from {src} import {n}")
    assert not bad, "private names imported from other modules:\n" + "\n".join(bad)


def test_modules_are_at_most_600_lines():
    long = {}
    for path, _ in MODULES.values():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long[str(path.relative_to(ROOT))] = n
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_planner_imports_nothing_but_numpy_and_itself():
    allowed = {
        "__future__",
        "numpy",
        "bisect",
        "dataclasses",
        "functools",
        "itertools",
        "math",
        "typing",
        "collections",
    }
    bad = []
    for module, (path, _) in MODULES.items():
        if not module.startswith("cuinfer.planner"):
            continue
        for src, _names, line in _imports(module):
            top = src.split(".")[0]
            if src.startswith("cuinfer.planner") or top in allowed:
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line}: {src}")
    assert not bad, "the planner imports:\n" + "\n".join(bad)


def test_every_package_is_listed_in_pyproject():
    """A wheel ships only the packages pyproject.toml lists: every product folder with an ``__init__.py`` is there
    (an editable install finds unlisted ones, so only a built wheel would miss them)."""
    import re

    block = re.search(r"^packages = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert block, "no packages list in pyproject.toml's [tool.setuptools]"
    listed = set(re.findall(r'"([^"]+)"', block.group(1)))
    found = {name for name, (_, is_pkg) in MODULES.items() if is_pkg}
    assert found <= listed, f"packages missing from [tool.setuptools] packages: {sorted(found - listed)}"
