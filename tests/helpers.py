"""Helpers shared by the test modules (import them: `from helpers import REPO, snakemake`).

pytest puts tests/ on sys.path (rootdir conftest, no __init__.py), so this imports as
`helpers` from every test module.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from assay.propose.base import TaskContext

REPO = Path(__file__).resolve().parents[1]
# KernelBench's levels 1-3 (unchanged): ../shared/kernelbench beside the checkout, else the copy
# that GPU calls carry as .kb (the folder beside the checkout does not travel there); tests that
# read it skip where neither is present
KERNELBENCH = next((p for p in (REPO.parent / "shared" / "kernelbench", REPO / ".kb")
                    if p.is_dir()), REPO.parent / "shared" / "kernelbench")
CI = ("campaign=ci", "tasks=ci", "evolve=ci")  # the CI campaign: three small tasks


def small_copy(path: Path, sizes: dict[str, int]) -> str:
    """A KernelBench file's source with its module-level sizes (``name = value`` lines) set to
    ``sizes``: a small copy of the task, for the CPU."""
    source = path.read_text()
    for name, value in sizes.items():
        source, n = re.subn(rf"^{name} = .*$", f"{name} = {value}", source, flags=re.M)
        assert n == 1, f"{path.name}: no single line sets {name}"
    return source


def overrides_arg(overrides: Sequence[str]) -> str:
    """Snakemake's `--config` value carrying these Hydra overrides; each is JSON-quoted, so
    nested lists (`llms=[a,b]`) and commas survive Snakemake's parsing."""
    return "overrides=[" + ",".join(json.dumps(o) for o in overrides) + "]"


def snakemake(workdir: Path, *args: str, overrides: Sequence[str] = CI,
              cores: int = 2) -> list[str]:
    """The command line running the campaign DAG of this checkout in ``workdir`` with this
    interpreter. ``args`` (targets, -n, --forcerun X ...) come before `--config`, which would
    swallow a target placed after it."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(workdir), "--cores", str(cores), *args,
            "--config", overrides_arg(overrides)]


def assert_forked(times: dict, reported: bool = True) -> None:
    """A verdict's ``times`` say its worker was forked with torch imported (an exec'd worker
    imports it: 1-1.5 s on the CPU machines). ``reported``: its worker ran to its report, so
    the time must be there (``import_s`` is absent only where the worker never reported: a
    crash, a candidate that fails at its import)."""
    if reported:
        assert "import_s" in times, times
    if "import_s" in times:
        assert times["import_s"] < 0.5, times


def env(**extra: str) -> dict[str, str]:
    """The environment of the DAG tests' campaigns: this process's, with this interpreter's bin
    first (the rules call `python -m`, Snakemake's profiles `snakemake`), plus ``extra``."""
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}:{e['PATH']}"
    e.update(extra)
    return e


# --- nvcc: many candidate sources, few compiler runs ---------------------------------------------
# A CUDA candidate's nvcc run is mostly fixed cost: the runtime and cooperative_groups headers
# go through the preprocessor, cudafe++ and the host compiler each time (0.6 s of a 1-3 s build;
# 101 sources of test_offline.py: 104 s of CPU one by one, 13 s in units of 12). The compile
# tests ask whether each source builds, so several go into one translation unit, compiled by
# build() (the product's nvcc command): each source in a namespace of its own, its extern "C"
# entry points renamed by a macro (still C linkage: a second definition within the source still
# fails), its macros undefined after it, its line numbers kept. Only sources of the same #include
# lines, in the same order, share a unit, and those lines head the unit, so none builds on a
# header that it does not include itself; one source of each such group, the shortest (the
# cheapest build), is also built alone, as it is (an include hoisted above code that needed it
# late would show there). A unit that fails is built again source by source: the verdict, and
# the log shown, are the source's.
# The units skip NVVM's optimizer (UNIT_FLAGS): it and ptxas's work on the code it unrolls are
# most of a build's time (8 GEMM corners in one unit, product's flags: cicc 19 s, ptxas 31 s,
# 52 s in all; with UNIT_FLAGS 8 s). Whether a source builds is decided before and after it:
# the front end (syntax, templates, static_asserts) and ptxas (inline PTX, static shared memory)
# still run on every source. The sources built alone, and a failing unit's sources, get the
# product's flags.
UNIT_FLAGS = ("-Xcicc", "-O0")

_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.M)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)
_EXTERN_C = re.compile(r'extern[ \t]+"C"[ \t]+[^;{(]*?\b(\w+)[ \t]*\(')


