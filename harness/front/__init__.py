"""The doors a user walks through: the harness command, harness check and repro, the pytest plugin.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
