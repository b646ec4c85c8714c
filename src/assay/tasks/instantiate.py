"""Build a task's model and inputs from explicit seeds, on a chosen device.

Both the harness (reference) and the candidate's worker build models through here, so the
same seed gives the same weights on both sides. Parameters that default init leaves constant
(norm weights of ones, zero biases) are randomized: a kernel that ignores them must not pass.
"""

from __future__ import annotations

import contextlib
import math
import re
import secrets
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn



class Distribution(NamedTuple):
    """How a set's floating inputs are drawn from the task's own: x * scale + offset * rms(x),
    then, with ``off_grid``, moved off the narrow float types' grids (:func:`off_grid`)."""

    scale: float
    offset: float = 0.0
    off_grid: bool = False


# Positive scales and offsets keep the task's domain (a task drawing torch.rand for a log stays
# positive). "large" is also off the grids: every default protocol, the lightest included, has
# a set where a kernel that rounds its inputs to bf16/fp16/tf32 shows, however long the mean it
# takes. "offset" (opt-in: verify.input_distributions) is data with a common level 16x its
# spread, where a long mean of bf16-rounded inputs keeps only a few bits of the variation; it is
# not a default because honest fp32 kernels lose the offset's square too (a LayerNorm whose
# variance is sum of squares minus squared sum, summed in blocks of 32 as GPU threads do, was
# 5e-5 off in relative L2 against torch's 7e-7).
DISTRIBUTIONS = {"native": Distribution(1.0), "large": Distribution(8.0, off_grid=True),
                 "small": Distribution(0.125), "offset": Distribution(1.0, 16.0),
                 "grid": Distribution(1.0, off_grid=True)}
_OFF_GRID_CHUNK = 1 << 24  # elements a step: the temporaries stay a few 64 MB blocks


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's global RNG (tasks sample with it) and restore it afterwards."""
    state = torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def set_fp32_numerics(allow_tf32: bool) -> None:
    """fp32 matmuls and convolutions in true fp32 unless ``allow_tf32``. Set alike wherever a
    task's code runs: the reference, the baselines and the worker before the candidate loads
    (torch's own default lets cuDNN use TF32, which would hold the candidate and the baselines
    to different arithmetic)."""
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")


class NotAList(TypeError):
    """``get_inputs()`` or ``get_init_inputs()`` returned something other than a list or a
    tuple (the task's fault, told apart from a TypeError its own code raises)."""


def value_list(values: Any, what: str) -> list:
    """``values`` as a list, or :class:`NotAList` naming ``what`` returned it."""
    if not isinstance(values, (list, tuple)):
        raise NotAList(f"{what} returned a {type(values).__name__}, expected a list")
    return list(values)


def init_inputs(module: Any) -> list:
    return value_list(module.get_init_inputs(), "get_init_inputs()")


def build_model(cls: type, module: Any, seed: int, device: str | torch.device) -> nn.Module:
    """Construct ``cls(*get_init_inputs())`` under ``seed``, move it to ``device`` and put it in
    the mode tasks run in (:func:`task_mode`)."""
    with seeded(seed):
        model = cls(*init_inputs(module))
    if not isinstance(model, nn.Module):
        raise TypeError(f"{cls.__name__}(...) is not an nn.Module")
    return task_mode(model.to(device))


# Tasks whose results depend on the mode their norms run in (by their source's text: a cache
# key takes TASK_MODE for them, assay.bench.baseline_cache), and that mode's version
MODE_DEPENDENT = re.compile(r"BatchNorm|InstanceNorm|batch_norm|instance_norm")
TASK_MODE = "norms as constructed (training: batch statistics), the rest eval"


def task_mode(model: nn.Module) -> nn.Module:
    """The mode every task's model runs in, the reference's and the candidate's alike:
    KernelBench's, without its randomness. KernelBench never calls ``.eval()``, so its
    BatchNorm (and InstanceNorm with running statistics) normalize with the batch's own
    statistics: those modules keep the mode their constructor left them in (training, unless
    the task's ``__init__`` asks for eval mode). Every other module is in eval mode: dropout of
    any kind (and a recurrent layer's between its layers) is identity, since a random output
    can be checked against nothing. In eval mode with their default running statistics,
    KernelBench's CNNs answer a new input with an output 1e-7 of its size away (a constant);
    in training mode, 15-27% (ResNet18, EfficientNetB0, MobileNetV1, on the CPU)."""
    for m in model.modules():
        if not isinstance(m, nn.modules.batchnorm._NormBase):
            m.training = False  # (this module alone: .eval() would reach the norms below it)
    return model