def _split_includes(source: str) -> tuple[tuple[str, ...], str] | None:
    """(the source's #include lines, in order; the source without them), or None where one is
    not at file scope (inside braces or an #if) or the source has an `extern "C" {` block:
    such a source builds alone."""
    depth, opened, includes, kept = 0, 0, [], []
    for line in source.splitlines(keepends=True):
        code = line.split("//", 1)[0]
        if _INCLUDE.match(line):
            if depth or opened:
                return None
            includes.append(line.strip())
            kept.append("\n")  # the source's line numbers stay
            continue
        if re.match(r"[ \t]*#[ \t]*if", code):
            opened += 1
        elif re.match(r"[ \t]*#[ \t]*endif", code):
            opened -= 1
        depth += code.count("{") - code.count("}")
        kept.append(line)
    body = "".join(kept)
    if re.search(r'extern[ \t]+"C"[ \t]*\{', body):
        return None
    return tuple(includes), body


def cuda_translation_unit(sources: Sequence[str]) -> str:
    """One CUDA source that defines everything ``sources`` do (each of the same leading
    #include lines, as _split_includes gives them), each in a namespace of its own."""
    includes: tuple[str, ...] | None = None
    parts = []
    for i, source in enumerate(sources):
        split = _split_includes(source)
        assert split is not None and includes in (None, split[0]), "sources cannot share a unit"
        includes, body = split
        entries = sorted(set(_EXTERN_C.findall(body)))
        macros = sorted(set(_DEFINE.findall(body)))
        parts += [f"// ---- source {i}", *(f"#define {n} {n}__assay_{i}" for n in entries),
                  f"namespace assay_source_{i} {{", f"#line 1 \"source_{i}.cu\"", body,
                  f"}}  // namespace assay_source_{i}",
                  *(f"#undef {n}" for n in entries + macros)]
    return "\n".join([*(includes or ()), *parts]) + "\n"


def build_cuda_candidates(codes: dict[str, str], folder: Path) -> None:
    """nvcc every CUDA source of the candidates ``codes`` (a name, for failures: the code),
    imported from ``folder`` (:func:`build_cuda_sources`)."""
    from conftest import import_file

    built = {}
    for name, code in codes.items():
        cand = import_file(code, folder / f"cuda_{name}.py")
        built.update({source: name for source in cand.SOURCES})
    build_cuda_sources(built)


def translations(folder: Path, names: Sequence[str], target: str = "cuda") -> dict[str, str]:
    """The offline synthesizer's first candidate for each task ``folder/<name>.py`` on
    ``target`` (seeded), by name; none may be declined."""
    import random

    from assay.propose.offline import OfflineSynthesizer

    syn = OfflineSynthesizer(target)
    props = {name: syn.translate(task_ctx(folder, name, target), 1, random.Random(0))[0]
             for name in names}
    assert all(p.code is not None for p in props.values()), \
        {n: p.declined for n, p in props.items()}
    return {name: p.code for name, p in props.items()}


def assert_translations_match_reference(ctx: "TaskContext", overrides: list[dict],
                                        folder: Path, n: int = 2) -> None:
    """The synthesizer's first ``n`` candidates for ``ctx`` (seeded: the strict one, the
    permissive one) each equal the reference on ``ctx``'s target (:func:`
    assert_matches_reference`, two input seeds)."""
    import random

    from assay.propose.offline import OfflineSynthesizer

    for prop in OfflineSynthesizer(ctx.target).translate(ctx, n=n, rng=random.Random(0)):
        assert prop.code is not None, prop.declined
        assert_matches_reference(prop.code, folder / f"{ctx.target}_{prop.id}.py", ctx,
                                 overrides, ctx.target, seeds=(1, 2))


def assert_accepted_on_cpu(ctx: "TaskContext", code: str, path: Path) -> None:
    """The verifier accepts ``code`` (written to ``path``) for ``ctx``'s task on the CPU under
    the strict policy (a short timing budget: the verdict, not the speed, is asked)."""
    from assay.verify.harness import verify
    from assay.verify.settings import VerifyConfig

    path.write_text(code)
    cfg = VerifyConfig(policy="strict", budget_s=0.05, min_runs=3, max_runs=10,
                       max_library_time_frac=0.0)
    verdict = verify(ctx.task, path, "cpu", cfg)
    assert verdict.accepted, (verdict.reasons,
                              {r: verdict.checks[r]["detail"][:300] for r in verdict.reasons})


