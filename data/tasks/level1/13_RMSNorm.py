"""RMSNorm over the last dim, written out: y = x * rsqrt(mean(x^2, -1) + eps) * weight."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv_rms = torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x * inv_rms * self.weight


batch_size = 4096
dim = 16384
eps = 1e-6

ASSAY_SIZES = {"small": {"batch_size": 8, "dim": 777},
               "medium": {"batch_size": 1024, "dim": 4096}}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, eps]
