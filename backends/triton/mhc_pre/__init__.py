"""Triton backend of mhc_pre (specs/mhc_pre.md)."""