def build_cuda_sources(sources: dict[str, object] | Sequence[str], per_unit: int = 12,
                       workers: int = 2) -> None:
    """nvcc every CUDA source, ``per_unit`` sources to a translation unit (see above),
    ``workers`` compiler runs at a time; each must build. ``sources`` maps a source to what
    names it in a failure (a list names it by its place)."""
    from concurrent.futures import ThreadPoolExecutor

    from assay.bench.build import BuildError, build

    labels = dict(sources) if isinstance(sources, dict) else {s: i for i, s in enumerate(sources)}
    groups: dict[object, list[str]] = {}
    for source in labels:
        split = _split_includes(source)
        groups.setdefault(split[0] if split else ("alone", source), []).append(source)
    jobs: list[list[str]] = []  # a list of one source: built as it is
    for members in groups.values():
        if len(members) > 1:
            jobs.append([min(members, key=len)])
        n = -(-len(members) // per_unit)
        jobs += [members[k::n] for k in range(n)]

    def build_alone(source: str) -> None:
        try:
            lib = build(source, lang="cuda")
        except BuildError as e:
            raise AssertionError(f"{labels[source]}: {e}\n{e.log[-4000:]}") from e
        assert lib.exists(), labels[source]

    def run(job: list[str]) -> None:
        if len(job) == 1:
            return build_alone(job[0])
        try:
            if build(cuda_translation_unit(job), lang="cuda", flags=UNIT_FLAGS).exists():
                return
        except BuildError:
            pass  # found out source by source
        for source in job:
            build_alone(source)

    jobs.sort(key=len, reverse=True)  # the longest first: the workers end together
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(run, jobs))


def task_ctx(folder: Path, name: str, target: str = "cpu") -> "TaskContext":
    """The proposer's context for task file ``folder/name.py`` on ``target``."""
    from assay.propose.base import TaskContext
    from assay.tasks.model import Task

    return TaskContext(Task.from_file(folder / f"{name}.py"), target=target)


def entry_arities(code: str) -> list[tuple[str, int, int]]:
    """Each ``_lib(i).NAME(args)`` call of a candidate's source: (NAME, arguments passed,
    ctypes argtypes declared for NAME in library i's table of ``_ARGTYPES``; -1: none)."""
    import ast

    tree = ast.parse(code)
    declared: dict[tuple[int, str], int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_ARGTYPES"
                                                for t in node.targets):
            tables = ast.literal_eval(ast.unparse(node.value).replace("ctypes.", "'")
                                      .replace("c_void_p", "p'").replace("c_int64", "i'")
                                      .replace("c_float", "f'").replace("c_int", "n'"))
            for i, table in enumerate(tables):
                for name, types in table.items():
                    declared[(i, name)] = len(types)
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Call)
                and getattr(node.func.value.func, "id", "") == "_lib"):
            lib = node.func.value.args
            i = ast.literal_eval(lib[0]) if lib else 0
            out.append((node.func.attr, len(node.args), declared.get((i, node.func.attr), -1)))
    return out


def assert_calls_as_declared(code: str, entry: str, what: object = None) -> None:
    """The candidate calls ``entry``, and every entry point with as many arguments as its
    ctypes argtypes (a mismatch is a TypeError at the first call, on the device only)."""
    arities = entry_arities(code)
    assert entry in {n for n, _, _ in arities}, (what, entry, arities)
    assert all(passed == declared for n, passed, declared in arities
               if n != "assay_error_string"), (what, arities)  # (declared by _lib itself)


def assert_matches_reference(code: str, path: Path, ctx: "TaskContext", overrides: list[dict],
                             device: str = "cpu", rtol: float | None = None,
                             atol: float | None = None, seeds: tuple[int, ...] = (1,)) -> None:
    """The candidate ``code`` (imported from ``path``) equals the task's reference (in true
    fp32), dtype, shape and strides too, with the reference's seeded parameters, for each of
    ``overrides`` (module variables set before the task is built: other sizes) and each input
    seed of ``seeds``. Tolerances: 1e-4 (2e-2 for half-precision outputs) unless given."""
    import torch

    from assay.tasks.instantiate import make_inputs, reference_model, seeded
    from assay.verify.harness import strides_accepted
    from conftest import import_file

    cand = import_file(code, path)
    for override in overrides:
        mod = ctx.task.module()
        for key, value in override.items():
            setattr(mod, key, value)
        ref = reference_model(mod, seed=0, device=device)
        with seeded(0):
            new = cand.ModelNew(*mod.get_init_inputs())
        new.to(device).eval().load_state_dict(ref.state_dict())
        for seed in seeds:
            inputs = make_inputs(mod, seed=seed, device=device)
            # the reference in true fp32: cuDNN's default TF32 (convolutions, GRU/LSTM) differs
            # from fp32 by ~1e-4, more than the candidates' own fp32 arithmetic
            with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                expected, got = ref(*inputs), new(*inputs)
            # (the verifier's layout rule: the reference's strides or contiguous ones)
            assert got.shape == expected.shape and strides_accepted(
                expected.shape, got.stride(), [expected.stride()]), (override, got.stride())
            assert got.dtype == expected.dtype, override
            low = 2e-2 if expected.dtype in (torch.float16, torch.bfloat16) else 1e-4
            torch.testing.assert_close(got, expected, rtol=low if rtol is None else rtol,
                                       atol=low if atol is None else atol)
