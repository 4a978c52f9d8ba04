"""pytest-benchmark items: `pytest tests/test_benchmarks.py --harness-bench [--kernel mhc] [--backend triton]`
(skipped without --harness-bench, so the test suite stays a correctness suite)."""

from harness.pytest_plugin import test_benchmark  # noqa: F401
