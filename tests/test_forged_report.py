"""The harness's rule for a worker report the candidate cut (issue #19): the job asked for the
audit, so a report without it, or without the kernel rows of its timed calls, was rewritten.
The worker-level exploits are zoo cases (exploit_forged_report_without_audit, cpu and cuda);
these are the rule's branches on hand-made reports."""

from __future__ import annotations

from types import SimpleNamespace

from assay.records import Verdict
from assay.verify.harness import _check_audit_present

PREP = SimpleNamespace(device="cpu")
ROWS = [{"name": "aten::empty_like", "kind": "op", "count": 1, "device_us": 0.0, "cpu_us": 1.0}]
AUDIT = {"expected": 3, "found": 3, "phases": {"timed": 2, "timed_verified": 1},
         "calls": [{"phase": "timed", "rows": ROWS}, {"phase": "timed", "rows": ROWS},
                   {"phase": "timed_verified", "rows": ROWS}]}


def judged(result: dict) -> dict:
    v = Verdict(candidate="c", task="t", device="cpu", policy="strict")
    _check_audit_present(v, result, PREP)
    return {k: (c["passed"], c["detail"]) for k, c in v.checks.items()}


def test_an_intact_audit_is_judged_as_before():
    found = judged({"audit": AUDIT, "kernels": ROWS})
    assert found == {"audit_consistency": (True, "3 timed calls audited, all running the same "
                                                 "code")}


def test_a_report_without_the_audit_was_rewritten():
    for result in ({}, {"kernels": ROWS}, {"audit": "cut", "kernels": ROWS}):
        passed, detail = judged(result)["audit_consistency"]
        assert not passed and "carries no audit" in detail, result


def test_an_audit_without_its_kernel_rows_was_rewritten():
    found = judged({"audit": AUDIT})
    assert found["audit_consistency"][0]
    assert not found["kernel_audit"][0] and "without their kernel rows" in found["kernel_audit"][1]


def test_a_broken_audit_is_the_consistency_checks_finding_alone():
    found = judged({"audit": {"error": "the profiler could not be read back"}})
    assert found == {"audit_consistency": (False, "the profiler could not be read back")}


def test_a_report_without_the_tamper_list_is_malformed():
    """Every worker that finishes writes the tamper list and the settings changes: a report
    without either was cut, and the harness fails closed (a malformed report, not a pass)."""
    from assay.verify.harness import _check_integrity, _Malformed

    v = Verdict(candidate="c", task="t", device="cpu", policy="strict")
    _check_integrity(v, {"tampered": [], "settings_changes": []}, False)
    assert v.checks["harness_integrity"]["passed"] and v.checks["global_state"]["passed"]
    for cut in ({"settings_changes": []}, {"tampered": []},
                {"tampered": "none", "settings_changes": []}):
        v = Verdict(candidate="c", task="t", device="cpu", policy="strict")
        try:
            _check_integrity(v, cut, False)
        except (KeyError, _Malformed):
            continue
        raise AssertionError(f"accepted a report without its lists: {cut}")
