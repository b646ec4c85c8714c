"""load_inline through the content-hash cache (assay.bench.inline).

The cache and fallback logic is tested with a stand-in that has load_inline's signature and
builds a tiny CPython extension with the C compiler (PyInit_<name>, like torch's); two tests
build with torch's real headers: its own load_inline of a C++ extension (light, ~6 s) and nvcc
on a light KernelBench-style CUDA file (~9 s).
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
    def build(name, cpp_sources, cuda_sources=None, build_directory=None,
              no_implicit_headers=False, **_):
        builds.append(build_directory)
        cuda = "\n".join([cuda_sources] if isinstance(cuda_sources, str) else cuda_sources or [])
        # as torch's _jit_compile: a name built again in this process with other content is
        # built as NAME_v<k>
        version = cpp_extension.JIT_EXTENSION_VERSIONER.bump_version_if_changed(
            name, [], build_arguments=[cpp_sources, cuda], build_directory=build_directory,
            with_cuda=bool(cuda), with_sycl=False, is_python_module=True, is_standalone=False)
        name = f"{name}_v{version}" if version else name
        cpp = "\n".join([cpp_sources] if isinstance(cpp_sources, str) else cpp_sources)
        if not no_implicit_headers:  # as load_inline: the whole header first
            cpp = "#include <torch/extension.h>\n" + cpp
        # a source marked "needs: torch/extension.h" fails to compile without that header
        if "needs: torch/extension.h" in cuda and "torch/extension.h>" not in cuda:
            raise RuntimeError(f"Error building extension '{name}': FAILED: cuda.cuda.o\n"
                               "cuda.cu:9: error: 'torch::nn' has not been declared")
        if "needs: torch/extension.h" in cpp and "torch/extension.h>" not in cpp:
            raise RuntimeError(f"Error building extension '{name}': FAILED: main.o\n"
                               "main.cpp:9: error: 'torch::nn' has not been declared")
        value = cpp_sources if isinstance(cpp_sources, str) else cpp_sources[-1]
        value = value.split("//")[0]
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


def test_light_sources_start_each_file_with_what_it_names():
    body = ("#include <torch/extension.h>\n__global__ void k(float* x) {}\n"
            "torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x);\n"
            "  auto z = at::zeros({3}, x.options().dtype(torch::kFloat32));\n"
            "  auto t = x.contiguous().sum();\n"
            "  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), \"f\", [&] {}); return y; }\n")
    a = {"cpp_sources": "#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x);",
         "cuda_sources": body, "no_implicit_headers": False}
    light = inline.light_sources(a)
    cuda, cpp = light["cuda_sources"], light["cpp_sources"]
    assert light["no_implicit_headers"] is True
    assert cuda[:3] == ["#include <cuda.h>", "#include <cuda_runtime.h>",
                        "#include <ATen/core/Tensor.h>"]
    head = "\n".join(cuda[:-1])
    for h in ("ATen/ops/empty_like.h", "ATen/ops/zeros.h", "ATen/Dispatch.h"):
        assert f"#include <{h}>" in head, h
    for method in ("contiguous", "sum"):  # ATen ops called as methods: the core declares them
        assert inline.ops_called([f"at::{method}("]) and f"ATen/ops/{method}.h" not in head
    assert "constexpr auto kFloat32 = at::kFloat;" in head and "kInt32" not in head
    assert "torch/extension.h" not in "\n".join(cuda + cpp)  # the source's own include too
    assert cpp[:2] == ["#include <torch/csrc/utils/pybind.h>", "#include <torch/csrc/Exceptions.h>"]
    assert cpp[-1].strip() == "torch::Tensor f(torch::Tensor x);"
    # no CUDA sources: the binding file only
    assert set(inline.light_sources({**a, "cuda_sources": None})) == {"cpp_sources",
                                                                      "no_implicit_headers"}
    for own in ("torch::nn::Linear l(1, 2);", "auto t = torch::tensor({1, 2});",
                "TORCH_LIBRARY(ns, m) {}"):  # what only the whole headers declare
        assert inline.light_sources({**a, "cuda_sources": body + own}) is None, own
        assert inline.light_sources({**a, "cpp_sources": own}) is None, own
    for own in ("PYBIND11_MODULE(m, m) {}", "namespace py = pybind11;", "PyObject* p;"):
        assert inline.light_sources({**a, "cuda_sources": body + own}) is None, own
        assert inline.light_sources({**a, "cpp_sources": own}) is not None, own  # pybind11 there
    assert inline.light_sources({**a, "no_implicit_headers": True}) is None  # the caller's own
    no_switch = dict(a)
    del no_switch["no_implicit_headers"]  # a torch without it
    assert inline.light_sources(no_switch) is None


def test_slim_operator_headers_leave_out_what_their_functions_never_use(tmp_path):
    a = {"cpp_sources": "", "cuda_sources": "auto y = at::empty_like(x); torch::zeros({2});",
         "no_implicit_headers": False, "extra_include_paths": ["/mine"]}
    light = inline.light_sources(a, tmp_path / "inc")
    assert light["extra_include_paths"] == [str(tmp_path / "inc"), "/mine"]  # searched first
    for op in ("empty_like", "zeros"):
        slim = (tmp_path / "inc" / "ATen" / "ops" / f"{op}.h").read_text()
        whole = inline.ops_called([f"at::{op}("])[op].read_text()
        assert "#include <ATen/Context.h>" in whole and "#include <ATen/Context.h>" not in slim
        assert "#include <ATen/DeviceGuard.h>" not in slim
        assert f"#include <ATen/ops/{op}_ops.h>" in slim and f"inline at::Tensor {op}(" in slim
    # nothing called: empty_like's alone (ATen's tensor operators use it)
    light = inline.light_sources({**a, "cuda_sources": "int x;"}, tmp_path / "few")
    assert light["extra_include_paths"][0] == str(tmp_path / "few")
    assert [p.name for p in (tmp_path / "few" / "ATen" / "ops").iterdir()] == ["empty_like.h"]


def test_light_build_first_then_the_cuda_file_as_load_inline_writes_it(builds, capfd):
    full = "#include <torch/extension.h>\n__global__ void k() {}\n"
    assert inline.cached_load_inline("ext_l", "3", cuda_sources=full).answer() == 3
    assert len(builds) == 1  # the light build held
    needs = full + "// needs: torch/extension.h\n"
    assert inline.cached_load_inline("ext_m", "4", cuda_sources=needs).answer() == 4
    assert len(builds) == 3  # the light build failed in the CUDA file, then that file as written
    assert "compiling it as load_inline writes it" in capfd.readouterr().err
    # the second build keeps the name (torch would have numbered it ext_m_v1 after the
    # failed attempt, and the cache could not import that by ext_m's name) and so goes into
    # the cache; keyed by the sources as written: a cache hit
    assert len(list(Path(os.environ["ASSAY_KERNEL_CACHE"]).glob("inline-*.so"))) == 2
    assert inline.cached_load_inline("ext_m", "4", cuda_sources=needs).answer() == 4
    assert len(builds) == 3


def test_a_binding_file_that_needs_more_is_built_as_written(builds, capfd):
    assert inline.cached_load_inline("ext_p", "5 // needs: torch/extension.h",
                                     cuda_sources="__global__ void k() {}\n").answer() == 5
    assert len(builds) == 2 and "building the sources as written" in capfd.readouterr().err


def test_a_cuda_file_failing_as_load_inline_writes_it_is_the_candidates_error(builds):
    """Its log is what torch's own load_inline would print; the sources as written would fail
    the same way, so they are not built a third time."""
    bad = "// needs: torch/extension.h (and does not include it)\n"
    with pytest.raises(BuildError) as e:
        inline.cached_load_inline("ext_n", "4", cuda_sources=bad)
    assert len(builds) == 2 and "FAILED: cuda.cuda.o" in e.value.log


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


ADD_RELU = """
#include <torch/extension.h>
torch::Tensor add_relu(torch::Tensor a, torch::Tensor b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "add_relu: the shapes differ");
  auto out = torch::empty_like(a);
  auto pa = a.contiguous(), pb = b.contiguous();
  const float *x = pa.data_ptr<float>(), *y = pb.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) o[i] = x[i] + y[i] > 0 ? x[i] + y[i] : 0.0f;
  return out;
}
"""


def test_real_load_inline_builds_light_and_is_cached(monkeypatch):
    """torch's own load_inline and headers (~6 s light on 2 cores, ~18 s as torch builds it):
    the light binding file holds for a C++ source, TORCH_CHECK still reaches Python as a
    RuntimeError, and a second call is a cache hit."""
    import torch

    calls = []

    @functools.wraps(cpp_extension.load_inline)
    def counted(*args, **kwargs):
        calls.append(kwargs.get("no_implicit_headers"))
        return cpp_extension.load_inline(*args, **kwargs)

    monkeypatch.setattr(inline, "_ORIGINAL", [counted])
    m = inline.cached_load_inline("assay_add_relu", ADD_RELU, functions=["add_relu"])
    a, b = torch.randn(1000), torch.randn(1000)
    assert torch.equal(m.add_relu(a, b), torch.relu(a + b))
    with pytest.raises(RuntimeError, match="the shapes differ"):
        m.add_relu(a, torch.randn(3))
    again = inline.cached_load_inline("assay_add_relu", ADD_RELU, functions=["add_relu"])
    assert torch.equal(again.add_relu(b, a), torch.relu(a + b))
    assert calls == [True]  # one build, the light one


KB_STYLE_CUDA = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

template <typename scalar_t>
__global__ void scale_add(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                          scalar_t* __restrict__ o, float alpha, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) o[i] = static_cast<scalar_t>(alpha * (float)a[i] + (float)b[i]);
}

__global__ void row_sum(const float* x, float* y, int cols) {
    extern __shared__ float part[];
    float acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += x[blockIdx.x * cols + c];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = part[0];
}

torch::Tensor scale_add_cuda(torch::Tensor a, torch::Tensor b, double alpha) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(a.sizes() == b.sizes(), "shape mismatch");
    auto out = torch::empty_like(a);
    const int64_t n = a.numel();
    const int blocks = (int)((n + 255) / 256);
    AT_DISPATCH_FLOATING_TYPES_AND_HALF(a.scalar_type(), "scale_add", ([&] {
        scale_add<scalar_t><<<blocks, 256>>>(a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                                             out.data_ptr<scalar_t>(), (float)alpha, n);
    }));
    return out;
}

std::vector<torch::Tensor> row_sum_cuda(torch::Tensor x) {
    x = x.contiguous().view({x.size(0), -1});
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
    auto y = torch::zeros({x.size(0)}, opts);
    auto spare = torch::empty({x.size(0), 1}, x.options());
    row_sum<<<(int)x.size(0), 256, 256 * sizeof(float)>>>(x.data_ptr<float>(),
                                                           y.data_ptr<float>(), (int)x.size(1));
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
    auto t = torch::matmul(x.t(), x).sum(1).reshape({-1}).unsqueeze(0);
    auto u = (y * 2 + 1) / (1.0 - y) - t.squeeze(0).slice(0, 0, 1);
    return {y, spare.squeeze(), t.to(torch::kFloat), u, y > 0.5};
}
"""


