"""Matrix-vector product: y = A @ x with A (m, k) and x a (k, 1) column; output (m, 1)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, x)


m = 8192
k = 16384

ASSAY_SIZES = {"small": {"m": 100, "k": 777},
               "medium": {"m": 1024, "k": 4096}}


def get_inputs():
    return [torch.randn(m, k), torch.randn(k, 1)]


def get_init_inputs():
    return []
