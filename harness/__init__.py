"""Conformance harness for gradient kernels.

Public API for adapters and operator authors::

    from harness import register_backend, Backend
"""

from pathlib import Path as _Path

from .declarations import ContractException, Gap
from .registry import Backend, register_backend, register_mutant, register_operator
from .spec import Axis, Case, Component, Expectation, Inputs, MicrobatchSpec, Mutant, OperatorSpec, PerfTarget

# The operators, references and in-tree backends live in the checkout's top-level folders cases/,
# references/ and backends/, imported as harness.cases, harness.references and harness.backends: a wheel
# installs them inside this package (setup.py's package_dir), so no generic top-level module name
# reaches a user's site-packages. In a checkout (editable install, or PYTHONPATH=. on the GPU machine)
# the folders sit beside this package; searching the checkout's root as a second package path finds them.
_checkout = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "cases").is_dir() and (_checkout / "cases" / "__init__.py").is_file():
    __path__.append(str(_checkout))

__all__ = ["Axis", "Backend", "Case", "Component", "ContractException", "Expectation", "Gap", "Inputs",
           "MicrobatchSpec", "Mutant", "OperatorSpec", "PerfTarget", "register_backend", "register_mutant",
           "register_operator"]
