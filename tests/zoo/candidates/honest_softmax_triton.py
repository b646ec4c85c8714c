"""Honest: row softmax as a Triton kernel, one program per row (the whole row in one block:
max, exp, sum, divide), the division rounded as IEEE's (tl.math.div_rn)."""
TASK = "level1/3_softmax"
EXPECT = []

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def softmax_kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.where(mask, tl.exp(x - tl.max(x, axis=0)), 0.0)
    tl.store(y_ptr + row * stride + offs, tl.math.div_rn(e, tl.sum(e, axis=0)), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        rows = x.numel() // cols
        softmax_kernel[(rows,)](x, y, cols, cols, BLOCK=triton.next_power_of_2(cols))
        return y
