"""Unit tests of the policy audit (verify/policy.py) on profiler rows made by hand: what ran, and
whether the strict and permissive policies allow it."""

from __future__ import annotations

import pytest

from assay.verify.policy import audit, compute_ops, reference_fallback
from assay.verify.settings import Policy


def op(name: str, cpu_us: float = 10.0) -> dict:
    return {"name": name, "kind": "op", "cpu_us": cpu_us, "device_us": 0.0}


def kernel(name: str, device_us: float) -> dict:
    return {"name": name, "kind": "kernel", "cpu_us": 0.0, "device_us": device_us}


MOVEMENT = [op("aten::empty_like"), op("aten::contiguous"), op("aten::view")]


@pytest.mark.parametrize("policy", [Policy.strict, "strict"])
def test_strict_on_cpu_allows_memory_ops_and_refuses_aten_compute(policy):
    assert audit(MOVEMENT, "cpu", policy).ok
    a = audit(MOVEMENT + [op("aten::mm"), op("aten::relu")], "cpu", policy)
    assert not a.ok and "strict" in a.detail and "aten::mm" in a.detail
    assert "aten::relu" in a.detail


def test_permissive_on_cpu_reports_the_library_share_against_its_ceiling():
    rows = [op("aten::empty_like", 30.0), op("aten::mm", 70.0)]
    a = audit(rows, "cpu", Policy.permissive, max_library_frac=1.0)
    assert a.ok and a.library_time_frac == pytest.approx(0.7) and "70%" in a.detail
    b = audit(rows, "cpu", Policy.permissive, max_library_frac=0.5)
    assert not b.ok and "70%" in b.detail and "50%" in b.detail


def test_strict_on_cuda_allows_own_kernels_and_copies_only():
    own = [kernel("relu_kernel(float const*, float*, long)", 5.0),
           kernel("Memcpy DtoD (Device -> Device)", 1.0)]
    a = audit(own, "cuda:0", Policy.strict)
    assert a.ok and a.library_time_frac == 0.0 and "relu_kernel" in a.kernels[0]
    gemm = own + [kernel("sm90_xmma_gemm_f32f32_tf32f32", 10.0)]
    b = audit(gemm, "cuda:0", Policy.strict)
    assert not b.ok and "library kernels" in b.detail and "xmma" in b.detail
    assert b.library_time_frac == pytest.approx(10.0 / 16.0)


def test_cuda_without_a_custom_kernel_is_refused_under_both_policies():
    only_library = [kernel("cublasLt::gemm_kernel", 10.0), kernel("Memset (Device)", 0.5)]
    for policy in Policy:
        a = audit(only_library, "cuda", policy)
        assert not a.ok and a.detail == "no custom kernel ran on the device", policy
    assert not audit([], "cuda", Policy.permissive).ok  # nothing ran at all


def test_permissive_on_cuda_counts_library_time_but_not_copies():
    rows = [kernel("epilogue_bias_relu", 2.0), kernel("ampere_sgemm_128x64_nn", 6.0),
            kernel("Memcpy HtoD (Pageable -> Device)", 2.0)]
    a = audit(rows, "cuda", Policy.permissive, max_library_frac=1.0)
    assert a.ok and a.library_time_frac == pytest.approx(0.6)
    assert not audit(rows, "cuda", Policy.permissive, max_library_frac=0.5).ok


def test_an_unknown_policy_is_refused():
    a = audit(MOVEMENT, "cpu", "lenient")
    assert not a.ok and "lenient" in a.detail


def test_compute_ops_leaves_out_memory_ops_and_odd_rows():
    rows = MOVEMENT + [op("aten::softmax"), {"name": None}, {"kind": "op"},
                       kernel("k", 1.0)]
    assert compute_ops(rows) == {"aten::softmax"}


def test_reference_fallback_refuses_a_call_running_every_reference_op():
    ref = ["aten::mm", "aten::relu"]
    ok, why = reference_fallback(MOVEMENT + [op("aten::mm"), op("aten::relu")], ref)
    assert not ok and "aten::mm" in why and "reference" in why
    assert reference_fallback(MOVEMENT + [op("aten::mm")], ref) == (True, "")  # a part only
    ok, why = reference_fallback(MOVEMENT, [])
    assert ok and "no ATen compute op" in why
