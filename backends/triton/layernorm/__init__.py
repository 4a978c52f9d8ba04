"""Triton backend of layernorm (docs/specs/layernorm.md, docs/kernels/triton-layernorm.md)."""
