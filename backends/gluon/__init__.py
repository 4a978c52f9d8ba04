"""Gluon backends: Triton's lower-level dialect (explicit layouts, shared memory, TMA, mbarriers) for sm_90."""
