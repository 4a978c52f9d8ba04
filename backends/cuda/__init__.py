"""Raw CUDA backends: .cu kernels compiled with nvcc (harness/tools/cuda_build.py) and loaded with ctypes."""
