"""Logs say what matters: libkineto's USDT profiler_start/stop markers never reach stderr (and
nothing else written meanwhile is lost); the profile step says once that ncu is absent and
never that it ran it; clang-tidy is never skipped without a word."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from assay.verify.quiet import drop_markers

MARKERS = (b"USDT:2026-11-25 06:04:26 10988:10988 SyncActivityProfilerHandler.cpp:52] "
           b"profiler_start\n"
           b"USDT:2026-11-25 06:04:26 10988:10988 SyncActivityProfilerHandler.cpp:59] "
           b"profiler_stop\n")


def test_drop_markers_keeps_everything_else() -> None:
    other = b"[W kineto] CUPTI initialization failed\nUSDT: a line that is not a marker\n"
    assert drop_markers(MARKERS + other + MARKERS) == other
    assert drop_markers(b"no newline at the end") == b"no newline at the end"
    assert drop_markers(b"") == b""


def _stderr_of(body: str) -> str:
    code = textwrap.dedent("""
        import os, sys
        import torch
        from assay.verify.quiet import no_kineto_markers
        def profiled():
            with torch.autograd.profiler.profile(use_kineto=True):
                torch.ones(4) + 1
    """) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_torch_profiler_markers_silenced_at_the_source() -> None:
    # the markers exist without the guard (if torch stops writing them, this says so) ...
    assert "profiler_start" in _stderr_of("profiled()\n")
    # ... and are gone with it, while real stderr output (fd 2 and sys.stderr) is kept,
    # in order, also when the block raises
    err = _stderr_of("""
        print("before", file=sys.stderr, flush=True)
        with no_kineto_markers():
            profiled()
            os.write(2, b"a real error from C++\\n")
            print("a Python warning", file=sys.stderr)
        try:
            with no_kineto_markers():
                profiled()
                raise RuntimeError("boom")
        except RuntimeError:
            print("after", file=sys.stderr, flush=True)
    """)
    assert "USDT" not in err and "profiler_st" not in err, err
    assert err.splitlines() == ["before", "a real error from C++", "a Python warning", "after"]


def test_profile_says_why_a_tool_does_not_run(monkeypatch) -> None:
    import shutil

    import pytest

    from assay.app import UserError
    from assay.steps.profile import tool_missing

    monkeypatch.setattr(shutil, "which", lambda name: None)  # neither tool installed
    assert tool_missing("ncu", "auto", "cpu") == (
        "ncu: not run, the target is cpu (ncu profiles GPU kernels)")
    assert "ncu is not on PATH" in tool_missing("ncu", "auto", "cuda")
    why = tool_missing("clang-tidy", "auto", "cpu")
    assert "clang-tidy is not on PATH" in why and "apt-get install -y clang-tidy" in why
    assert tool_missing("clang-tidy", "off", "cpu") == "clang-tidy: off (profile.clang_tidy=off)"
    with pytest.raises(UserError, match="profile.clang_tidy=on but clang-tidy"):
        tool_missing("clang-tidy", "on", "cpu")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert tool_missing("clang-tidy", "auto", "cpu") is None
    assert tool_missing("ncu", "on", "cuda") is None


def test_clang_tidy_reads_the_synthesizers_cpp() -> None:
    """The offline synthesizer's C++ (its real preamble: OpenMP's omp.h) is analysed, not
    stopped by a missing header: findings or "no findings", never a compiler error."""
    import shutil

    import pytest
    from jinja2 import Template

    from assay.profile.tools import clang_tidy
    from assay.propose.offline.families.shared import CPP_PREAMBLE

    if shutil.which("clang-tidy") is None:
        pytest.skip("clang-tidy absent (apt-get install -y clang-tidy libomp-dev; CI does)")
    cpp = Template(CPP_PREAMBLE).render(template="elementwise", summary="relu",
                                        knob_line="threads=2", helpers="") + """
extern "C" int assay_forward(const float* x, float* y, long n) {
  #pragma omp parallel for num_threads(assay_threads(2))
  for (long i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
  return 0;
}
"""
    code = f'import torch\ncpp_src = r"""\n{cpp}"""\n'
    out = clang_tidy(code, "cpu")
    assert out, out
    assert "clang-diagnostic-error" not in out and "file not found" not in out, out
    assert "readability-braces-around-statements" in out  # the unbraced for body


def test_a_baseline_still_noisy_after_its_retries_is_named_in_the_log(tmp_path, monkeypatch,
                                                                       caplog):
    """A busy machine times eager with an IQR of most of its median (seen: 4.0 ms on 5.8):
    the baseline step says so, with the command that re-times it, instead of leaving every
    speedup against it to look earned."""
    import logging

    import assay.bench.baseline
    from assay.app import compose
    from assay.layout import Campaign, write_json
    from assay.steps import baseline as step

    results = tmp_path / "results"
    c = Campaign.at(results, "unit")
    write_json(c.task_record("L1_1_ReLU"), {"id": "L1_1_ReLU", "level": 1, "error": None})
    monkeypatch.setattr(assay.bench.baseline, "time_reference", lambda *a, **k: {
        "eager_ms": 5.8, "eager_iqr_ms": 4.0, "compile_ms": 1.0, "compile_iqr_ms": 0.01})
    cfg = compose([f"results_dir={results}", "campaign=unit", "task=L1_1_ReLU", "target=cpu"])
    with caplog.at_level(logging.WARNING, logger="assay.baseline"):
        step.baseline(cfg)
    noisy = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(noisy) == 1 and "eager timed at 5.8 ms with an IQR of 69%" in noisy[0], noisy
    assert "--forcerun" in noisy[0] and "baselines/L1_1_ReLU.json" in noisy[0]
