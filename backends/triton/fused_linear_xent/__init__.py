"""Triton backends of fused_linear_xent: fast (6NHV, float32 [V, H] buffer) and lean (8NHV)."""
