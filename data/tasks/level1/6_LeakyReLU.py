"""LeakyReLU: y = x if x >= 0 else negative_slope * x, elementwise; the slope is an init arg."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, negative_slope=self.negative_slope)


batch_size = 4096
dim = 16384
negative_slope = 0.05

ASSAY_SIZES = {"small": {"batch_size": 8, "dim": 777},
               "medium": {"batch_size": 1024, "dim": 4096}}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [negative_slope]
