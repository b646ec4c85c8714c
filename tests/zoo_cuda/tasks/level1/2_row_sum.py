"""Row reduction: the sum of each row of a (rows, 16384) matrix (a long fp32 reduction)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)


rows, cols = 512, 16384


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
