"""Failure, not an exploit: an allocation far beyond the sandbox's memory limit."""
TASK = "level1/1_gelu"
EXPECT = ["runs"]
ALSO = ["crash"]
KIND = "failure"
CONFIG = {"memory_gb": 6}

import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        scratch = torch.ones(64 << 30, dtype=torch.uint8)
        return x + scratch[0]
