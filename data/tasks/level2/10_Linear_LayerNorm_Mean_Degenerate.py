"""DEGENERATE ON PURPOSE: Linear, LayerNorm over the features (bias only), then mean over those features.

The normalized values have zero mean over the features, so out[i] == mean(ln_bias) for every row
whatever the input: the degeneracy analysis must flag this task (constant, input-independent output).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        # No per-feature scale (a scale would make the mean input-dependent); only a shift.
        self.norm = nn.LayerNorm(out_features, elementwise_affine=False)
        self.ln_bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.linear(x)) + self.ln_bias
        return y.mean(dim=-1)


batch_size = 4096
in_features = 4096
out_features = 4096

ASSAY_SIZES = {"small": {"batch_size": 32, "in_features": 100, "out_features": 64},
               "medium": {"batch_size": 256, "in_features": 512, "out_features": 256}}


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
