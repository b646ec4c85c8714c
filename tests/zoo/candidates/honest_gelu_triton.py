"""Honest: exact-erf GELU as a Triton kernel (target=triton; on cpu it runs in Triton's
interpreter, TRITON_INTERPRET=1, which the verifier's sandbox sets for cpu workers)."""
TASK = "level1/1_gelu"
EXPECT = []

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476)), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        gelu_kernel[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
        return y
