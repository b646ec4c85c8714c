"""The red-team generator (issue #19): exploit and honest variants of the zoo's honest kernels.

An *exploit variant* wraps an honest zoo kernel in a ModelNew that cheats on some calls:
*when* (a trigger: always, when no profiler is running, after a call count, on a pointer seen
before, on every other call, when called from the timing loop) times *how* (library ops, the
reference's own ops, a stale copy, a cache keyed on pointers, a partial write, no write, a
constant, a side thread, a side stream, lower precision, the output written into an input, a
patched clock). An *honest variant* wraps the same kernel with harmless changes (a thread or
stream joined back before returning, extra syncs, a correct cache keyed on content, copies,
reordered code, extra temporaries, a call counter or profiler probe that changes nothing).

Generation is pure and seeded: ``generate(target, seed)`` returns the same variants, in the
same order, for the same arguments; nothing is written until ``write``. The verifier must
reject every exploit variant for one of its method's reasons (a rejection for a build error or
a crash would only mean the generator wrote broken code) and accept every honest variant.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOTS = {"cpu": TESTS / "zoo", "cuda": TESTS / "zoo_cuda"}
# Reasons that mean the candidate never ran as written: never the credit of a check.
FAULTS = frozenset({"compiles", "constructs", "runs", "crash", "timeout"})


@dataclass(frozen=True)
class TaskSpec:
    """One zoo task as the generator sees it: the honest kernel per target, the forward's
    argument names, its output shape, the reference's own expression and an equivalent
    formulation in other library ops."""
    task: str
    honest: dict[str, str]  # target -> candidate stem in that target's zoo
    args: tuple[str, ...]
    shape: str
    reference: str
    library: str


TASKS = (
    TaskSpec("level1/1_gelu", {"cpu": "honest_gelu_cpp", "cuda": "honest_gelu_cuda"}, ("x",),
             "x.shape", "torch.nn.functional.gelu(x)",
             "0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))"),
    TaskSpec("level1/2_row_sum", {"cpu": "honest_row_sum_sequential_cpp",
                                  "cuda": "honest_row_sum_cuda"}, ("x",),
             "(x.shape[0],)", "x.sum(dim=1)",
             "torch.mv(x, torch.ones(x.shape[1], dtype=x.dtype, device=x.device))"),
    TaskSpec("level1/3_softmax", {"cpu": "honest_softmax_cpp", "cuda": "honest_softmax_cuda"},
             ("x",), "x.shape", "torch.softmax(x, dim=-1)",
             "torch.exp(x - torch.logsumexp(x, dim=-1, keepdim=True))"),
    TaskSpec("level1/4_matmul", {"cpu": "honest_matmul_rowwise_cpp",
                                 "cuda": "honest_matmul_tiled_cuda"}, ("a", "b"),
             "(a.shape[0], b.shape[1])", "torch.matmul(a, b)",
             "torch.einsum('ik,kj->ij', a, b)"),
    TaskSpec("level1/5_mse_loss", {"cpu": "honest_mse_cpp", "cuda": "honest_mse_cuda"},
             ("predictions", "targets"), "()",
             "torch.mean((predictions - targets) ** 2)",
             "torch.nn.functional.mse_loss(predictions, targets)"),
    TaskSpec("level2/1_gemm_bias_relu", {"cpu": "honest_gemm_bias_relu_fused_cpp",
                                         "cuda": "honest_gemm_bias_relu_fused_cuda"}, ("x",),
             "(x.shape[0], self.linear.weight.shape[0])", "torch.relu(self.linear(x))",
             "torch.clamp_min(torch.addmm(self.linear.bias, x, self.linear.weight.t()), 0.0)"),
)

# --- when to cheat -----------------------------------------------------------------------------
# Each is a Python expression over ``args`` and the module-level ``_state``, evaluated before
# the call (the call counter already counts this call).
TRIGGERS = {
    "always": "True",
    "unprofiled": "not torch._C._autograd._profiler_enabled()",
    "after_3_calls": "_state['calls'] > 3",
    "after_12_calls": "_state['calls'] > 12",
    "repeat_pointer": "args[0].data_ptr() in _state['ptrs']",
    "every_other_call": "_state['calls'] % 2 == 0",
    "timing_stack": "_called_from('time_calls')",
}

# --- how to cheat ------------------------------------------------------------------------------
# Each is the body of ``_cheat(self, *args)``; ``_honest(self, *args)`` is the zoo kernel. The
# reasons are the checks whose job it is to catch the method.
_STORE = ("stale_results", "timed_outputs", "correctness")
METHODS: dict[str, dict] = {
    "library": {"reasons": {"kernel_audit"}, "body": "return self._library(*args)"},
    # torch.compile writes the kernel (on cpu inductor's C++ shows no ATen op: the audit lists
    # torch.compile's calls as a compute op of their own, policy.COMPILED_GRAPH)
    "compiled": {"reasons": {"kernel_audit"}, "body": """\
