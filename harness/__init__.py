"""Conformance harness for gradient kernels.

Public API for adapters and operator authors::

    from harness import register_backend, Backend
"""

from .declarations import ContractException, Gap
from .registry import Backend, register_backend, register_mutant, register_operator
from .spec import Axis, Case, Component, Expectation, Inputs, MicrobatchSpec, Mutant, OperatorSpec, PerfTarget

__all__ = ["Axis", "Backend", "Case", "Component", "ContractException", "Expectation", "Gap", "Inputs",
           "MicrobatchSpec", "Mutant", "OperatorSpec", "PerfTarget", "register_backend", "register_mutant",
           "register_operator"]
