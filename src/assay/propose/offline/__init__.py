"""The offline synthesizer: a small kernel generator that needs no LLM.

It traces a task with torch.fx, recognizes what its templates can express and writes complete
candidate files (C++/OpenMP for the cpu target, CUDA for the cuda target):

* fused elementwise chains over same-shape float32 tensors, with scalars, constants and
  broadcast parameters (a bias along the last dim): arithmetic, relu, leaky_relu, sigmoid,
  tanh, exp, log, abs, sqrt, rsqrt, gelu (erf and tanh), silu, mish, elu, selu, softplus,
  hardtanh/clamp, hardsigmoid, hardswish, pow by a constant, minimum/maximum, ...;
* row reductions over the trailing dims of a contiguous tensor, after an optional
  elementwise chain: sum, mean, max, min (keepdim or not), norms, logsumexp, softmax,
  log_softmax, layer_norm (weight and bias read from the module at run time), RMSNorm,
  F.normalize, GroupNorm (rows of channel groups), matrix-vector products;
* reductions over a block of dims that does not end at the last (sum, mean, max, min, prod,
  argmax/argmin with int64 output), normalizations that broadcast them back (RMSNorm over
  channels), and scans along any dim (cumsum, cumprod, flip-cumsum-flip, of ``x * mask`` with
  a bool mask): the axis family;
* one matrix product (torch.matmul/mm/bmm, F.linear/nn.Linear) or convolution
  (F.conv2d/nn.Conv2d) of inputs and parameters, followed by any chain of the above (bias,
  activation, scaling, residual, softmax, norms, sums): the epilogue. Two forms, told apart
  by the knob ``lib``: a tiled GEMM of its own (fp32 register-blocked SIMT, or WMMA tensor
  cores for float16/bfloat16; C++ on the cpu target) with the elementwise epilogue fused into
  its stores or followed by the row kernel (verifiable under the strict policy); or the
  library's GEMM/convolution followed by one fused epilogue kernel (the candidate says
  ``POLICY = "permissive"``: the strict kernel audit refuses it, as it should). No TF32: the
  bundled tasks are float32 and the verifier's precision check would refuse it.

Everything else is declined with a reason. Modules: ``graph`` (what pattern is this),
``families`` (one module per kernel family: its matcher, knob spaces, code and templates, and
the table of them), ``candidate`` (the file around a family's kernel), ``synthesizer`` (the
Proposer).
"""

from assay.propose.offline.graph import Analysis, Plan, Unsupported, analyze_task
from assay.propose.offline.families import KNOB_SPACES
from assay.propose.offline.synthesizer import OfflineSynthesizer

__all__ = ["KNOB_SPACES", "Analysis", "OfflineSynthesizer", "Plan", "Unsupported",
           "analyze_task"]
