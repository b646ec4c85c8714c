"""Linear, residual add of the input, then LayerNorm over features: y = LN(x + (x W^T + b))."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.linear(x))


batch_size = 4096
features = 4096

ASSAY_SIZES = {"small": {"batch_size": 40, "features": 200},
               "medium": {"batch_size": 256, "features": 512}}


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
