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
  F.normalize, GroupNorm (rows of channel groups), InstanceNorm, matrix-vector products;
  BatchNorm (and InstanceNorm with running statistics) in eval mode, as the verifier runs
  tasks: a per-channel affine of the elementwise chain;
* reductions over a block of dims that does not end at the last (sum, mean, max, min, prod,
  argmax/argmin with int64 output), normalizations that broadcast them back (RMSNorm over
  channels), and scans along any dim (cumsum, cumprod, flip-cumsum-flip, of ``x * mask`` with
  a bool mask): the axis family;
* one matrix product (torch.matmul/mm/bmm, F.linear/nn.Linear) or convolution (1-, 2- or
  3-D, transposed or not) of inputs and parameters, followed by any chain of the above (bias,
  activation, scaling, residual, softmax, norms, sums): the epilogue. Forms told apart by
  the knob ``lib``: a tiled GEMM of its own (0: fp32 register-blocked SIMT, or WMMA tensor
  cores for float16/bfloat16; C++ on the cpu target) or a convolution of its own (2: an
  implicit GEMM on cuda, with a direct kernel for depthwise ones; a direct convolution in C++;
  float32, every stride/padding/dilation/groups/output_padding) with the elementwise epilogue
  fused into its stores or followed by the row kernel (verifiable under the strict policy, a
  lone convolution included); or the library's GEMM/convolution followed by one fused epilogue
  kernel (1: the candidate says ``POLICY = "permissive"``: the strict kernel audit refuses it,
  as it should). No TF32: the bundled tasks are float32 and the verifier's precision check
  would refuse it.

A task that one kernel cannot fuse (a second product or convolution, a pooling after one, a
reduction of a reduced value, an elementwise prologue before a product, a view between two
layers) is cut into stages (``stages``): a multi-kernel plan whose kernels ModelNew.forward runs
in order, each written by its family with knobs of its own (every MLP and CNN of KernelBench's
level 3 that uses only the ops above). Everything else is declined with a reason.

Modules: ``ir`` (the plans), ``graph`` (a traced task lowered into one plan), ``own_kernels``
(joins, strided views and RNNs: kernels of their own), ``stages`` (multi-kernel plans),
``analysis`` (a task's plan: one kernel or several), ``families`` (one
module per kernel family: its matcher, knob spaces, code and templates, and the table of them;
``pipeline`` writes multi-kernel plans), ``candidate`` (the file around a family's kernel),
``synthesizer`` (the Proposer).
"""

from assay.propose.offline.analysis import analyze_task
from assay.propose.offline.families import KNOB_SPACES
from assay.propose.offline.ir import Analysis, Plan, Unsupported
from assay.propose.offline.synthesizer import OfflineSynthesizer

__all__ = ["KNOB_SPACES", "Analysis", "OfflineSynthesizer", "Plan", "Unsupported",
           "analyze_task"]
