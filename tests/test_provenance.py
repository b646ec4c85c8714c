"""audit_provenance (assay.verify.provenance): the harness reads the candidate's libraries
itself, so a worker report that credits the candidate with a kernel no library built for it
defines is refused. Real libraries are built with g++ (and nvcc where it is installed); the
cuda verdicts themselves run on a GPU (tests/zoo_cuda/, tests/test_gpu.py)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from assay.bench.build import build, nvcc_path
from assay.records import Verdict
from assay.verify import policy, provenance
from assay.verify.harness import _check_provenance
from assay.verify.worker import mapped_libraries

CPP = r"""
#include <cstdint>
namespace ns { template <int B> void tile_kernel(float* y) { y[0] = B; } }
void gelu_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
}
template void ns::tile_kernel<128>(float*);
#define KEEP __attribute__((noinline, used))
namespace { KEEP void hidden_kernel(float* y) { y[0] = 2; } }
KEEP static void static_kernel(float* y) { y[0] = 3; }
extern "C" void plain_c_kernel(float* y) {
  ns::tile_kernel<128>(y);
  hidden_kernel(y);
  static_kernel(y);
}
"""
CUDA = r"""
#include <cstdint>
#include <cuda_runtime.h>
namespace ns { template <int B> __global__ void tile_kernel(float* y) { y[threadIdx.x] = B; } }
__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  y[0] = x[0];
}
extern "C" __global__ void plain_c_kernel(float* y) { y[0] = 1; }
namespace { __global__ void hidden_kernel(float* y) { y[0] = 2; } }
static __global__ void static_kernel(float* y) { y[0] = 3; }
extern "C" int launch(const float* x, float* y, int64_t n, cudaStream_t s) {
  gelu_kernel<<<1, 1, 0, s>>>(x, y, n);
  ns::tile_kernel<128><<<1, 1, 0, s>>>(y);
  plain_c_kernel<<<1, 1, 0, s>>>(y);
  hidden_kernel<<<1, 1, 0, s>>>(y);
  static_kernel<<<1, 1, 0, s>>>(y);
  return (int)cudaGetLastError();
}
"""
# As the profiler names them (demangled), and names no build of the above holds.
REAL = ["gelu_kernel(float const*, float*, long)", "void ns::tile_kernel<128>(float*)",
        "plain_c_kernel", "(anonymous namespace)::hidden_kernel(float*)", "static_kernel(float*)"]
FORGED = ["softmax_rows_kernel(float const*, float*, int, int)", "gelu_kernel2(float*)",
          "void ns::tile<128>(float*)"]


def row(name: str, device_us: float = 5.0) -> dict:
    return {"name": name, "kind": "kernel", "count": 1, "device_us": device_us, "cpu_us": 0.0}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "kernels"
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(d))
    monkeypatch.delenv("ASSAY_SANDBOX_PRIVATE_CACHE", raising=False)
    return d


def test_kernel_identifier():
    assert provenance.kernel_identifier("gelu_kernel(float const*, float*, long)") == "gelu_kernel"
    assert provenance.kernel_identifier("void ns::tile_kernel<128, float>(float*)") == "tile_kernel"
    assert provenance.kernel_identifier(
        "void (anonymous namespace)::softmax_warp_forward<float, float, 10>(float*)") \
        == "softmax_warp_forward"
    assert provenance.kernel_identifier("plain_c_kernel") == "plain_c_kernel"
    assert provenance.kernel_identifier("add_kernel") == "add_kernel"
    assert provenance.kernel_identifier("(float*)") is None


def test_defines_plain_and_mangled_names_only_whole():
    blob = (b"\0_Z11gelu_kernelPKfPfl\0_ZN2ns11tile_kernelILi128EEEvPf\0plain_c_kernel\0"
            b"_ZN12_GLOBAL__N_113hidden_kernelEPf\0")
    for ident in ("gelu_kernel", "tile_kernel", "plain_c_kernel", "hidden_kernel"):
        assert provenance.defines(blob, ident), ident
    for ident in ("gelu", "kernel", "gelu_kerne", "elu_kernel", "plain_c", "c_kernel"):
        assert not provenance.defines(blob, ident), ident


def test_artifacts_are_elf_files_in_scratch_or_reported_from_the_cache(cache, tmp_path):
    lib = build(CPP, "cpp")
    scratch = tmp_path / "scratch"
    (scratch / ".triton" / "cache").mkdir(parents=True)
    shutil.copy(lib, scratch / ".triton" / "cache" / "k.cubin")  # an ELF in scratch counts
    (scratch / "names.txt").write_text(" ".join(FORGED))  # a text file naming kernels does not
    outside = tmp_path / "elsewhere.so"
    shutil.copy(lib, outside)
    found = provenance.artifacts(scratch, cache, [str(lib), str(outside), "relative.so", 7])
    assert found == [Path(lib).resolve(), (scratch / ".triton/cache/k.cubin").resolve()]
    assert provenance.artifacts(scratch / "none", cache, [str(outside)]) == []


def test_proven_refuses_names_no_artifact_defines(cache):
    lib = Path(build(CPP, "cpp"))
    ok, detail = provenance.proven(REAL, [lib])
    assert ok, detail
    assert lib.name in detail
    for name in FORGED:
        ok, detail = provenance.proven(REAL + [name], [lib])
        assert not ok and name in detail and "1 kernel(s)" in detail, (name, detail)
    assert not provenance.proven(REAL, [])[0]  # no library at all
    assert provenance.proven([], [])[0]  # nothing credited, nothing to prove


def test_credited_is_what_the_kernel_audit_counts_as_the_candidates():
    rows = [row("gelu_kernel(float const*, float*, long)"),
            row("sm90_xmma_gemm_f32f32_tn_n", 50.0),  # a library's: the audit judges it
            row("Memcpy DtoD (Device -> Device)", 1.0),
            row("idle_kernel(float*)", 0.0),  # ran no device time
            {"name": "aten::softmax", "kind": "op", "count": 1, "device_us": 0.0, "cpu_us": 3.0}]
    assert provenance.credited(rows, policy.LIBRARY_KERNEL) == \
        ["gelu_kernel(float const*, float*, long)"]


def test_the_worker_reports_the_cache_libraries_it_mapped(cache):
    lib = build(CPP, "cpp")
    ctypes.CDLL(str(lib))
    assert str(Path(lib).resolve()) in mapped_libraries(cache)
    assert all(p.startswith(str(cache.resolve()) + "/") for p in mapped_libraries(cache))


def test_the_harness_records_audit_provenance_from_disk(cache, tmp_path):
    """The harness's side: the report's kernels against the libraries it names and the
    scratch folder, read by the harness (a forged report can only point at real files)."""
    lib = build(CPP, "cpp")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    w = SimpleNamespace(scratch=scratch)

    def judge(kernels, libraries):
        v = Verdict(candidate="c", task="t", device="cuda", policy="strict")
        _check_provenance(v, {"kernels": kernels, "libraries": libraries}, w)
        return v.checks["audit_provenance"]

    assert judge([row(REAL[0])], [str(lib)])["passed"]
    forged = judge([row(FORGED[0])], [str(lib)])
    assert not forged["passed"] and "softmax_rows_kernel" in forged["detail"]
    assert not judge([row(REAL[0])], [])["passed"]  # the library the report leaves out
    assert judge([row("sm90_xmma_gemm_f32f32_tn_n")], [])["passed"]  # kernel_audit's to judge


@pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
def test_nvcc_libraries_name_their_kernels(cache):
    """nvcc keeps each kernel's (mangled) name in the host library, beside the fatbin."""
    lib = Path(build(CUDA, "cuda"))
    ok, detail = provenance.proven(REAL, [lib])
    assert ok, detail
    assert not provenance.proven(FORGED[:1], [lib])[0]


