"""load_inline through the content-hash cache (assay.bench.inline).

torch's real load_inline needs ~30 s per build on this machine, so the cache logic is tested
with a stand-in that has load_inline's signature and builds a tiny CPython extension with the
C compiler (PyInit_<name>, like torch's); one opt-in test (ASSAY_SLOW_TESTS=1) runs torch's own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from assay.bench import inline
from assay.bench.build import BuildError
from assay.verify import provenance

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "scratch").mkdir()  # TMPDIR: the sandbox's scratch folder in a worker
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    monkeypatch.setenv("ASSAY_CUDA_ARCH", "sm_90")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)


def fake_load_inline(builds: list):
    """Builds a module whose ``answer()`` returns the integer in cpp_sources."""

    @functools.wraps(cpp_extension.load_inline)  # inspect.signature sees load_inline's
    def build(name, cpp_sources, cuda_sources=None, build_directory=None, **_):
        builds.append(build_directory)
        cuda = "\n".join([cuda_sources] if isinstance(cuda_sources, str) else cuda_sources or [])
        # as torch's _jit_compile: a name built again in this process with other content is
        # built as NAME_v<k>
        version = cpp_extension.JIT_EXTENSION_VERSIONER.bump_version_if_changed(
            name, [], build_arguments=[cpp_sources, cuda], build_directory=build_directory,
            with_cuda=bool(cuda), with_sycl=False, is_python_module=True, is_standalone=False)
        name = f"{name}_v{version}" if version else name
        if "needs: torch/extension.h" in cuda and "torch/extension.h>" not in cuda:
            raise RuntimeError(f"Error building extension '{name}': FAILED: cuda.cuda.o\n"
                               "cuda.cu:9: error: 'torch::nn' has not been declared")
        value = cpp_sources if isinstance(cpp_sources, str) else cpp_sources[0]
        src = Path(build_directory) / "m.c"
        src.write_text(f"""
