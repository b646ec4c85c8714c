"""LayerNorm over the last dim (nn.LayerNorm(dim), eps 1e-5, learned weight and bias) of (batch_size, dim)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch_size = 4096
dim = 16384

ASSAY_SIZES = {"small": {"batch_size": 8, "dim": 1000},
               "medium": {"batch_size": 1024, "dim": 4096}}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
