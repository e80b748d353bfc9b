"""The documentation stands alone: every relative link resolves, and no file names the notes that used to live outside.

- Every relative Markdown link and image in README.md, CONTRIBUTING.md, bench/README.md and docs/**/*.md points at a
  file or folder of the repository, and every ``#anchor`` into a Markdown file (or within the same file) names one of
  its headings, slugged as GitHub does. http(s) and mailto links are not checked.
- No file of the repository except CHANGELOG.md names the two external notes files (the performance notes and the
  API contract, which now live in docs/benchmarks.md, docs/performance.md and docs/api.md).
- docs/api.md's listing of ``cuinfer.__all__`` is the package's (read from cuinfer/__init__.py with ``ast``).

Pure standard library: no cuinfer import, so it runs before the package is installed.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]

# The names are assembled so that this file does not contain them itself.
FORBIDDEN = ("PERF" + ".md", "API" + ".md")
ALLOWED_TO_NAME_THEM = {"CHANGELOG.md"}
SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", ".venv-ci", ".peers", ".whl", "build", "dist", ".pytest_cache",
             ".ruff_cache", ".hypothesis", "node_modules"}  # fmt: skip


def markdown_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "bench" / "README.md"]
    files += sorted((REPO / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


# ---- Markdown parsing -----------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets ([`a[0]`](x)).
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]"  # [text] or ![alt]
    r"\(\s*(<[^>]*>|[^()\s]+(?:\([^()\s]*\)[^()\s]*)*)"  # (target: <...>, or no spaces and balanced parentheses
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)"  # an optional "title"
)
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)\s*=\s*\"([^\"]+)\"", re.IGNORECASE)


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        out.append((n, line))
    return out


def prose_lines(text: str) -> list[tuple[int, str]]:
    """``outside_fences`` with inline code spans blanked out (a link inside backticks is code, not a link)."""
    return [(n, _CODE_SPAN.sub(lambda s: " " * len(s.group(0)), line)) for n, line in outside_fences(text)]


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition outside code."""
    found = []
    for n, line in prose_lines(text):
        for m in _INLINE_LINK.finditer(line):
            found.append((n, m.group(1).strip("<>")))
        m = _REF_DEF.match(line)
        if m:
            found.append((n, m.group(1).strip("<>")))
    return found


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without Markdown syntax, lower case, anything but letters, digits,
    spaces, hyphens and underscores dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images -> their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors a Markdown file defines: its headings' slugs (repeats numbered -1, -2, ... as GitHub does) and
    explicit HTML anchors (``<a name="...">`` / ``id="..."``)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in outside_fences(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if m:
            slug = github_slug(m.group(2))
            k = seen.get(slug, 0)
            seen[slug] = k + 1
            out.add(slug if k == 0 else f"{slug}-{k}")
        out.update(_HTML_ANCHOR.findall(line))
    return frozenset(out)


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


def broken_links(md: Path) -> list[str]:
    problems = []
    rel = md.relative_to(REPO)
    for n, target in links(md.read_text(encoding="utf-8")):
        if is_external(target):
            if not re.match(r"^(https?|mailto):", target, re.IGNORECASE):
                problems.append(f"{rel}:{n}: {target}: only http(s) and mailto links may leave the repository")
            continue
        path_part, _, fragment = target.partition("#")
        dest = md if not path_part else (md.parent / unquote(path_part)).resolve()
        if REPO != dest and REPO not in dest.parents:
            problems.append(f"{rel}:{n}: {target}: points outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{rel}:{n}: {target}: {dest.relative_to(REPO)} does not exist")
            continue
        if fragment and dest.suffix == ".md" and dest.is_file():
            if unquote(fragment) not in anchors(dest):
                problems.append(
                    f"{rel}:{n}: {target}: no heading of {dest.relative_to(REPO)} has the anchor #{fragment}"
                )
    return problems


# ---- the tests ------------------------------------------------------------------------------------------------------


def test_the_parsers_on_known_forms():
    text = (
        'See [a](x.md), ![img](pics/p.png "title"), [`b[0]`](y.md#sec), <https://example.org> and [web](https://x.y).\n'
        "`[not a link](nowhere.md)`\n"
        "```\n[inside a fence](nowhere.md)\n```\n"
        "[ref]: refs/target.md\n"
    )
    assert [t for _, t in links(text)] == ["x.md", "pics/p.png", "y.md#sec", "https://x.y", "refs/target.md"]
    assert github_slug("Plan/run wrappers") == "planrun-wrappers"
    assert github_slug("Eighth record — 2026-11-30, `h200-2026-11-30`") == "eighth-record--2026-11-30-h200-2026-11-30"
    assert github_slug("plan() on the host") == "plan-on-the-host"
    assert github_slug("Prefill, causal") == "prefill-causal"


def test_the_docs_are_found():
    names = {f.relative_to(REPO).as_posix() for f in markdown_files()}
    assert {"README.md", "CONTRIBUTING.md", "docs/api.md", "docs/benchmarks.md"} <= names, sorted(names)


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(md: Path):
    problems = broken_links(md)
    assert not problems, "broken links:\n" + "\n".join(problems)


def repository_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files (git), or a walk of the tree without build outputs."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        files = [REPO / p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
        return sorted({f for f in files if f.is_file()})
    except (OSError, subprocess.SubprocessError):
        files = []
        for root, dirs, names in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            files += [Path(root) / n for n in names]
        return sorted(files)


def test_no_file_names_the_external_notes():
    offenders = []
    for f in repository_files():
        rel = f.relative_to(REPO).as_posix()
        if rel in ALLOWED_TO_NAME_THEM:
            continue
        try:
            data = f.read_bytes()
        except OSError:
            continue
        counts = {name: data.count(name.encode()) for name in FORBIDDEN}
        if any(counts.values()):
            offenders.append(f"{rel}: " + ", ".join(f"{k} x{v}" for k, v in counts.items() if v))
    assert not offenders, f"{len(offenders)} files still name the external notes:\n" + "\n".join(offenders)


def test_api_md_lists_cuinfer_all():
    tree = ast.parse((REPO / "cuinfer" / "__init__.py").read_text())
    assigned = [
        n for n in tree.body if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]
    ]
    package = ast.literal_eval(assigned[0].value)
    m = re.search(r"^cuinfer\.__all__\n((?:#.*\n)+)", (REPO / "docs" / "api.md").read_text(), re.MULTILINE)
    assert m, "docs/api.md has no '# [...]' listing after a cuinfer.__all__ line"
    listed = ast.literal_eval("".join(line[1:] for line in m.group(1).splitlines(keepends=True)))
    assert listed == package, f"docs/api.md lists {listed}; cuinfer/__init__.py has {package}"
