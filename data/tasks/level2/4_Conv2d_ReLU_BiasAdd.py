"""Conv2d (3x3, padding 1), ReLU, then add a learned per-channel bias of shape (C_out, 1, 1)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bias = nn.Parameter(0.1 * torch.randn(out_channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) + self.bias


batch_size = 32
in_channels = 128
out_channels = 128
height = 64
width = 64
kernel_size = 3

ASSAY_SIZES = {"small": {"batch_size": 2, "in_channels": 8, "out_channels": 8,
                         "height": 16, "width": 13},
               "medium": {"batch_size": 4, "in_channels": 16, "out_channels": 16,
                          "height": 32, "width": 32}}


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
