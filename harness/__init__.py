"""Conformance harness for gradient kernels.

Public API for adapters and operator authors::

    from harness import register_backend, Backend
    from harness import OperatorSpec, register_operator, named_cases, tensor   # an operator of your own

The names are imported on first use (PEP 562): the pytest plugin, installed into every pytest run of an
environment, imports this package, and an unrelated project must not pay for importing torch.
"""

from importlib import import_module as _import_module
from pathlib import Path as _Path

# public name -> the module that defines it
_API = {
    **dict.fromkeys(("ContractException", "Gap"), "model.declarations"),
    **dict.fromkeys(("generator", "layouts", "place", "randn", "tensor", "uniform"), "model.inputs"),
    **dict.fromkeys(("Backend", "register_backend", "register_mutant", "register_operator"), "model.registry"),
    **dict.fromkeys(("twin", "with_twins"), "model.twins"),
    **dict.fromkeys(("Axis", "Case", "Component", "Expectation", "Inputs", "MicrobatchSpec", "Mutant",
                     "OperatorSpec", "PerfTarget", "Separable", "SplitAxis", "named_cases"), "model.spec"),
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(_import_module(f".{_API[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


# The operators, references and in-tree backends live in the checkout's top-level folders cases/,
# references/ and backends/, imported as harness.cases, harness.references and harness.backends: a wheel
# installs them inside this package (setup.py's package_dir), so no generic top-level module name
# reaches a user's site-packages. In a checkout (editable install, or PYTHONPATH=. on the GPU machine)
# the folders sit beside this package; searching the checkout's root as a second package path finds them.
_checkout = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "cases").is_dir() and (_checkout / "cases" / "__init__.py").is_file():
    __path__.append(str(_checkout))
