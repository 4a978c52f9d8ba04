"""Records at rest: the JSONL report store, its folder lock, atomic writes, and where a run came from.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
