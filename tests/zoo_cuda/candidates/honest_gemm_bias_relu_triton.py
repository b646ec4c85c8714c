"""Honest (cuda, compiled): Linear + ReLU as one Triton kernel, a tile of the output per program: tl.dot over K
slabs in IEEE float32 (input_precision="ieee": Triton's default on float32 is TF32), bias and
ReLU fused into the store. Its name says "gemm", as cuBLAS's do: on cuda the audit counts it as
the candidate's own because this file defines it (policy.is_library)."""
TASK = "level2/1_gemm_bias_relu"
EXPECT = []

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def fused_gemm_bias_relu(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        # W is (N, K): its transpose's tile, read in place
        b = tl.load(w_ptr + rn[None, :] * K + rk[:, None],
                    mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], tl.where(acc < 0.0, 0.0, acc),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = x.contiguous()
        w, b = self.linear.weight.contiguous(), self.linear.bias.contiguous()
        M, K = x.shape
        N = w.shape[0]
        y = torch.empty(M, N, dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
        fused_gemm_bias_relu[grid](x, w, b, y, M, N, K, BM=64, BN=64, BK=32)
        return y
