"""Honest under the permissive policy: GELU composed from library ops (erf, mul, add), not the
reference's own gelu op; library time is reported as library_time_frac."""
TASK = "level1/1_gelu"
EXPECT = []
POLICY = "permissive"

import math

import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
