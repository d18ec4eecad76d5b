"""Attention kernels: Triton for CUDA, a PyTorch reference for CPU and as the tests' oracle."""
