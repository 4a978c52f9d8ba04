"""One cell measured: inputs drawn, the backend called, the oracle and floor evaluated, each component's
figures and contracts recorded. Records figures and outcomes, never a verdict.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
