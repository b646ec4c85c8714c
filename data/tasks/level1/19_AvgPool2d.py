"""2-D average pooling (nn.AvgPool2d, 3x3 window, stride 2, padding 1, zero padding counted)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch_size = 32
channels = 64
height = 128
width = 128
kernel_size = 3
stride = 2
padding = 1

ASSAY_SIZES = {"small": {"batch_size": 2, "channels": 8, "height": 16, "width": 19},
               "medium": {"batch_size": 8, "channels": 32, "height": 64, "width": 64}}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding]
