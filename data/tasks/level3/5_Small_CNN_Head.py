"""Small CNN classifier: (conv3x3 -> ReLU -> maxpool2) x 2, flatten, Linear to num_classes logits."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, height: int, width: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(64 * (height // 4) * (width // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


batch_size = 64
in_channels = 3
height = 128
width = 128
num_classes = 1000

ASSAY_SIZES = {"small": {"batch_size": 2, "height": 18, "width": 14, "num_classes": 10}}


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, height, width, num_classes]
