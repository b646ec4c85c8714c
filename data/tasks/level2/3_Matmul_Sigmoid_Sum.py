"""Matmul with a weight, sigmoid, then sum over the features: out[i] = sum_j sigmoid(x @ W)[i, j]."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.matmul(x, self.weight)).sum(dim=1)


batch_size = 4096
in_features = 4096
out_features = 4096

ASSAY_SIZES = {"small": {"batch_size": 50, "in_features": 128, "out_features": 99},
               "medium": {"batch_size": 256, "in_features": 512, "out_features": 256}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
