"""Raw CUDA backends: .cu kernels compiled with nvcc (harness/cuda_build.py) and loaded with ctypes."""