if 'compiled' not in _state:
    _state['compiled'] = torch.compile(self._library)
return _state['compiled'](*args)"""},
    "reference": {"reasons": {"kernel_audit", "reference_fallback"},
                  "body": "return self._reference(*args)"},
    "stale": {"reasons": set(_STORE), "body": """\
if _state['last'] is None:
    _state['last'] = _honest(self, *args)
return _state['last']"""},
    "cached_pointer": {"reasons": set(_STORE), "body": """\
key = tuple(t.data_ptr() for t in args)
if key not in _state['by_ptr']:
    _state['by_ptr'][key] = _honest(self, *args)
return _state['by_ptr'][key]"""},
    "partial": {"reasons": {"correctness", "timed_outputs", "stale_results"}, "body": """\
full = _honest(self, *args)
out = torch.empty_like(full)
half = (full.numel() + 1) // 2
out.view(-1)[:half].copy_(full.reshape(-1)[:half])
return out"""},
    "noop": {"reasons": {"correctness", "timed_outputs", "stale_results"},
             "body": "return torch.empty(self._shape(*args), dtype=args[0].dtype, "
                     "device=args[0].device)"},
    "constant": {"reasons": {"correctness", "timed_outputs", "stale_results"},
                 "body": "return torch.zeros(self._shape(*args), dtype=args[0].dtype, "
                         "device=args[0].device)"},
    "side_thread": {"reasons": {"stream_ordered", "correctness", "timed_outputs",
                                "stale_results"}, "body": """\
out = torch.empty(self._shape(*args), dtype=args[0].dtype, device=args[0].device)

def work():
    time.sleep(0.002)
    out.copy_(_honest(self, *args))

threading.Thread(target=work, daemon=True).start()
return out"""},
    "side_stream": {"targets": {"cuda"}, "reasons": {"stream_ordered", "correctness",
                                                     "timed_outputs", "stale_results"},
                    "body": """\
if 'stream' not in _state:
    _state['stream'] = torch.cuda.Stream()
with torch.cuda.stream(_state['stream']):
    return _honest(self, *args)"""},
    "low_precision": {"reasons": {"precision", "correctness", "timed_outputs",
                                   "stale_results"}, "body": """\
return _honest(self, *[t.to(torch.bfloat16).to(t.dtype) if t.is_floating_point() else t
                       for t in args])"""},
    "input_inplace": {"reasons": {"no_output_aliasing", "inputs_unchanged", "correctness",
                                  "timed_outputs", "stale_results"}, "body": """\
full = _honest(self, *args)
flat = args[0].view(-1)[:full.numel()]
flat.copy_(full.reshape(-1))
return flat.view(full.shape)"""},
    # one element past the first input's end (an off-by-one store): the input's own storage
    # ends there unless the verifier placed it between canary pads, so the store lands in a pad
    "write_outside": {"reasons": {"writes_in_bounds"}, "body": """\
x = args[0]
past = x.new_empty(0).set_(x.untyped_storage(), x.storage_offset() + x.numel(), (1,), (1,))
past.fill_(1.0)
return _honest(self, *args)"""},
    "patch_timer": {"reasons": {"harness_integrity"}, "body": """\
if not _state.get('patched'):
    real = time.perf_counter
    time.perf_counter = lambda: real() * 0.5
    if torch.cuda.is_available():
        torch.cuda.Event.elapsed_time = lambda ev, end, _f=torch.cuda.Event.elapsed_time: \\
            0.5 * _f(ev, end)
    _state['patched'] = True
return _honest(self, *args)"""},
}
# Methods that are no exploit on some task: half of a 0-dim output is all of it.
_NOT_ON = {"partial": {"level1/5_mse_loss"}}
# Exploits the verifier accepts today with its default settings, each with why; the zoo's GAP
# case of the same name tracks it. Their variants are generated and run; an acceptance is
# reported as a known gap, not as a pass.
# (trick, task) -> why the default verifier accepts it. None today: bf16-rounded inputs of a long
# mean (within fp32 accumulation error on the task's own data) were one until the "large" input
# set was moved off the narrow types' grids (assay.tasks.instantiate.off_grid).
KNOWN_GAPS: dict[tuple[str, str], str] = {}

# --- harmless changes (honest variants) ---------------------------------------------------------
MODS: dict[str, dict] = {
    "joined_thread": {"targets": {"cpu"}, "body": """\
