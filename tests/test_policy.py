"""Unit tests of the policy audit (verify/policy.py) on profiler rows made by hand: what ran, and
whether the strict and permissive policies allow it."""

from __future__ import annotations

import pytest

from assay.verify.policy import audit, compute_ops, profile_rows, reference_fallback
from assay.verify.settings import Policy


def op(name: str, cpu_us: float = 10.0) -> dict:
    return {"name": name, "kind": "op", "cpu_us": cpu_us, "device_us": 0.0, "count": 3}


def kernel(name: str, device_us: float) -> dict:
    return {"name": name, "kind": "kernel", "cpu_us": 0.0, "device_us": device_us, "count": 3}


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


def test_the_cpu_library_share_is_the_median_of_the_timed_calls_shares():
    """Host time summed over calls is swayed by one preempted call (0.96 read as 0.17 beside
    another test worker: one 1 us aten::to that took 3 ms); each call's own share is not."""
    calls = [[op("aten::clamp", 20.0), op("aten::to", 1.0)] for _ in range(99)]
    calls.append([op("aten::clamp", 20.0), op("aten::to", 3000.0)])  # preempted once
    merged = [op("aten::clamp", 2000.0), op("aten::to", 3099.0)]
    assert audit(merged, "cpu", Policy.permissive).library_time_frac < 0.4  # the sum's share
    a = audit(merged, "cpu", Policy.permissive, calls=calls)
    assert a.ok and a.library_time_frac == pytest.approx(20.0 / 21.0)
    b = audit(merged, "cpu", Policy.permissive, max_library_frac=0.5, calls=calls)
    assert not b.ok and "95%" in b.detail  # the ceiling is held against the median
    # calls whose rows took no time are left out; none at all: the merged rows' share
    assert audit(merged, "cpu", Policy.permissive, calls=[[], *calls]).library_time_frac \
        == pytest.approx(20.0 / 21.0)
    assert audit(merged, "cpu", Policy.permissive, calls=[[]]).library_time_frac < 0.4


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


def test_views_a_candidate_makes_for_its_kernels_are_memory_ops():
    """A permuted, indexed or unfolded view (sizes and strides only: ViT's patches) is no
    compute under strict; a copy of an unfold (``unfold_copy``) computes."""
    views = [op("aten::permute"), op("aten::select"), op("aten::unfold")]
    assert audit(MOVEMENT + views, "cpu", Policy.strict).ok
    assert compute_ops(views + [op("aten::unfold_copy")]) == {"aten::unfold_copy"}


def test_reference_fallback_refuses_a_call_running_every_reference_op():
    ref = ["aten::mm", "aten::relu"]
    ok, why = reference_fallback(MOVEMENT + [op("aten::mm"), op("aten::relu")], ref)
    assert not ok and "aten::mm" in why and "reference" in why
    assert reference_fallback(MOVEMENT + [op("aten::mm")], ref) == (True, "")  # a part only
    ok, why = reference_fallback(MOVEMENT, [])
    assert ok and "no ATen compute op" in why


# --- Triton kernels (target=triton) -----------------------------------------------------------

TRITON_CANDIDATE = '''
import triton
import triton.language as tl
from triton import jit

@triton.autotune(configs=[triton.Config({"BLOCK": 256})], key=["n"])
@triton.jit
def triton_gelu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pass

@jit
def fused_gemm_relu(a, b, c):
    pass

@triton.jit(do_not_specialize=["n"])
def triton_poi_fused_relu_0(x, n):
    pass

def helper():
    pass
'''


def test_the_candidates_triton_kernels_are_read_from_its_source():
    from assay.verify.policy import triton_kernels

    assert triton_kernels(TRITON_CANDIDATE) == {"triton_gelu", "fused_gemm_relu",
                                                "triton_poi_fused_relu_0"}
    assert triton_kernels("def broken(:") == frozenset()


def test_own_triton_kernels_count_as_the_candidates_work_and_inductors_stay_library():
    """Triton names a kernel after its function: the candidate's `triton_gelu` and
    `fused_gemm_relu` are its own (its file defines them), torch.compile's `triton_poi_...`
    and cuBLAS's kernels stay library even when the file defines a decoy of that name."""
    from assay.verify.policy import is_library, triton_kernels

    own = triton_kernels(TRITON_CANDIDATE) | {"nvjet_tst_128x64_64x4_1x2_h_bz_NNT"}
    assert not is_library("triton_gelu", own) and is_library("triton_gelu")
    assert not is_library("fused_gemm_relu", own) and is_library("fused_gemm_relu")
    assert is_library("triton_poi_fused_relu_0", own)  # inductor's form, whatever the file says
    assert is_library("nvjet_tst_128x64_64x4_1x2_h_bz_NNT", own)  # a vendor's mark
    assert not is_library("add_kernel", own) and not is_library("add_kernel")
    rows = [kernel("triton_gelu", 5.0), kernel("Memset (Device)", 0.5)]
    assert audit(rows, "cuda", Policy.strict, own=own).ok
    assert not audit(rows, "cuda", Policy.strict).ok  # another file's kernel of that name
    compiled = rows + [kernel("triton_poi_fused_relu_0", 4.0)]
    a = audit(compiled, "cuda", Policy.strict, own=own)
    assert not a.ok and "triton_poi_fused_relu_0" in a.detail
    only_inductor = [kernel("triton_poi_fused_relu_0", 4.0)]
    assert audit(only_inductor, "cuda", Policy.permissive, own=own).detail == \
        "no custom kernel ran on the device"


def test_interpreted_triton_launches_are_listed_and_part_of_a_calls_signature():
    """On cpu, Triton's interpreter runs a kernel in numpy, which the profiler does not see;
    the worker's range `triton::<kernel>` around each launch lists it, counts its time in the
    library share's total, and makes a call that skipped it run different code."""
    from assay.verify.policy import audit_consistency, call_signature

    launch = {"name": "triton::gelu_kernel", "kind": "interpreted", "cpu_us": 90.0,
              "device_us": 0.0, "count": 1}
    a = audit(MOVEMENT + [launch], "cpu", Policy.strict)
    assert a.ok and "triton::gelu_kernel" in a.kernels
    b = audit([launch, op("aten::erf", 10.0)], "cpu", Policy.permissive)
    assert b.ok and b.library_time_frac == pytest.approx(0.1)
    assert call_signature([launch], "cpu") == ("triton::gelu_kernel",)
    calls = [{"phase": "timed", "rows": [launch]}, {"phase": "timed", "rows": MOVEMENT}]
    ok, detail = audit_consistency({"expected": 2, "found": 2, "calls": calls}, "cpu")
    assert not ok and "triton::gelu_kernel" in detail


def test_profile_rows_are_the_busiest_on_the_devices_clock_with_short_names():
    rows = [kernel("small", 1.0), kernel("big_" + "x" * 300, 50.0), op("aten::empty", 40.0)]
    cuda = profile_rows(rows, "cuda:0", limit=2)
    assert [r["name"][:4] for r in cuda] == ["big_", "smal"] and len(cuda[0]["name"]) == 200
    assert cuda[0] == {"name": cuda[0]["name"], "kind": "kernel", "count": 3,
                       "device_us": 50.0, "cpu_us": 0.0}
    assert [r["name"] for r in profile_rows(rows, "cpu")][0] == "aten::empty"
    with pytest.raises(KeyError):  # a row without its count is a malformed report
        profile_rows([{"name": "k", "device_us": 1.0, "cpu_us": 0.0}], "cuda")
