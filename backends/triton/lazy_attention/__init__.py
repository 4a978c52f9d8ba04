"""Triton backend of lazy_attention (docs/specs/lazy_attention.md)."""