def test_reading_stops_at_the_byte_budget(cache, monkeypatch):
    """The scratch folder is the candidate's: the harness reads a bounded number of bytes."""
    lib = Path(build(CPP, "cpp"))
    monkeypatch.setattr(provenance, "MAX_TOTAL_BYTES", 1)
    assert provenance.proven(REAL[:1], [lib])[0]  # the first file is read whole
    ok, detail = provenance.proven(REAL[:1] + FORGED[:1], [lib, lib])
    assert not ok and "(1 read)" in detail


def test_the_sandboxed_worker_reports_the_library_it_loaded():
    """The real worker, in the verifier's sandbox: its report names the kernel-cache library
    the candidate loaded, and the harness finds the candidate's entry point in it."""
    from assay.profile.tools import sandboxed_worker
    from assay.verify.sandbox.host import kernel_cache
    from test_zoo import ZOO, prepared, zoo_config, zoo_task

    prep = prepared(zoo_task("level1/3_softmax"))
    cand = ZOO / "candidates" / "honest_softmax_cpp.py"
    with sandboxed_worker(prep, cand, zoo_config({"POLICY": "strict", "CONFIG": {}})) \
            as (outcome, report, scratch):
        assert report is not None and "error" not in report, (outcome, report)
        libs = report["libraries"]
        files = provenance.artifacts(scratch, kernel_cache(scratch)[0], libs)
    assert libs and all(Path(p).suffix == ".so" for p in libs), libs
    assert provenance.proven(["softmax"], files)[0], (libs, files)
    assert not provenance.proven(["softmax_rows_kernel"], files)[0]
