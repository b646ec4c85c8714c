"""Elementwise: exact (erf) GELU of a (rows, cols) matrix."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


rows, cols = 128, 2048


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
