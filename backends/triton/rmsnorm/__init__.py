"""Triton backend of rmsnorm (docs/specs/rmsnorm.md, docs/kernels/triton-rmsnorm.md)."""
