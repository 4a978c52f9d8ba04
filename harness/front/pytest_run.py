"""The harness side of the pytest plugin (harness/front/pytest_plugin.py), imported once a harness option is
given: the pytest session's run session and the worker that runs its items, the benchmark items' params."""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ..across.compare import compare_cell, compared_as
from ..across.repro import save_bundle
from ..model import registry
from ..model.devices import checked_device
from ..model.errors import CannotRunHere, UsageError
from ..model.records import CellRecord
from ..model.spec import as_list
from ..run.plan import Task
from ..run.session import RunRequest, RunSession, load_plugins
from ..run.single import SingleWorker
from ..tools.bench import cases_for

_RUN = pytest.StashKey["PytestRun"]()


def start(config: pytest.Config, pytest_names: Callable[[str], str]) -> None:
    """The session's PytestRun; a bad request is pytest's usage error, one that cannot run here exit 3."""
    try:
        config.stash[_RUN] = PytestRun(config)
    except UsageError as e:
        raise pytest.UsageError(f"harness: {pytest_names(str(e))}") from e
    except CannotRunHere as e:
        pytest.exit(f"harness: {pytest_names(str(e))}", returncode=3)


def current(config: pytest.Config) -> PytestRun | None:
    return config.stash.get(_RUN, None)


def close(config: pytest.Config) -> None:
    run = current(config)
    if run is not None:
        run.close()


def compare(run: PytestRun) -> str:
    """The session's comparison with --harness-compare's REF, saved beside the report; "" or the error."""
    try:
        run.session.compare()
    except UsageError as e:
        return str(e)
    return ""


def bench_params(cfg: pytest.Config) -> tuple[list, list[str]]:
    load_plugins(cfg.getoption("harness_plugin"))
    return _bench_params(cfg)


def _device(config: pytest.Config) -> str:
    return checked_device(config.getoption("harness_device"))


class PytestRun:
    """The pytest session's run session, the worker that executes its cells, and where bundles go."""

    def __init__(self, config: pytest.Config):
        self.config = config
        req = RunRequest(
            kernels=as_list(config.getoption("harness_kernel")) or ["all"],
            sizes=config.getoption("harness_sizes") or "smoke",
            backends=as_list(config.getoption("harness_backend")) or None,
            dtypes=as_list(config.getoption("harness_dtype")) or None,
            device=config.getoption("harness_device"),
            plugins=list(config.getoption("harness_plugin")),
            report=config.getoption("harness_report"),
            command="pytest " + " ".join(shlex.quote(str(a)) for a in config.invocation_params.args),
            compare=config.getoption("harness_compare"),
            compare_fail=config.getoption("harness_compare_fail"),
        )
        self.session = RunSession(req)
        # pytest-xdist workers of one session share one run id
        self.session.header["run_id"] = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:10] or \
            self.session.header["run_id"]
        self.executor: Any = None
        self.ran: dict[str, list] = {}  # backend -> [items that ran, skip reasons] (from the item reports)

    def run_cell(self, t: Task) -> CellRecord:
        if t.skip:
            cell = t.failed("SKIP", t.skip)
        else:
            if self.executor is None:
                try:
                    self.session.begin()
                except UsageError as e:  # the report folder is another run's (or cannot be written)
                    pytest.exit(f"harness: {e}", returncode=pytest.ExitCode.USAGE_ERROR)
                self.executor = SingleWorker(self.session.device, registry.plugins_loaded(),
                                             self.config.getoption("harness_timeout"), gpu=_gpu_for_xdist_worker(),
                                             max_hangs=self.config.getoption("harness_max_hangs"))
            cell = self.executor.run_one(t)
        self.session.record(cell)
        return cell

    def save_repro(self, cell: CellRecord) -> Path | None:
        """A bundle in --harness-report's folder, else pytest's cache folder (or a temporary one)."""
        root = self.config.getoption("harness_report")
        if not root:
            cache = getattr(self.config, "cache", None)
            root = str(cache.mkdir("harness")) if cache is not None else tempfile.mkdtemp(prefix="harness-")
        try:
            return save_bundle(cell, root, registry.plugins_loaded())
        except Exception:  # noqa: BLE001 - the failure itself is what the item must show
            return None

    def compare_cell(self, cell: CellRecord) -> Any:
        """This item's cell against REF's (None without --harness-compare)."""
        ref = self.session.reference
        if ref is None:
            return None
        old = ref.cells.get(cell.id.under(compared_as(cell)))
        return compare_cell(cell, old, self.session.header, ref.header(old) if old else {},
                            self.session.req.compare_fail, self.session.device_class)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
        self.session.render()


def run_session(config: pytest.Config) -> PytestRun:
    return config.stash[_RUN]


def _gpu_for_xdist_worker() -> int | None:
    """pytest -n <gpus>: worker gwK runs its cells on GPU K (mod the visible count)."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not wid.startswith("gw"):
        return None
    n = torch.cuda.device_count()
    return int(wid[2:]) % n if n else None


def _bench_params(cfg: pytest.Config) -> tuple[list, list[str]]:
    """(operator, backend, case, dtype, device) per pytest-benchmark item, as `harness bench` picks them."""
    device = _device(cfg)
    gpu = device.startswith("cuda")
    wanted = as_list(cfg.getoption("harness_backend")) or None
    dtypes = as_list(cfg.getoption("harness_dtype")) or ["bfloat16" if gpu else "float32"]
    params, ids = [], []
    for op_name in registry.resolve_kernels(as_list(cfg.getoption("harness_kernel")) or ["all"]):
        op = registry.get_operator(op_name)
        cases = cases_for(op, device)
        for b in registry.backends(op_name):
            if wanted and b.name not in wanted:
                continue
            for case in cases:
                for dt in dtypes:
                    why = b.unavailable(device) or (None if dt in b.dtypes else f"dtype {dt} not supported")
                    marks = [pytest.mark.skip(reason=f"{b.name}: {why}")] if why else []
                    params.append(pytest.param((op_name, b.name, case, dt, device), marks=marks))
                    ids.append(f"{op_name}-{b.name}-{dt}-{case.name}")
    return params, ids


