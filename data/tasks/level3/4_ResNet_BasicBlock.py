"""ResNet basic block (eval-mode BatchNorm): relu(bn2(conv2(relu(bn1(conv1(x))))) + x), 3x3 convs, no bias."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.eval()  # eval-mode BatchNorm: its running statistics (tasks keep their norms' mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + x)


batch_size = 32
channels = 128
height = 64
width = 64

ASSAY_SIZES = {"small": {"batch_size": 2, "channels": 8, "height": 15, "width": 13}}


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
