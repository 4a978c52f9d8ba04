"""Triton backend of mhc_pre (docs/specs/mhc_pre.md)."""
