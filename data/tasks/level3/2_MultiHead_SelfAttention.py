"""Multi-head self-attention written out: q/k/v projections, softmax(q k^T / sqrt(d)) v per head, output projection.

Input and output are (batch_size, seq_len, embed_dim); no mask, no dropout.
"""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        assert embed_dim % num_heads == 0
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, e = x.shape
        h, d = self.num_heads, self.head_dim
        q = self.q_proj(x).view(b, s, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, h, d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, h, d).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        attn = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, e)
        return self.out_proj(ctx)


batch_size = 4
seq_len = 1024
embed_dim = 1024
num_heads = 16

ASSAY_SIZES = {"small": {"batch_size": 2, "seq_len": 17, "embed_dim": 48, "num_heads": 4}}


def get_inputs():
    return [torch.randn(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads]
