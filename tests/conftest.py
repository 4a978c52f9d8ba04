"""Test layers as markers: each item gets its module's layer from tests/layers.py (`pytest -m unit`, `-m compile`,
`-m e2e`). The harness plugin is loaded by the repository's own conftest.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest
from layers import MARKERS, TEST_LAYERS

TESTS = Path(__file__).resolve().parent
# the runs these tests start (harness run in a subprocess, failing on purpose) do not search minimal failing
# cases, a minute per failing triple; tests/test_minimal.py asks for it with --shrink-seconds
os.environ["HARNESS_SHRINK_SECONDS"] = "0"


def _module(path: Path) -> str:
    """The table's key: tests/gpu/test_user_paths.py -> gpu.test_user_paths."""
    return ".".join(path.resolve().relative_to(TESTS).with_suffix("").parts)


def pytest_configure(config: pytest.Config) -> None:
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what} (tests/layers.py)")


class _Unlisted(pytest.Module):
    """A test module with no layer: a collection error rather than a file that no CI step runs."""

    def collect(self) -> NoReturn:
        raise self.CollectError(f"{self.path.resolve().relative_to(TESTS.parent)} has no test layer: add "
                                f"\"{_module(self.path)}\" to TEST_LAYERS in tests/layers.py (unit, compile or e2e)")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    return None if _module(module_path) in TEST_LAYERS else _Unlisted.from_parent(parent, path=module_path)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # only this folder's items: the harness plugin's conformance items come from harness/
        if item.path.resolve().is_relative_to(TESTS):
            item.add_marker(TEST_LAYERS[_module(item.path)])
