"""ReLU: y = max(x, 0), elementwise over a (batch_size, dim) fp32 matrix."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 4096
dim = 16384

ASSAY_SIZES = {"small": {"batch_size": 8, "dim": 1000},
               "medium": {"batch_size": 1024, "dim": 4096}}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
