"""Planned cells executed: the run session, the plan, local worker processes, the hang guard, Ray.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