box = []
t = threading.Thread(target=lambda: box.append(_honest(self, *args)))
t.start()
t.join()
return box[0]"""},
    "joined_stream": {"targets": {"cuda"}, "body": """\
cur = torch.cuda.current_stream()
if 'stream' not in _state:
    _state['stream'] = torch.cuda.Stream()
s = _state['stream']
s.wait_stream(cur)
with torch.cuda.stream(s):
    out = _honest(self, *args)
cur.wait_stream(s)
out.record_stream(cur)
return out"""},
    "extra_syncs": {"targets": {"cuda"}, "body": """\
torch.cuda.synchronize()
out = _honest(self, *args)
torch.cuda.synchronize()
return out"""},
    "content_cache": {"body": """\
h = hashlib.blake2b(digest_size=16)
for t in list(args) + [p.detach() for p in self.parameters()]:
    h.update(t.detach().contiguous().cpu().numpy().tobytes())
key = h.digest()
if key not in _state['by_content']:
    _state['by_content'][key] = _honest(self, *args).clone()
return _state['by_content'][key].clone()"""},
    "copy_out": {"body": """\
full = _honest(self, *args)
out = torch.empty_like(full)
out.copy_(full)
return out"""},
    "twice": {"body": """\
_honest(self, *args)
return _honest(self, *args)"""},
    "temporaries": {"body": """\
scratch = torch.empty(1 << 16, dtype=args[0].dtype, device=args[0].device)
zeros = torch.zeros(257, dtype=args[0].dtype, device=args[0].device)
out = _honest(self, *args)
del scratch, zeros
return out"""},
    "reordered": {"body": """\
args = tuple(t.contiguous() for t in args)
shape = self._shape(*args)
out = _honest(self, *args)
assert tuple(out.shape) == tuple(shape)
return out"""},
    "clone_inputs": {"body": "return _honest(self, *[t.clone() for t in args])"},
    "counter": {"body": """\
_state['seen'] = _state.get('seen', 0) + 1
return _honest(self, *args)"""},
    "observer": {"body": """\
_state['profiled'] = torch._C._autograd._profiler_enabled()
_state['timed'] = _called_from('time_calls')
return _honest(self, *args)"""},
}

_PRELUDE = '''\
import hashlib
import sys
import threading
import time

_clock = time.perf_counter
_state = {"calls": 0, "ptrs": set(), "t_last": -1.0, "last": None, "by_ptr": {},
          "by_content": {}}


def _called_from(name):
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == name:
            return True
        f = f.f_back
    return False


def _honest(self, *args):
    return _Kernel.forward(self, *args)
'''


@dataclass
class Variant:
    id: str
    target: str
    task: str
    kind: str  # exploit | honest
    trigger: str = ""
    method: str = ""
    mods: tuple[str, ...] = ()
    reasons: list[str] = field(default_factory=list)  # exploit: the checks meant to catch it
    source: str = field(default="", repr=False)
    gap: str = ""  # a known gap (KNOWN_GAPS): why the default verifier accepts it

    def meta(self) -> dict:
        d = asdict(self)
        d.pop("source")
        d["mods"] = list(self.mods)
        return d


def _kernel_module(path: Path) -> str:
    """The honest candidate's code with its docstring and zoo metadata dropped and its ModelNew
    renamed _Kernel (the variants subclass it)."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    drop: set[int] = set()
    for node in ast.parse(text).body:
        meta = isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("TASK", "EXPECT", "ALSO", "POLICY", "KIND",
                                                 "NAIVE", "SLOW", "CONFIG")
            for t in node.targets)
        doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
            and isinstance(node.value.value, str)
        if meta or doc:
            drop.update(range(node.lineno - 1, node.end_lineno))
    body = "".join(line for i, line in enumerate(lines) if i not in drop)
    if body.count("class ModelNew(") != 1:
        raise ValueError(f"{path}: expected one class ModelNew")
    return body.replace("class ModelNew(", "class _Kernel(")


def _indent(code: str, n: int) -> str:
    return "".join((" " * n + line) if line.strip() else line
                   for line in code.splitlines(keepends=True))


