"""Linear layer then ReLU: y = relu(x @ W^T + b), x (batch_size, in_features)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


batch_size = 4096
in_features = 4096
out_features = 4096

ASSAY_SIZES = {"small": {"batch_size": 64, "in_features": 128, "out_features": 96},
               "medium": {"batch_size": 256, "in_features": 512, "out_features": 256}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
