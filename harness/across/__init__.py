"""One run against another: --compare with a reference run, and repro bundles of single cells.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
