"""Thin-binding builds: content-hash cache, build errors with logs, the compile service."""

from __future__ import annotations

import pytest

from assay.bench.build import BuildError, build, is_cached, load_library
from assay.verify.compile_service import CompileService

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
