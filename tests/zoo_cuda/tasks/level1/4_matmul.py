"""Matrix product C = A @ B with sizes that are not multiples of a 32 tile (1000 x 1000 x 1000):
long enough on a GPU (~0.5 ms for a plain tiled kernel) that work hidden from the timer shows."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


M, K, N = 1000, 1000, 1000


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
