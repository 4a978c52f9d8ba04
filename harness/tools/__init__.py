"""Work built on runs: benchmarks, the bug zoo's score, STATUS.md, sweep features, compile helpers.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
