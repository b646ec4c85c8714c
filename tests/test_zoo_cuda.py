"""The exploit zoo's cuda half (issue #3), the checks that need no GPU: every file under
tests/zoo_cuda/ is well formed and every kernel in it compiles with nvcc (skipped without nvcc).
The verdicts themselves run on a GPU, in tests/test_gpu.py.

Candidates declare the same module-level fields as the cpu zoo (see tests/test_zoo.py) and use
the thin binding: ``load_library(SOURCE, "cuda")``, extern "C" entry points that take device
pointers and a stream, called through ctypes on ``torch.cuda.current_stream()``.
"""

from __future__ import annotations

import ast
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from assay.bench.build import nvcc_path
from assay.tasks.model import Task
from assay.verify import checks, policy
from test_zoo import read_meta

CUDA_ZOO = Path(__file__).parent / "zoo_cuda"
CUDA_CASES = {p.stem: read_meta(p, "cuda")
              for p in sorted((CUDA_ZOO / "candidates").glob("*.py"))}
_GLOBAL = re.compile(r"__global__\s+void\s+(\w+)")


def kernel_sources(path: Path) -> list[str]:
    """The CUDA sources a candidate builds: module-level string constants named *SOURCE."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith("SOURCE")
                                                for t in node.targets):
            out.append(ast.literal_eval(node.value))
    return out


def kernel_names(path: Path) -> list[str]:
    """The kernels a candidate defines: CUDA's __global__ functions in its sources, and the
    functions it decorates with triton.jit (the kernel's name is the function's)."""
    return [n for s in kernel_sources(path) for n in _GLOBAL.findall(s)] + \
        sorted(policy.triton_kernels(path.read_text()))


def known_reasons() -> set[str]:
    """Every check name a verdict can carry (the verifier's check registry)."""
    return set(checks.REGISTRY)


def test_cuda_zoo_files():
    kinds = [m["KIND"] for m in CUDA_CASES.values()]
    assert kinds.count("exploit") >= 15 and kinds.count("honest") >= 6, kinds
    assert kinds.count("failure") >= 3, kinds
    reasons = known_reasons()
    assert {"correctness", "stream_ordered", "kernel_audit", "timeout"} <= reasons, reasons
    for name, m in CUDA_CASES.items():
        task = CUDA_ZOO / "tasks" / f"{m['TASK']}.py"
        assert task.exists(), (name, task)
        assert set(m["EXPECT"]) | set(m["ALSO"]) <= reasons, (name, m["EXPECT"], m["ALSO"])
        assert m["POLICY"] in ("strict", "permissive"), name
        assert m["KIND"] in ("exploit", "honest", "failure", "neutralized"), name
        assert not set(m["EXPECT"]) & set(m["ALSO"]), name
        # A custom kernel named like a library's would be audited as one (kernel_audit), a
        # Triton kernel of the file's own too, if its name has a vendor's or inductor's form.
        # (A decoy that claims a library's name on purpose is an exploit's Triton function.)
        own = policy.triton_kernels(m["path"].read_text())
        for k in kernel_names(m["path"]):
            decoy = k in own and m["KIND"] == "exploit"
            assert decoy or not policy.is_library(k, own), (name, k)
        if m["KIND"] == "honest":
            assert kernel_names(m["path"]), f"{name}: an honest case needs a kernel of its own"
    for path in sorted((CUDA_ZOO / "tasks").glob("*/*.py")):
        Task.from_file(path)  # parses and defines Model, get_inputs, get_init_inputs


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
def test_cuda_zoo_sources_compile():
    """Every kernel of the cuda zoo builds (for ASSAY_CUDA_ARCH, else the GPU's, else sm_90),
    two at a time, into the shared kernel cache, where the GPU run then finds them."""
    from assay.bench.build import BuildError, build

    sources = {f"{name}#{i}": s for name, m in CUDA_CASES.items()
               for i, s in enumerate(kernel_sources(m["path"]))}
    assert len(sources) >= 20

    def one(src: str) -> str:
        try:
            build(src, "cuda")
            return ""
        except BuildError as e:
            return f"{e}\n{e.log[-1500:]}"

    with ThreadPoolExecutor(2) as pool:
        logs = dict(zip(sources, pool.map(one, sources.values())))
    failed = {k: v for k, v in logs.items() if v}
    assert not failed, failed