@pytest.mark.skipif(not shutil.which("nvcc"), reason="no nvcc")
def test_a_kernelbench_style_cuda_file_compiles_light(tmp_path):
    """The light CUDA file of a typical candidate (factories, a dispatch macro, tensor methods
    and arithmetic, TensorOptions, torch:: dtypes) compiles with nvcc against torch's real
    headers and the slim per-operator headers, host and device side (~9 s on 2 cores; ~25 s
    against torch/types.h)."""
    light = inline.light_sources({"cpp_sources": "", "cuda_sources": KB_STYLE_CUDA,
                                  "no_implicit_headers": False}, tmp_path / "inc")
    src = tmp_path / "cuda.cu"
    src.write_text("\n".join(light["cuda_sources"]))
    includes = [f"-I{p}" for p in light["extra_include_paths"]] + \
        [arg for p in cpp_extension.include_paths() for arg in ("-isystem", p)]
    proc = subprocess.run(["nvcc", *includes, "-std=c++17", "-Xcompiler", "-fPIC",
                           *cpp_extension.COMMON_NVCC_FLAGS, "-gencode=arch=compute_90,code=sm_90",
                           "-c", str(src), "-o", str(tmp_path / "cuda.o")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_broken_binding_file_is_built_light_then_as_written(builds):
    with pytest.raises(BuildError) as e:
        inline.cached_load_inline("ext_o", "4 +* 1", cuda_sources="__global__ void k() {}\n")
    assert len(builds) == 2 and "error" in e.value.log
