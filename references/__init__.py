"""Golden PyTorch references, one module per operator (the math of the specs, dtype-generic)."""
