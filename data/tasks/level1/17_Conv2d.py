"""2-D convolution (nn.Conv2d, 3x3, stride 1, padding 1, with bias) over an NCHW fp32 batch."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 32
in_channels = 128
out_channels = 256
height = 64
width = 64
kernel_size = 3
padding = 1

ASSAY_SIZES = {"small": {"batch_size": 2, "in_channels": 8, "out_channels": 12,
                         "height": 17, "width": 15},
               "medium": {"batch_size": 4, "in_channels": 16, "out_channels": 32,
                          "height": 32, "width": 32}}


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding]
