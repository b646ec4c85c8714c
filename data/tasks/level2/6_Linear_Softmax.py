"""Linear layer then softmax over the output features: y = softmax(x W^T + b, dim=-1)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x), dim=-1)


batch_size = 4096
in_features = 4096
out_features = 8192

ASSAY_SIZES = {"small": {"batch_size": 32, "in_features": 96, "out_features": 1000},
               "medium": {"batch_size": 128, "in_features": 256, "out_features": 1000}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
