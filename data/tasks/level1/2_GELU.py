"""GELU, exact erf form: y = 0.5 * x * (1 + erf(x / sqrt(2))), elementwise over (batch_size, dim).

Not the tanh approximation (nn.GELU(approximate="none")).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gelu = nn.GELU(approximate="none")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gelu(x)


batch_size = 4096
dim = 16384

ASSAY_SIZES = {"small": {"batch_size": 16, "dim": 777},
               "medium": {"batch_size": 1024, "dim": 4096}}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
