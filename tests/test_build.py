"""Thin-binding builds: content-hash cache, build errors with logs, the compile service."""

from __future__ import annotations

import random

import pytest

from assay.bench.build import BuildError, build, is_cached, load_library, nvcc_path
from assay.propose.offline import OfflineSynthesizer
from assay.verify.compile_service import CompileService
from conftest import import_file
from helpers import REPO, task_ctx

SOURCE = r"""
#include <cstdint>
extern "C" int64_t triple(int64_t x) { return 3 * x; }
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path / "cache"))


def test_build_is_cached_by_content():
    assert not is_cached(SOURCE)
    lib = build(SOURCE)
    assert is_cached(SOURCE) and build(SOURCE) == lib
    assert load_library(SOURCE).triple(14) == 42
    assert build(SOURCE + "\n// another kernel\n") != lib


def test_build_error_keeps_the_compiler_log():
    with pytest.raises(BuildError) as e:
        build("int broken( {")
    assert "kernel.cpp" in e.value.log and "error" in e.value.log


def test_compile_service_fills_the_cache_without_loading(tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text(f'''
from assay.bench.build import load_library
SOURCE = r"""{SOURCE}"""
_lib = load_library(SOURCE, "cpp")
_lib.triple.restype = None   # attribute set at import must not fail in build-only mode
''')
    bad = tmp_path / "bad.py"
    bad.write_text('from assay.bench.build import load_library\nload_library("int x(", "cpp")\n')
    svc = CompileService(workers=2, timeout_s=120)
    try:
        ok, failed = svc.wait(cand), svc.wait(bad)
    finally:
        svc.close()
    assert ok.outcome == "ok" and is_cached(SOURCE)
    assert failed.outcome != "ok" and "BuildError" in failed.outcome


def test_a_lock_file_not_ours_builds_outside_the_cache(tmp_path, monkeypatch):
    """The sandbox hands what a run left in the shared cache to root, read-only: a later run
    that meets such a lock file builds privately instead of failing the candidate."""
    import filelock

    from assay.bench import build as build_mod

    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path / "cache"))

    def refused(self, *a, **k):
        raise PermissionError(13, "Permission denied", self.lock_file)

    monkeypatch.setattr(filelock.FileLock, "acquire", refused)
    src = 'extern "C" int answer() { return 42; }\n'
    lib = build_mod.build(src, "cpp")
    assert lib.is_file() and (tmp_path / "cache") not in lib.parents
    assert not build_mod.is_cached(src, "cpp")
    import ctypes

    assert ctypes.CDLL(str(lib)).answer() == 42


# --- tests/helpers.build_cuda_sources: the compile tests' nvcc runs, several sources to a unit --

_CUDA = r"""
// a kernel %(tag)s
#include <cuda_runtime.h>
#include <stdint.h>
#define ASSAY_SCALE %(scale)s
__global__ void assay_kernel(float* x, int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] *= ASSAY_SCALE;
}
static int assay_blocks(int64_t n) { return (int)((n + 255) / 256); }
extern "C" int assay_forward(float* x, int64_t n, void* stream) {
  %(body)s
  assay_kernel<<<assay_blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(x, n);
  return (int)cudaGetLastError();
}
"""
_CG = "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n"


def _cuda(tag: str, body: str = "", scale: str = "2.0f", before: str = "") -> str:
    return before + _CUDA % {"tag": tag, "body": body, "scale": scale}


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_sources_built_together_fail_as_they_would_alone(tmp_path):
    """Sources that share a translation unit keep their own names, macros and headers: good
    ones build; a broken one, one leaning on a header only another source includes, and one
    defining its C entry point twice each fail, named, with their own compiler log."""
    from helpers import build_cuda_sources, cuda_translation_unit

    good = {_cuda(f"g{i}", scale=f"{i}.0f"): f"good{i}" for i in range(3)}
    good[_cuda("cg", before=_CG, body="(void)sizeof(cg::thread_block);")] = "with_cg"
    build_cuda_sources(good)  # the same names and macros in each: kept apart
    unit = cuda_translation_unit(list(good)[:3])
    assert unit.count("\nnamespace assay_source_") == 3 and "assay_forward__assay_2" in unit
    assert build(unit, lang="cuda").exists()

    bad = {
        "broken": _cuda("b", body="int broken( {"),
        "no_cg_include": _cuda("n", body="(void)sizeof(cooperative_groups::thread_block);"),
        "two_c_entries": _cuda("t") + 'extern "C" int assay_forward(int x) { return x; }\n',
    }
    for name, source in bad.items():
        with pytest.raises(BuildError):
            build(source, lang="cuda")  # alone: rejected
        with pytest.raises(AssertionError, match=rf"^{name}: cuda build failed") as e:
            build_cuda_sources({**good, source: name})  # beside good ones: still rejected
        assert "error" in str(e.value)


def test_the_compile_service_builds_every_library_of_an_offline_candidate(tmp_path):
    """The offline synthesizer's candidates load each library at their first call, so their
    import builds none: the compile service's prebuild builds every one they declare
    (``SOURCES``), and the worker that verifies one loads them from the cache. Before, nvcc ran
    in that worker with the device held, its "first call" 6 s (median) to 31 s on level 2 of
    KernelBench on an H200."""
    tasks = REPO / "src/assay/data/tasks/level3"
    (prop,) = OfflineSynthesizer("cpu").translate(task_ctx(tasks, "1_MLP", "cpu"), n=1,
                                                  rng=random.Random(0))
    path = tmp_path / "cand.py"
    cand = import_file(prop.code, path)  # an import outside the prebuild builds nothing
    assert len(cand.SOURCES) >= 2 and not any(is_cached(s, cand.LANG) for s in cand.SOURCES)
    svc = CompileService(workers=1, timeout_s=600)
    try:
        built = svc.wait(path)
    finally:
        svc.close()
    assert built.outcome == "ok" and all(is_cached(s, cand.LANG) for s in cand.SOURCES), built


def test_a_cuda_verify_step_builds_every_candidate_before_it_takes_the_device(tmp_path,
                                                                             monkeypatch):
    """Every candidate of the generation is built (the compile service, on the CPU cores)
    before the step takes the device: a later candidate's build waited for with the device held
    would leave it idle while another job waits. Run as on a GPU machine: target=cuda."""
    from assay import app
    from assay.layout import write_json
    from assay.records import Verdict
    from assay.steps import verify as step
    from assay.verify import compile_service, harness, sandbox

    cfg = app.compose(["tasks.source=data/tasks", "tasks.size=small",
                       "tasks.include=[L1_1_ReLU]", "target=cuda", f"results_dir={tmp_path}",
                       "campaign=order"])
    c = app.campaign(cfg)
    write_json(c.task_record("L1_1_ReLU"), {"id": "L1_1_ReLU", "error": None})
    write_json(c.baseline("L1_1_ReLU"), {"eager_ms": 1.0, "compile_ms": None})
    todo = ["c0", "c1"]
    for cid in todo:
        path = c.candidate("offline", "L1_1_ReLU", 0, cid)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# a candidate\n")
    order = []

    def built_first(paths, workers, timeout_s, limits):
        order.append(("built", sorted(p.name for p in paths)))
        return {str(p): compile_service.Prebuilt(p.stem, "ok", 1.0) for p in paths}

    monkeypatch.setattr(compile_service, "built_first", built_first)
    monkeypatch.setattr(app, "on_device", lambda cfg: order.append(("device",)))
    monkeypatch.setattr(step, "this_gpu", lambda cfg, task, b, p, shared: (b, p))
    monkeypatch.setattr(step, "prewarmed_baseline", lambda cfg, task, b, shared: None)
    monkeypatch.setattr(sandbox, "prestart_worker", lambda: None)
    monkeypatch.setattr(harness, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(harness, "verify", lambda task, path, *a, **k: order.append(
        ("verify", path.name)) or Verdict(task=task.id, candidate=path.stem, device="cuda"))
    step.judge(cfg.copy(), c, "offline", "L1_1_ReLU", 0, todo)
    assert order == [("built", ["c0.py", "c1.py"]), ("device",), ("verify", "c0.py"),
                     ("verify", "c1.py")], order
