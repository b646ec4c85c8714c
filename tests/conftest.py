"""Shared test fixtures: repo paths, task-file writers, a private kernel cache."""

from __future__ import annotations

import importlib.util
import os
import re
import textwrap
from pathlib import Path

# GPU tests spread over a machine's GPUs: with pytest-xdist and GPU_TESTS_SPREAD=N, worker gwK
# sees the (K mod N)-th visible GPU only (set before torch touches CUDA: `-n N` on a machine of
# N GPUs runs the cuda zoo N times as fast, no test sharing a GPU's timing with another)
if os.environ.get("GPU_TESTS_SPREAD") and (m := re.fullmatch(
        r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))):
    from assay.gpu import visible_gpus  # (no torch: CUDA_VISIBLE_DEVICES, else nvidia-smi)

    _spread = int(os.environ["GPU_TESTS_SPREAD"])
    _ids = visible_gpus()[:_spread] or [str(k) for k in range(_spread)]
    os.environ["CUDA_VISIBLE_DEVICES"] = _ids[int(m[1]) % len(_ids)]

# pytest-xdist's workers share the cores: each gets its share for the OpenMP teams of its tests
# (its own, and its subprocesses': campaigns, sandbox workers, the naive harness), unless the
# caller set OMP_NUM_THREADS. A team larger than the free cores waits at each barrier for a
# thread the kernel has descheduled (assay.gpu.hold_cpu_threads); on CI's two cores, `-n 2`
# took 1498 s on two threads a worker and 981 s on one
# (docs/evidence/2026-12-06-cpu-suite-threads.md).
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    _share = len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(max(1, _share))

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import REPO  # noqa: F401 - `from conftest import REPO` in older tests


# The longest tests (minutes each on CI's two cores), longest first: pytest-xdist hands tests out
# in collection order, so these start first and the two workers end together rather than one
# finishing a campaign alone at the end. The other tests of their modules follow them (a module's
# fixtures are made once where its tests run in a row), then the other `slow` tests, then the
# rest, each in file order. An entry gone stale costs only balance.
LONGEST_FIRST = (
    "tests/test_pipeline.py::test_readme_recipes_on_the_ci_campaign",
    "tests/test_pipeline.py::test_killed_campaign_resumes_without_losing_or_redoing_work",
    "tests/test_triton_campaign.py::test_a_triton_campaign_runs_end_to_end",
    "tests/test_bad_tasks.py::test_campaign_over_bad_and_good_tasks_finishes_the_good_ones",
    "tests/test_kill_resume.py::test_ten_sigkills_at_random_points_leave_the_same_archive",
    "tests/test_evolution_llm.py::test_evolution_with_two_llm_backends",
    "tests/test_install.py::test_installed_wheel_runs_the_ci_campaign",
    "tests/test_offline.py::test_cuda_gemm_candidates_compile",
    "tests/test_offline.py::test_cuda_gemm_corners_compile",
    "tests/test_offline.py::test_cuda_candidates_compile",
)


def _start_order(items) -> dict:
    """item -> its place in the start order (see LONGEST_FIRST)."""
    rank = {}
    for item in items:
        name = item.nodeid.split("[")[0]
        rank[item] = (LONGEST_FIRST.index(name) if name in LONGEST_FIRST
                      else len(LONGEST_FIRST) + ("slow" not in item.keywords))
    module, first = {}, {}
    for i, item in enumerate(items):
        path = item.nodeid.split("::")[0]
        module[path] = min(module.get(path, rank[item]), rank[item])
        first.setdefault(path, i)
    return {item: (module[path], first[path], rank[item])
            for item in items for path in [item.nodeid.split("::")[0]]}


def _name_xdist_groups(config, items) -> None:
    """`--dist loadgroup` on a pytest-xdist worker: the `@group` suffix on the node ids of
    xdist_group tests, which the controller schedules by. pytest-xdist 3.8 sets it in
    `item._nodeid`, which pytest 9 no longer reads (node ids live in `item._id`), so its groups
    were silently ignored. Harmless where xdist did it already (the last `@` counts)."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and not item.nodeid.endswith("@" + "_".join(names)):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


def pytest_collection_modifyitems(config, items):
    order = _start_order(items)
    items.sort(key=order.__getitem__)  # stable: file order within each rank
    _name_xdist_groups(config, items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _threads_back():
    """Each test leaves this worker's thread count as it found it: `assay verify` called in
    process (assay.cli.main) holds the campaign's threads for its process, as a step does, and
    a later test of the same worker (say, one that checks a candidate changing the thread count
    is caught) must not start from its setting."""
    before = torch.get_num_threads()
    env = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                          "TORCHINDUCTOR_COMPILE_THREADS")}
    yield
    for var, value in env.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture
def offline_builds(monkeypatch, tmp_path_factory):
    """Kernel builds of the synthesizer's tests: one cache for the session's tests (a kernel
    built once), CUDA sources for sm_90 (compiled here, run on the H100/H200)."""
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kernels"))
    monkeypatch.setenv("ASSAY_CUDA_ARCH", "sm_90")


@pytest.fixture
def forked_workers(monkeypatch):
    """Workers forked from the zygote (torch imported once), the default on every device
    (assay.verify.sandbox.zygote), whatever the caller's environment says: for tests that
    check it (helpers.assert_forked: a verdict's worker was forked)."""
    monkeypatch.setenv("ASSAY_SANDBOX_ZYGOTE", "1")


@pytest.fixture
def exec_workers(monkeypatch):
    """A fresh interpreter per worker (``ASSAY_SANDBOX_ZYGOTE=0``, the exec path): the path
    every worker takes where the zygote cannot start, met by a sample of the zoo
    (test_zoo_verdict_on_exec_workers) and by tests/test_zygote.py."""
    monkeypatch.setenv("ASSAY_SANDBOX_ZYGOTE", "0")


@pytest.fixture
def write_file(tmp_path):
    """write_file("name.py", source) -> Path; dedents the source."""
    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        return path
    return write


def import_file(code: str, path: Path):
    """Write ``code`` to ``path`` and import it as a module (a candidate file, say)."""
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
