"""DEGENERATE on purpose: LayerNorm without affine, then the mean over the normalized dim, plus a
bias. The normalized rows have mean 0, so the output is the bias whatever the input: a constant
"kernel" matches it (the 2025 incident's degenerate tasks)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x).mean(dim=-1) + self.bias


rows, dim = 64, 1024


def get_inputs():
    return [torch.randn(rows, dim)]


def get_init_inputs():
    return [dim]
