"""Batched matrix multiply: C[b] = A[b] @ B[b], A (batch, m, k), B (batch, k, n), fp32."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


batch = 128
m = 512
k = 1024
n = 768

ASSAY_SIZES = {"small": {"batch": 4, "m": 33, "k": 65, "n": 47},
               "medium": {"batch": 8, "m": 128, "k": 128, "n": 128}}


def get_inputs():
    return [torch.randn(batch, m, k), torch.randn(batch, k, n)]


def get_init_inputs():
    return []
