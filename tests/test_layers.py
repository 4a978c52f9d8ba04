"""The house in layers (docs/design.md, "Layers"), checked from the code's own imports and definitions.

import-linter (`lint-imports`, configured in pyproject.toml) checks that each layer of harness/ imports only
the layers below it. These tests check the rest of the contract: every module sits in a layer, no circle
among modules (imports inside functions counted), imports inside functions only of heavy optional packages,
and short modules and functions; each rule with at most the named exceptions below, and their reasons.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "harness"
# packages whose import costs seconds or which may be absent: imported where they are needed
HEAVY = ("torch", "triton", "tilelang", "ray", "matplotlib", "PIL", "tqdm")
# The named exceptions, with their reasons: at most three, for every rule below together.
EXCEPTIONS = {
    "harness.measure.oracle": "its code is part of every cell's oracle digest (harness/measure/digests.py): "
                              "splitting or reordering it makes every committed report not comparable under "
                              "--compare",
    "harness.front.pytest_plugin": "installed, it loads into every pytest run of the environment: it imports "
                                   "the harness (and torch) only once a harness option is given",
    "harness.run.worker": "a spawned worker sets CUDA_VISIBLE_DEVICES and TRITON_INTERPRET before torch is "
                          "imported: the harness comes in after that",
}
# modules of harness/ outside the layers: the package's own entry points
ENTRY_POINTS = {"harness", "harness.__main__", "harness.pytest_plugin"}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 80
# harness/'s layer folders, lowest first (pyproject.toml's import-linter contract lists them top first)
LAYERS = ("model", "judge", "store", "measure", "across", "render", "run", "tools", "front")


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(HARNESS.rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, bool, int]]:
    """(imported module, inside a function, line) for each import of a harness module by module ``name``."""
    p = MODULES[name]
    tree = ast.parse(p.read_text())
    package = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            if t in MODULES and t != name:
                out.append((t, id(node) in inner, node.lineno))
    return out


def test_every_module_sits_in_a_layer_and_the_contract_names_them_all():
    stray = [m for m in MODULES if m not in ENTRY_POINTS and m.split(".")[1] not in LAYERS]
    assert not stray, f"modules outside the layers {LAYERS}: {stray}"
    on_disk = {p.name for p in HARNESS.iterdir() if (p / "__init__.py").is_file()}
    assert on_disk == set(LAYERS), "harness/'s subpackages and LAYERS must agree"
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    assert sorted(contract["layers"]) == sorted(LAYERS)


def test_no_circle_among_harness_modules_imports_inside_functions_counted():
    graph = {m: {t for t, _, _ in _imports(m)} for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan: strongly connected components of more than one module are circles
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for m in graph:
        if m not in index:
            visit(m)
    assert not circles, f"import circles: {circles}"


def test_imports_inside_functions_only_of_heavy_packages_or_in_the_named_exceptions():
    bad = []
    for name, p in MODULES.items():
        if name in EXCEPTIONS:
            continue
        tree = ast.parse(p.read_text())
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(f):
                if isinstance(n, ast.Import):
                    mods = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom):
                    mods = ["." if n.level else n.module or ""]
                else:
                    continue
                bad += [f"{p.relative_to(ROOT)}:{n.lineno}: {m}" for m in mods if m.split(".")[0] not in HEAVY]
    assert not bad, "imports inside functions (move them to the top of the module):\n" + "\n".join(bad)


def test_modules_and_functions_are_short():
    long = []
    for name, p in MODULES.items():
        if name in EXCEPTIONS:
            continue
        text = p.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long.append(f"{p.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for f in ast.walk(ast.parse(text)):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > \
                    MAX_FUNCTION_LINES:
                long.append(f"{p.relative_to(ROOT)}:{f.lineno}: {f.name} {f.end_lineno - f.lineno + 1} lines")
    assert not long, f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function:\n" + \
        "\n".join(long)


def test_at_most_three_named_exceptions():
    assert len(EXCEPTIONS) <= 3 and all(m in MODULES for m in EXCEPTIONS)


def test_the_design_pages_layer_table_lists_every_module_where_it_is():
    """docs/design.md's "Layers" table is where a newcomer looks for the module to change: it must be right."""
    text = (ROOT / "docs" / "design.md").read_text()
    rows = {}
    for line in text.split("## Layers", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].strip("`") in LAYERS:
            rows[cells[0].strip("`")] = {m.strip() for m in cells[2].split(",")}
    on_disk = {layer: {m.split(".")[2] for m in MODULES if m.count(".") == 2 and m.split(".")[1] == layer}
               for layer in LAYERS}
    assert rows == on_disk
