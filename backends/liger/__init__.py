"""Liger-Kernel's Triton kernels as backends named ``liger`` (docs/kernels/liger.md), registered only where the
package is installed (``pip install ".[liger]"``, or a release on PYTHONPATH); without it nothing here imports it.
"""
