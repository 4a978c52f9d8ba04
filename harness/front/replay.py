"""`harness repro BUNDLE`: one saved cell (harness/across/repro.py) run again, in a worker of its own, and
judged as the run judged it."""

from __future__ import annotations

from ..across.repro import load_bundle
from ..judge.judgement import judge_cell
from ..measure.digests import tensors_digest
from ..measure.oracle import gen_inputs
from ..model import registry
from ..model.devices import checked_device
from ..model.errors import UsageError
from ..model.mutant_builds import resolve
from ..model.spec import Case, dtype_of
from ..render.terminal import format_failure
from ..run.plan import plan
from ..run.single import SingleWorker


def replay(path: str, device: str | None = None, timeout: float = 300.0) -> int:
    b = load_bundle(path)
    for p in b.get("plugins") or []:
        try:
            registry.load_plugin(p)
        except (FileNotFoundError, ValueError) as e:  # PluginError included
            raise UsageError(f"BUNDLE {path!r}: its plugin does not load: {e}") from e
    # the bundle's device, unless --device says otherwise; a GPU bundle on a machine without one: exit 3
    dev = checked_device(device or b.get("device") or "cpu")
    case = Case.from_json(b["case"])
    try:
        op = registry.get_operator(b["operator"])
        resolve(b["operator"], b["backend"])
    except KeyError as e:
        raise UsageError(f"BUNDLE {path!r}: {e.args[0] if e.args else e} (a plugin's operator or backend needs "
                         "its --plugin)") from e
    regen = gen_inputs(op, case, dtype_of(b["dtype"]), b["seed"], "cpu")
    if tensors_digest(regen.tensors) != b["inputs_sha256"]:
        print(
            "warning: inputs regenerated from the seed differ from the saved ones (the generator changed); "
            "replaying the regenerated inputs"
        )
    # a TIMEOUT bundle replays its hang: the cell is stopped after ``timeout`` seconds, as in the run
    ex = SingleWorker(dev, b.get("plugins", []), timeout=timeout, max_hangs=0)
    try:
        p = plan(
            [b["operator"]], "smoke", [b["backend"]], [b["dtype"]], dev, b["seed"], cases={b["operator"]: [case]}
        )
        cell = ex.run_one(p.tasks[0])
    finally:
        ex.close()
    if cell.status.value == "TIMEOUT":
        print(f"{b['operator']}/{b['backend']}/{b['dtype']}/{case.name}: TIMEOUT again ({cell.error}; "
              f"--timeout sets the limit)")
        return 1
    ok = not judge_cell(cell).failing
    print(format_failure(cell) if not ok
          else f"{b['operator']}/{b['backend']}/{b['dtype']}/{case.name}: PASS now (was {b.get('status', '?')})")
    return 0 if ok else 1