def randomize_constant_parameters(model: nn.Module, seed: int) -> list[str]:
    """Give every floating parameter or buffer that is constant at init a random value.

    Returns the names changed. Running statistics of batch norm are kept positive.
    """
    gen = torch.Generator().manual_seed(seed)
    changed = []
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point() or t.numel() == 0:
                continue
            flat = t.detach().flatten()
            # A lone scalar is "constant" only when it is a round default (0 or 1).
            constant = bool((flat == flat[0]).all()) if t.numel() > 1 else float(flat[0]) in (0.0, 1.0)
            if not constant:
                continue
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
            base = float(flat[0])
            if name.endswith("running_var"):
                value = 0.5 + noise.abs()
            else:
                value = base + (0.5 if base == 0.0 else 0.25 * abs(base)) * noise
            t.copy_(value.to(t.dtype))
            changed.append(name)
    return changed


def reference_model(module: Any, seed: int, device: str | torch.device) -> nn.Module:
    model = build_model(module.Model, module, seed, device)
    randomize_constant_parameters(model, seed + 1)
    return model


def make_inputs(module: Any, seed: int, device: str | torch.device,
                distribution: str = "native") -> list:
    """Call the task's ``get_inputs()`` under ``seed``; scale and shift floating tensors
    (:data:`DISTRIBUTIONS`); move them.

    On a GPU the task's sampling runs there (``torch.device`` as the default for the factories
    it calls): KernelBench's largest inputs are GiBs, which the CPU took tens of seconds to draw
    and copy, for every set and every record. The values are then the device generator's, as
    deterministic under the seed as the CPU's but not the same numbers. A ``get_inputs`` that
    cannot run there (numpy, an explicit CPU tensor mixed in) is sampled on the CPU."""
    values = None
    if torch.device(device).type == "cuda":
        try:
            with seeded(seed), torch.device(device):
                values = module.get_inputs()
        except torch.cuda.OutOfMemoryError:
            raise  # no room on the device: drawing on the CPU would not fit it there either
        except (RuntimeError, TypeError):
            values = None
    if values is None:
        with seeded(seed):
            values = module.get_inputs()
    values = value_list(values, "get_inputs()")
    scale, offset, moved = DISTRIBUTIONS[distribution]
    out = []
    for i, v in enumerate(values):
        values[i] = None  # each step's input freed as its result is made: two copies at most
        if isinstance(v, torch.Tensor):
            if v.is_floating_point() and scale != 1.0:
                v = v * scale
            if v.is_floating_point() and offset and v.numel():
                rms = _rms(v)
                v = v + offset * (rms if math.isfinite(rms) and rms > 0 else 1.0)
            if moved:
                v = off_grid(v)
            v = v.to(device)
        out.append(v)
    return out


def _rms(v: torch.Tensor) -> float:
    """The root mean square of ``v``, accumulated in float64 a chunk at a time: whole,
    ``vector_norm(dtype=float64)`` casts the input to float64 first, a copy twice its size
    (a 16 GiB KernelBench input drew at three times its size on an H200)."""
    flat = v.reshape(-1) if v.is_contiguous() else v.flatten()
    sq = sum(float(torch.linalg.vector_norm(flat[i:i + _OFF_GRID_CHUNK], dtype=torch.float64)) ** 2
             for i in range(0, flat.numel(), _OFF_GRID_CHUNK))
    return math.sqrt(sq / flat.numel())


def off_grid(x: torch.Tensor) -> torch.Tensor:
    """A float32 tensor's values moved to 7/16 of a float16 ulp beyond their nearest bfloat16
    value, away from zero (other dtypes unchanged). The data keeps its distribution (each value
    moves by under 0.45% of itself), but rounding it to bfloat16, float16 or TF32 (to nearest or
    toward zero) now shrinks every element by 2^-12 to 2^-11 of itself, all the same way. Such
    errors do not average out of a long mean as random rounding errors do: a loss computed from
    bf16-rounded inputs is 6e-4 off on this data (fp32's tolerance is 1e-4), and exact on the
    task's own data up to 4e-6. An fp32 kernel computes on it as on any other data."""
    if x.dtype != torch.float32 or not x.numel():
        return x

    def move(v: torch.Tensor) -> torch.Tensor:
        b = v.to(torch.bfloat16).to(torch.float32)  # 8 significant bits
        _, e = torch.frexp(b)  # |b| in [2^(e-1), 2^e): float16's ulp there is 2^(e-11)
        step = torch.exp2(e.to(torch.float32) - 11.0).mul_(7.0 / 16.0)
        return b.add_(step.mul_(torch.sign(b)))  # exact: 15 significant bits

    if not x.is_contiguous():
        return move(x)  # elementwise ops keep the input's layout
    out = torch.empty_like(x)
    src, dst = x.view(-1), out.view(-1)
    for i in range(0, src.numel(), _OFF_GRID_CHUNK):
        dst[i:i + _OFF_GRID_CHUNK] = move(src[i:i + _OFF_GRID_CHUNK])
    return out