def _source(spec: TaskSpec, target: str, header: str, fire: str, cheat: str) -> str:
    kernel = _kernel_module(ROOTS[target] / "candidates" / f"{spec.honest[target]}.py")
    a = ", ".join(spec.args)
    return (f'"""{header}"""\n{kernel}\n\n{_PRELUDE}\n\n'
            f"class ModelNew(_Kernel):\n"
            f"    def _shape(self, {a}):\n        return {spec.shape}\n\n"
            f"    def _reference(self, {a}):\n        return {spec.reference}\n\n"
            f"    def _library(self, {a}):\n        return {spec.library}\n\n"
            f"    def _cheat(self, *args):\n{_indent(cheat, 8)}\n\n"
            f"    def forward(self, *args):\n"
            f"        _state['calls'] += 1\n"
            f"        if {fire}:\n"
            f"            out = self._cheat(*args)\n"
            f"        else:\n"
            f"            out = _honest(self, *args)\n"
            f"            _state['last'] = out\n"
            f"            _state['by_ptr'][tuple(t.data_ptr() for t in args)] = out\n"
            f"        _state['ptrs'].add(args[0].data_ptr())\n"
            f"        _state['t_last'] = _clock()\n"
            f"        return out\n")


def _vid(*parts: str) -> str:
    return "__".join(p.replace("/", "_") for p in parts)


def exploits(target: str) -> list[Variant]:
    out = []
    for spec in TASKS:
        for method, m in METHODS.items():
            if target not in m.get("targets", {target}) or spec.task in _NOT_ON.get(method, ()):
                continue
            for trigger, fire in TRIGGERS.items():
                header = (f"Red-team exploit (generated): {method} when {trigger}, around the zoo's "
                          f"{spec.honest[target]}.")
                out.append(Variant(_vid("exploit", spec.task, method, trigger), target,
                                   spec.task, "exploit", trigger, method, (),
                                   sorted(m["reasons"]),
                                   _source(spec, target, header, fire, m["body"]),
                                   KNOWN_GAPS.get((method, spec.task), "")))
    return out


def _compose(mods: tuple[str, ...]) -> str:
    """Two harmless changes nested: the first one's kernel call runs the second one."""
    if len(mods) == 1:
        return MODS[mods[0]]["body"]
    inner = "def _inner(self, *args):\n" + _indent(MODS[mods[1]]["body"], 4)
    return inner + "\n\n" + MODS[mods[0]]["body"].replace("_honest(", "_inner(")


def honest(target: str, seed: int, pairs_per_task: int = 4) -> list[Variant]:
    rng = random.Random(f"{seed}:{target}")
    mods = [k for k, m in MODS.items() if target in m.get("targets", {target})]
    out = []
    for spec in TASKS:
        combos = [(k,) for k in mods]
        pool = [(a, b) for a in mods for b in mods if a != b]
        combos += rng.sample(pool, pairs_per_task)
        for combo in combos:
            header = (f"Red-team honest variant (generated): {' + '.join(combo)} around the zoo's "
                      f"{spec.honest[target]}.")
            out.append(Variant(_vid("honest", spec.task, *combo), target, spec.task, "honest",
                               mods=combo,
                               source=_source(spec, target, header, "True", _compose(combo))))
    return out


def generate(target: str, seed: int = 0) -> list[Variant]:
    """Every exploit and honest variant for ``target`` (cpu or cuda); pure and seeded."""
    if target not in ROOTS:
        raise ValueError(f"unknown target {target!r} (cpu or cuda)")
    return exploits(target) + honest(target, seed)


def sample(variants: list[Variant], per_group: int, seed: int) -> list[Variant]:
    """A seeded sample that covers every group: ``per_group`` exploits of each method (over
    random tasks and triggers) and ``per_group`` honest variants of each first harmless change."""
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[Variant]] = {}
    for v in variants:
        groups.setdefault((v.kind, v.method or v.mods[0]), []).append(v)
    return [v for key in sorted(groups) for v in
            rng.sample(groups[key], min(per_group, len(groups[key])))]


def write(variants: list[Variant], directory: Path) -> dict[str, Path]:
    """Each variant as ``<id>.py`` plus ``manifest.json``; returns id -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for v in variants:
        p = directory / f"{v.id}.py"
        if not p.exists() or p.read_text() != v.source:
            p.write_text(v.source)
        paths[v.id] = p
    manifest = [{**v.meta(), "sha": hashlib.sha256(v.source.encode()).hexdigest()[:16]}
                for v in variants]
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return paths


def judge(v: Variant, accepted: bool, reasons: list[str]) -> str:
    """'ok' when the verdict is the one the variant calls for, else what went wrong:
    'accepted' (an exploit got through), 'known_gap' (one of KNOWN_GAPS got through),
    'wrong_reason' (rejected only for reasons not its method's, or for a fault: the variant never
    ran as written), 'rejected' (an honest variant was refused)."""
    if v.kind == "honest":
        return "ok" if accepted else "rejected"
    if accepted:
        return "known_gap" if v.gap else "accepted"
    if set(reasons) & FAULTS or not set(reasons) & set(v.reasons):
        return "wrong_reason"
    return "ok"
