"""Conv2d (3x3, padding 1), GroupNorm (num_groups groups, affine), then tanh."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.norm(self.conv(x)))


batch_size = 32
in_channels = 64
out_channels = 128
height = 64
width = 64
kernel_size = 3
num_groups = 8

ASSAY_SIZES = {"small": {"batch_size": 2, "in_channels": 3, "out_channels": 12,
                         "height": 15, "width": 17, "num_groups": 4},
               "medium": {"batch_size": 4, "in_channels": 3, "out_channels": 16,
                          "height": 32, "width": 32, "num_groups": 4}}


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
