"""The 2025 incident's task (KernelBench level 1, "matmul for lower triangular matrices"):
C = tril(A @ B) for lower-triangular A and B. Each matrix is 16 MB, so the CUDA caching
allocator gives every one a segment of its own and hands a freed one back whole."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.tril(torch.matmul(A, B))


N = 2048


def get_inputs():
    return [torch.tril(torch.randn(N, N)), torch.tril(torch.randn(N, N))]


def get_init_inputs():
    return []
