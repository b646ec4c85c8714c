import torch
from torch import nn


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
