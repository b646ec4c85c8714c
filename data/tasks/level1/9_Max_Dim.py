"""Max over the last dim of a (batch_size, dim) matrix, values only: out[i] = max_j x[i, j]."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, reduce_dim: int):
        super().__init__()
        self.reduce_dim = reduce_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=self.reduce_dim)[0]


batch_size = 4096
dim = 16384
reduce_dim = -1

ASSAY_SIZES = {"small": {"batch_size": 8, "dim": 1001},
               "medium": {"batch_size": 1024, "dim": 4096}}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [reduce_dim]
