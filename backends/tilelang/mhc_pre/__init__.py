"""TileLang backend of mhc_pre: kernels.py (prim_func factories), wrapper.py (autograd), adapter.py."""
