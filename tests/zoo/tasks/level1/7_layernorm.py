"""LayerNorm over the last dimension of wide rows, affine (the harness randomizes the weight and
bias that default init leaves at ones and zeros)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


rows, features = 64, 8192


def get_inputs():
    return [torch.randn(rows, features)]


def get_init_inputs():
    return [features]
