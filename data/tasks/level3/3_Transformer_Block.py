"""Pre-norm transformer block: x + MHSA(LN(x)), then + MLP(LN(.)) with a GELU MLP of width mlp_ratio * embed_dim.

Attention is written out (no mask, no dropout); input and output are (batch_size, seq_len, embed_dim).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        assert embed_dim % num_heads == 0
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.norm1 = nn.LayerNorm(embed_dim)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.norm2 = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, mlp_ratio * embed_dim)
        self.fc2 = nn.Linear(mlp_ratio * embed_dim, embed_dim)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, e = x.shape
        h, d = self.num_heads, self.head_dim
        q, k, v = self.qkv(x).view(b, s, 3, h, d).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(ctx.transpose(1, 2).reshape(b, s, e))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


batch_size = 4
seq_len = 1024
embed_dim = 1024
num_heads = 16
mlp_ratio = 4

ASSAY_SIZES = {"small": {"batch_size": 2, "seq_len": 19, "embed_dim": 48, "num_heads": 4}}


def get_inputs():
    return [torch.randn(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads, mlp_ratio]
