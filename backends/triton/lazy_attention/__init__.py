"""Triton backend of lazy_attention (specs/lazy_attention.md)."""