#include <Python.h>
static PyObject* answer(PyObject* s, PyObject* a) {{ return PyLong_FromLong({value}); }}
static PyMethodDef M[] = {{{{"answer", answer, METH_NOARGS, ""}}, {{0}}}};
static struct PyModuleDef D = {{PyModuleDef_HEAD_INIT, "{name}", 0, -1, M}};
PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&D); }}
""")
        out = Path(build_directory) / f"{name}.so"
        proc = subprocess.run([CC, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                               str(src), "-o", str(out)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"Error building extension '{name}': {proc.stderr}")
        return inline._import(name, out)

    return build


@pytest.fixture
def builds(monkeypatch):
    from torch.utils._cpp_extension_versioner import ExtensionVersioner

    monkeypatch.setattr(cpp_extension, "JIT_EXTENSION_VERSIONER", ExtensionVersioner())
    made: list = []
    monkeypatch.setattr(inline, "_ORIGINAL", [fake_load_inline(made)])
    return made


def test_same_content_builds_once_and_any_name_change_rebuilds(builds):
    m = inline.cached_load_inline("ext_a", "7")
    assert m.answer() == 7 and len(builds) == 1
    again = inline.cached_load_inline(name="ext_a", cpp_sources="7", verbose=True)
    assert again.answer() == 7 and len(builds) == 1  # verbose is not content: a cache hit
    # other content under the same name in this process: torch builds and loads it as
    # ext_a_v1, which the cache (importing by the name) does not take; a worker loads one
    # candidate, so that is the prebuild's or a test's case only
    assert inline.cached_load_inline("ext_a", "8").answer() == 8 and len(builds) == 2
    assert inline.cached_load_inline("ext_b", "7").answer() == 7 and len(builds) == 3
    assert len(list(Path(os.environ["ASSAY_KERNEL_CACHE"]).glob("inline-*.so"))) == 2
    # the private build folders hold nothing but the library each build loaded (in TMPDIR);
    # the libraries are in the cache too
    assert [sorted(p.name for p in Path(b).iterdir()) for b in builds] == \
        [["ext_a.so"], ["ext_a_v1.so"], ["ext_b.so"]]
    assert all(Path(b).parent == Path(tempfile.gettempdir()) for b in builds)


@pytest.mark.parametrize("cache_writable", [True, False])
def test_the_loaded_library_stays_where_provenance_reads(builds, monkeypatch, cache_writable):
    """A worker that builds its candidate itself loads the library from its build folder: that
    file must outlive the build (audit_provenance reads the candidate's kernels from the
    scratch folder), also where the shared cache refuses the build (an earlier run's lock)."""
    if not cache_writable:
        monkeypatch.setattr(inline, "cache_lock", _refused_lock)
    m = inline.cached_load_inline("ext_kept", "5")
    assert m.answer() == 5
    kept = Path(m.__file__)  # where the module says (a candidate may copy or dlopen it)
    assert Path(tempfile.gettempdir()) in kept.parents
    assert provenance.defines(kept.read_bytes(), "PyInit_ext_kept")
    cached = list(Path(os.environ["ASSAY_KERNEL_CACHE"]).glob("inline-*.so"))
    assert len(cached) == (1 if cache_writable else 0)


@contextlib.contextmanager
def _refused_lock(path):
    yield False


def test_lighter_cuda_sources():
    body = "__global__ void k(float* x) {}\ntorch::Tensor f(torch::Tensor x) { return x; }\n"
    light = inline.lighter_cuda_sources("#include <torch/extension.h>\n" + body)
    assert light == ["\n" + body]
    assert inline.lighter_cuda_sources(["# include \"torch/extension.h\"  // all of it\n", body]) \
        == ["\n", body]
    assert inline.lighter_cuda_sources(body) is None  # nothing to take out
    assert inline.lighter_cuda_sources(None) is None and inline.lighter_cuda_sources([]) is None
    for own in ("PYBIND11_MODULE(m, m) {}", "namespace py = pybind11;", "py::object o;",
                "TORCH_LIBRARY(ns, m) {}", "PyObject* p;"):
        assert inline.lighter_cuda_sources(["#include <torch/extension.h>\n", body + own]) \
            is None, own


def test_light_build_first_then_the_sources_as_written(builds, capfd):
    full = "#include <torch/extension.h>\n__global__ void k() {}\n"
    assert inline.cached_load_inline("ext_l", "3", cuda_sources=full).answer() == 3
    assert len(builds) == 1  # the light build held
    needs = full + "// needs: torch/extension.h\n"
    assert inline.cached_load_inline("ext_m", "4", cuda_sources=needs).answer() == 4
    assert len(builds) == 3  # the light build failed, then the sources as written
    assert "building the sources as written" in capfd.readouterr().err
    # the build as written keeps the name (torch would have numbered it ext_m_v1 after the
    # failed attempt, and the cache could not import that by ext_m's name) and so goes into
    # the cache; keyed by the sources as written: a cache hit
    assert len(list(Path(os.environ["ASSAY_KERNEL_CACHE"]).glob("inline-*.so"))) == 2
    assert inline.cached_load_inline("ext_m", "4", cuda_sources=needs).answer() == 4
    assert len(builds) == 3


def test_a_failing_light_and_full_build_reports_the_full_log(builds):
    bad = "#include <torch/extension.h>\n// needs: torch/extension.h\n"
    with pytest.raises(BuildError) as e:
        inline.cached_load_inline("ext_n", "4 +* 1", cuda_sources=bad)
    assert len(builds) == 2 and "error" in e.value.log and "torch::nn" not in e.value.log


def test_device_arch_only_and_in_the_key(builds, monkeypatch):
    inline.cached_load_inline("ext_c", "1")
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    inline.cached_load_inline("ext_c", "1")
    assert len(builds) == 2  # another architecture is another library


def test_build_failure_is_a_build_error_with_the_whole_log(builds):
    with pytest.raises(BuildError) as e:
        inline.cached_load_inline("ext_d", "7 +* " + "x" * 3000)
    assert isinstance(e.value, RuntimeError)  # candidates catching RuntimeError still do
    assert "error" in e.value.log and len(e.value.log) > 3000  # the whole compiler output
    assert not list(Path(os.environ["ASSAY_KERNEL_CACHE"]).glob("inline-*.so"))


def test_fake_build_errors_keep_compiler_output(monkeypatch):
    def broken(name, cpp_sources, **_):
        raise RuntimeError(f"Error building extension '{name}': main.cpp:3: error: nope")

    monkeypatch.setattr(inline, "_ORIGINAL",
                        [functools.wraps(cpp_extension.load_inline)(broken)])
    with pytest.raises(BuildError) as e:
        inline.cached_load_inline("ext_e", "int f(")
    assert e.value.log == "main.cpp:3: error: nope"


def test_install_routes_torch_load_inline(monkeypatch):
    monkeypatch.setattr(cpp_extension, "load_inline", cpp_extension.load_inline)
    inline.install()
    from torch.utils.cpp_extension import load_inline

    assert load_inline is inline.cached_load_inline


def test_arch_list_spelling():
    assert [inline.arch_list(a) for a in ("sm_90", "sm_90a", "sm_100", "sm_80")] == \
        ["9.0", "9.0a", "10.0", "8.0"]


@pytest.mark.skipif(not os.environ.get("ASSAY_SLOW_TESTS"), reason="ASSAY_SLOW_TESTS=1: a real "
                    "torch extension build (~30-60 s on 2 cores)")
def test_real_load_inline_cpu_is_cached(monkeypatch):
    calls = []

    @functools.wraps(cpp_extension.load_inline)
    def counted(*args, **kwargs):
        calls.append(1)
        return cpp_extension.load_inline(*args, **kwargs)

    monkeypatch.setattr(inline, "_ORIGINAL", [counted])
    src = "int64_t twice(int64_t x) { return 2 * x; }"
    assert inline.cached_load_inline("assay_twice", src, functions=["twice"]).twice(21) == 42
    assert inline.cached_load_inline("assay_twice", src, functions=["twice"]).twice(4) == 8
    assert len(calls) == 1


def test_a_light_build_failing_in_the_cpp_file_is_not_built_again(builds):
    """The swap changes the CUDA file only: a failure in the C++ file (main.o) is the build's
    own, reported at once rather than after a second build that fails the same way."""
    light = "#include <torch/extension.h>\n__global__ void k() {}\n"
    with pytest.raises(BuildError) as e:
        inline.cached_load_inline("ext_o", "4 +* 1", cuda_sources=light)
    assert len(builds) == 1 and "error" in e.value.log
