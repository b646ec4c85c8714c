"""Square matrix multiply: C = A @ B with A, B both (n, n) fp32."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


n = 4096

ASSAY_SIZES = {"small": {"n": 100},
               "medium": {"n": 256}}


def get_inputs():
    return [torch.randn(n, n), torch.randn(n, n)]


def get_init_inputs():
    return []
