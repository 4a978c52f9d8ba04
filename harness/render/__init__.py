"""Every word of a report: the markdown and JSON reports, heatmaps, and the terminal's tables.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
