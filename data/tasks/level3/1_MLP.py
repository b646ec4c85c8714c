"""Three-layer MLP: Linear -> ReLU -> Linear -> ReLU -> Linear over a (batch_size, in_features) batch."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, hidden1: int, hidden2: int, out_features: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden1),
            nn.ReLU(),
            nn.Linear(hidden1, hidden2),
            nn.ReLU(),
            nn.Linear(hidden2, out_features),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


batch_size = 4096
in_features = 4096
hidden1 = 8192
hidden2 = 4096
out_features = 1024

ASSAY_SIZES = {"small": {"batch_size": 8, "in_features": 100, "hidden1": 128,
                         "hidden2": 64, "out_features": 10}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden1, hidden2, out_features]
