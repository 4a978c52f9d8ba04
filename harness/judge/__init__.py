"""Figures turned into verdicts: the pinned rule (verdict.py), a cell's judgement under the backend's
declarations, hints and sweep-level causes. The only place PASS, FAIL and SHAPE are decided.

A layer of harness/ (docs/design.md, "Layers"): it imports only the layers below it."""
