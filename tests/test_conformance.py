"""Conformance cells as test items: `pytest --backend=golden --kernel mhc --sizes smoke`."""

from harness.pytest_plugin import test_conformance  # noqa: F401
