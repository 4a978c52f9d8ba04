"""docs/faults.md: every row names at least one test, and every test it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "faults.md"


def rows() -> list[str]:
    return [line for line in TABLE.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| fault") and not line.startswith("|---")]


def named_tests(row: str) -> list[tuple[str, str]]:
    """(file, test) for each `tests/x.py::name` in the row; a bare `::name` is in the file named before it."""
    out, current = [], None
    for path, name in re.findall(r"`(tests/[\w/]+\.py)?::([\w]+)(?:\[[\w-]+\])?`", row):
        current = path or current
        assert current, f"a test without its file: {row}"
        out.append((current, name))
    return out


def defined(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}


def test_every_fault_names_a_test_and_every_named_test_exists():
    assert len(rows()) >= 10
    missing = []
    for row in rows():
        tests = named_tests(row)
        assert tests, f"a fault without a test: {row[:120]}"
        missing += [f"{p}::{n}" for p, n in tests if n not in defined(p)]
    assert not missing, missing


def test_the_readme_links_the_fault_table():
    assert "docs/faults.md" in (ROOT / "README.md").read_text()
