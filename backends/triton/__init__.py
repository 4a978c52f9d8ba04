"""Triton backends."""
