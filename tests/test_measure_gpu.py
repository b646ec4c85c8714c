"""benchmarks/measure_gpu.py on the CPU: the build part end to end (two tiny C++ candidates
through the compile service), and every CUDA source it generates compiles with nvcc."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from assay.bench.build import nvcc_path
from helpers import REPO, build_cuda_sources


@pytest.fixture(scope="module")
def mg():
    spec = importlib.util.spec_from_file_location("measure_gpu", REPO / "benchmarks" /
                                                  "measure_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["measure_gpu"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("measure_gpu", None)


@pytest.fixture
def env(monkeypatch, tmp_path):
    # main() sets these for its workers; restore them afterwards.
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    monkeypatch.setenv("ASSAY_CUDA_ARCH", "sm_90")


def test_build_part_on_cpu(mg, env, tmp_path):
    out = tmp_path / "out"
    assert mg.main(["--out", str(out), "--only", "build", "--device", "cpu", "--build-lang",
                    "cpp", "--build-candidates", "2", "--build-workers", "2",
                    "--work", str(tmp_path / "work")]) == 0
    data = json.loads((out / "build.json").read_text())
    assert data["candidates"] == 2 and len(data["rows"]) == 2
    assert all(r["outcome"] == "ok" and r["in_cache"] for r in data["rows"])
    assert all(r["cached_outcome"] == "ok" for r in data["rows"])
    assert data["cold_median_s"] > 0 and data["cached_build_call_median_ms"] < 100
    assert data["verdict"] == "FAIL"  # fewer than the 10 candidates the acceptance asks for
    report = (out / "measure_gpu.md").read_text()
    assert "## 1. Cold build" in report and "build00" not in report  # cpp tags: build_relu00
    assert "build_relu01" in report
    assert len({p.read_text() for p in (out / "build" / "candidates").glob("*.py")}) == 2


def test_candidates_are_distinct(mg):
    for lang in ("cuda", "cpp"):
        srcs = [c.source for c in mg.relu_candidates(40, lang)]
        assert len(set(srcs)) == 40
    cands = mg.build_candidates(12, "cuda")
    assert len({c.source for c in cands}) == 12
    assert {c.family for c in cands} == {"relu", "softmax", "matmul"}


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
def test_generated_cuda_sources_compile(mg, env):
    sources = [c.source for c in mg.build_candidates(3, "cuda")] + [mg.TRIL_CUDA]
    assert len(set(sources)) == 4
    build_cuda_sources(sources)
