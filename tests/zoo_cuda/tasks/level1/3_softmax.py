"""Softmax over the last dim of a (rows, cols) matrix."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


rows, cols = 1024, 4096


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
