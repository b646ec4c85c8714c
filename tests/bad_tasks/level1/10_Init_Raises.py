import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        if features > 4:
            raise ValueError(f"features must be at most 4, got {features}")
        self.linear = nn.Linear(features, features)

    def forward(self, x):
        return self.linear(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return [8]
