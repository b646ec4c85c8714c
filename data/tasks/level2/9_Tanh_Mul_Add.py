"""Two-input elementwise chain: out = tanh(x) * x + y, x and y both (batch_size, dim)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * x + y


batch_size = 4096
dim = 16384

ASSAY_SIZES = {"small": {"batch_size": 8, "dim": 777},
               "medium": {"batch_size": 1024, "dim": 4096}}


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
