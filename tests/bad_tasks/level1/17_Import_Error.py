import torch
from torch import nn


import kernels_that_do_not_exist  # noqa: F401


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