_LANES = 64  # words per row of the digest's grid


def digest(x: Any) -> tuple[int, int] | None:
    """Two exact sums of a tensor's bits as 64-bit words laid out in rows of 64: every word
    (plain), and the row sums and the column sums each weighted by their place. Integer sums
    wrap the same way in any order, so the digest of the same bits is the same on any device
    and any reduction order; changing a word changes the first, moving one to another row or
    column the second. Two reductions over the data, no copy of it (a 64 MB set in 60 ms on
    one core of the CPU machine, where int64 copies of it took 590). None for a non-tensor."""
    if not isinstance(x, torch.Tensor):
        return None
    raw = x.detach().contiguous().reshape(-1).view(torch.uint8) if x.numel() else \
        torch.empty(0, dtype=torch.uint8, device=x.device)
    if raw.storage_offset() % 8:
        raw = raw.clone()  # (a view at an odd byte: int64 words need 8-byte alignment)
    k = raw.numel() // 8 * 8
    words, tail = raw[:k].view(torch.int64), raw[k:].to(torch.int64)
    m = words.numel() // _LANES * _LANES
    grid, rest = words[:m].view(-1, _LANES), words[m:]

    def place(v: torch.Tensor) -> torch.Tensor:  # 1, 2, 3, ... along v
        return torch.arange(1, v.numel() + 1, dtype=torch.int64, device=v.device)

    rows, cols = grid.sum(1), grid.sum(0)
    plain = rows.sum() + rest.sum() + tail.sum()
    weighted = ((rows * place(rows)).sum() + (cols * place(cols)).sum() * 1_000_003
                + (rest * place(rest)).sum() * 7 + (tail * place(tail)).sum() * 11)
    return int(plain), int(weighted)


def draws_alike(module: Any, device: str | torch.device) -> bool:
    """Whether the task's inputs drawn twice under one seed are the same bits (what the
    transfer ``draw`` relies on: a ``get_inputs`` reading the clock or an unseeded generator
    does not), one set at a time."""
    seed = secrets.randbits(31)
    first = [digest(x) for x in make_inputs(module, seed, device)]
    return first == [digest(x) for x in make_inputs(module, seed, device)]


class InputsDiffer(RuntimeError):
    """A set drawn again from its seed is not the set the harness drew (a ``get_inputs`` that
    is not deterministic under its seed, or one changed since)."""


class DrawnSets(Sequence):
    """Input sets drawn from their seeds whenever asked for, never kept: ``sets[s]`` is a fresh
    list of set ``s``'s inputs on ``device`` (the transfer ``draw``: the harness and the worker
    each draw what they need where they need it, and no set is copied between them or held
    whole). With ``digests`` (the harness's :func:`digest` of each input when it first drew
    the set) every draw is checked against them: :class:`InputsDiffer` if one differs."""

    def __init__(self, module: Any, seeds: list[int], distributions: list[str],
                 device: str | torch.device, digests: list[list] | None = None):
        self.module, self.seeds, self.distributions = module, list(seeds), list(distributions)
        self.device, self.digests = device, digests
        # Bound now: whoever later patches this module's functions does not change the draws.
        self._make, self._digest = make_inputs, digest

    def __len__(self) -> int:
        return len(self.seeds)

    def __getitem__(self, s: int) -> list:
        if not 0 <= s < len(self.seeds):
            raise IndexError(s)  # (also where iteration ends)
        xs = self._make(self.module, self.seeds[s], self.device, self.distributions[s])
        if self.digests is not None:
            got = [self._digest(x) for x in xs]
            want = [tuple(d) if d is not None else None for d in self.digests[s]]
            if got != want:
                bad = [j for j, (a, b) in enumerate(zip(got, want)) if a != b] or ["count"]
                raise InputsDiffer(f"input set {s} drawn again from its seed differs from the "
                                   f"harness's at input(s) {bad} (get_inputs() not "
                                   f"deterministic under its seed on this device, or changed "
                                   f"since the harness drew it)")
        return xs


def as_outputs(value: Any) -> list[torch.Tensor]:
    """A forward's result as a flat list of tensors (a task may return a tensor or a tuple)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    raise TypeError(f"forward returned {type(value).__name__}, expected a tensor or a tuple "
                    f"of tensors")
