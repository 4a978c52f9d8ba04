"""What the rest of the harness talks about: operator specs, the registry of operators, backends and mutants,
records, inputs and twins, errors and devices. Imports no other layer.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
