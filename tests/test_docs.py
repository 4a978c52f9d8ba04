"""The docs a newcomer reads (issue #43): a short README, every cited file present, a spec page per operator,
a page per in-tree kernel backend, and the README's set-up commands as CI runs them.

A citation is a repository path written in the README, in docs/ or in the code (comments and doc strings
included): ``docs/...``, ``reports/...``, ``.ci/...``, ``tests/...``, ``harness/...`` and the other top-level
folders, the names of design notes that once lived outside the repository, and relative markdown links. A
path written with a placeholder (``reports/<device-class>/``, ``docs/specs/{op}.md``) is a pattern, not a
citation. Each citation that does not resolve is reported with its file and line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from harness.model import registry

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 250
SETUP_COMMAND = 'pip install -e ".[dev,ray]" && harness run --kernel mhc --sizes smoke'

TOP = ("docs", "specs", "reports", ".ci", "tests", "harness", "cases", "references", "backends")
# a path under one of the top-level folders; not a tail of a longer path or of a dotted module name
PATH = re.compile(r"(?<![\w./+-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./+-]*)")
# design notes that used to be cited by their bare names (they now live under docs/)
BARE = re.compile(r"(?<![\w./+-])((?:harness-design|bug-zoo|xent|style)\.md)\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PLACEHOLDER = "<{*[$%"
# a file name that stands for any file in an example (``tests/x.py::name``)
EXAMPLE_NAME = re.compile(r"(^|/)(x|y|foo|bar|name|example)\.\w+$")
# the installed layout: the wheel puts cases/, references/ and backends/ inside the harness package
INSTALLED = re.compile(r"^harness/(cases|references|backends)/")


def sources() -> list[Path]:
    files = [README, ROOT / "conftest.py", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("harness", "cases", "references", "backends", "tests"):
        for ext in ("*.py", "*.cu", "*.cuh"):
            files += sorted(p for p in (ROOT / folder).rglob(ext) if "__pycache__" not in p.parts)
    # this file's own examples of what the scan skips and catches are not citations
    return [f for f in files if f.is_file() and f.resolve() != Path(__file__).resolve()]


def _clean(path: str) -> str:
    return path.rstrip(".,:;")


def paths_in(line: str) -> list[str]:
    """The repository paths written in ``line``, patterns and examples left out."""
    out = []
    for m in PATH.finditer(line):
        nxt = line[m.end():m.end() + 1]
        path = _clean(m.group(1))
        if (nxt and nxt in PLACEHOLDER) or path.endswith("-") or "..." in path or EXAMPLE_NAME.search(path):
            continue  # a pattern such as reports/<device-class>/ or reports/bench-<operator>.md
        out.append(path)
    return out


def _where(file: Path, path: str) -> Path:
    """A path from the repository's root; in a markdown page, one relative to the page resolves too."""
    if INSTALLED.match(path):
        path = path[len("harness/"):]
    if file.suffix == ".md" and not (ROOT / path).exists():
        return file.parent / path
    if path.startswith("specs/"):
        # the operators' own modules cite their spec as specs/<x>.md, the folder under docs/: their bytes are
        # part of the oracle's digest (harness/measure/cell.py oracle_code), so a new path there would make every
        # committed cell incomparable under --compare
        return ROOT / "docs" / path
    return ROOT / path


def citations(file: Path) -> list[tuple[int, str, Path]]:
    """(line, as written, where it should be) for every citation in ``file``."""
    out = []
    for n, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
        for path in paths_in(line):
            out.append((n, path, _where(file, path)))
        for m in BARE.finditer(line):
            out.append((n, m.group(1), _where(file, m.group(1))))
        if file.suffix == ".md":
            for m in LINK.finditer(line):
                target = m.group(1).split("#", 1)[0]
                if not target or "://" in target or target.startswith("mailto:"):
                    continue
                out.append((n, m.group(1), (file.parent / target)))
    return list(dict.fromkeys(out))


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, at most {README_MAX_LINES}: move detail into docs/"


def test_every_cited_file_is_in_the_repository():
    missing = [f"{f.relative_to(ROOT)}:{n}: {text}" for f in sources() for n, text, path in citations(f)
               if not path.exists()]
    assert not missing, "citations of files that are not in the repository:\n" + "\n".join(missing)


def test_the_scan_sees_citations():
    """The scan itself: it finds the citations it must check and skips patterns."""
    probe = ROOT / "docs" / "index.md"
    found = {text for _, text, _ in citations(probe)}
    assert "user-guide.md" in found and "design.md" in found, found
    line = "see docs/specs/<op>.md, reports/bench-<operator>.md, tests/x.py::name and reports/STATUS.md."
    assert paths_in(line) == ["reports/STATUS.md"]
    assert paths_in("(specs/xent.md), harness-design.md") == ["specs/xent.md"]
    assert [m.group(1) for m in BARE.finditer("harness-design.md and docs/design.md")] == ["harness-design.md"]


def _in_tree_operators():
    registry.discover()
    return {name: op for name, op in registry.operators().items()
            if op.make_inputs.__module__.startswith("harness.cases.")}


def test_every_operator_has_a_spec_page_and_harness_list_points_to_it():
    ops = _in_tree_operators()
    assert ops
    for name in ops:
        page = ROOT / "docs" / "specs" / f"{name}.md"
        assert page.exists(), f"operator {name}: no spec page {page.relative_to(ROOT)}"
    listed = subprocess.run([sys.executable, "-m", "harness", "list", "--device", "cpu"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr
    for name in ops:
        assert f"spec: docs/specs/{name}.md" in listed.stdout, f"harness list does not point {name} to its page"


def test_every_in_tree_backend_has_a_kernel_page():
    registry.discover()
    pages = {p.name: p.read_text() for p in (ROOT / "docs" / "kernels").glob("*.md")}
    index = (ROOT / "docs" / "index.md").read_text()
    backends = [b for b in registry.backends() if (b.package or "").startswith("harness.backends")]
    assert backends
    for b in backends:
        key = f"`{b.operator}/{b.name}`"
        named = [name for name, text in pages.items() if key in text]
        assert named, f"backend {b.operator}/{b.name}: no page of docs/kernels/ names {key}"
        assert all(f"kernels/{name}" in index for name in named), f"docs/index.md does not list {named}"


def test_the_readme_setup_commands():
    text = README.read_text()
    section = text.split("\n## Set-up", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)\n(.*?)```", section, re.S)
    assert block, "README.md: no bash block under '## Set-up'"
    commands = [re.sub(r"\s+#.*$", "", line).strip() for line in block.group(1).splitlines()]
    commands = [c for c in commands if c and not c.startswith("#")]
    assert len(commands) == 2, commands
    assert commands[0] == SETUP_COMMAND, commands[0]
    assert commands[1].split()[0] == "pytest", commands[1]
    # the CPU build of torch is said before the commands that would otherwise pull a CUDA build
    note = section.find("download.pytorch.org/whl/cpu")
    assert 0 <= note < section.find(block.group(0)), "the CPU-torch note must come before the set-up block"
