"""The profile step's runs use the lightest protocol the worker runs (profile.tools.light): a
profile is not a verdict, and at KernelBench's sizes the full protocol's eight input sets and
their references were most of the step's time."""

from __future__ import annotations

from assay.profile.tools import light, torch_profile
from assay.verify.reference import prepare
from test_zoo import CASES, zoo_config, zoo_task

CASE = CASES["honest_gelu_cpp"]


def test_light_keeps_two_correctness_sets_one_timing_buffer_and_no_swapped_set():
    full = zoo_config(CASE)
    cfg = light(full)
    assert len(full.input_distributions) == 3 and (full.timing_sets, full.swap_sets) == (3, 2)
    assert len(cfg.input_distributions) == 2 and (cfg.timing_sets, cfg.swap_sets) == (1, 0)
    assert cfg.policy == full.policy and cfg.min_runs == full.min_runs  # the rest as verified
    assert light(cfg) == cfg


def test_a_profile_run_on_the_light_protocol_profiles_the_candidate():
    task = zoo_task(CASE["TASK"])
    cfg = light(zoo_config(CASE))
    prep = prepare(task, "cpu", cfg)
    assert len({*prep.check_sets, *prep.timing_sets, *prep.swap_sets}) == 3
    text = torch_profile(prep, CASE["path"], cfg)
    assert text and not text.startswith("profile run failed"), text
    assert text.splitlines()[0].split()[:2] == ["name", "calls"], text


def test_a_profile_run_draws_its_sets_where_the_memory_plan_draws(tmp_path):
    """The profile's worker draws each set from its seed as the verifier's does (transfer
    draw), with only the parameters in a file arena in its scratch folder: the host input
    arena of every set, copied to the host and back, was 5 s per GB of a set in the profile
    step on an H200. On the host transfer it still takes the host arena."""
    import dataclasses

    from assay.verify.harness import worker_job
    from assay.verify.settings import Transfer

    task = zoo_task(CASE["TASK"])
    cfg = light(zoo_config(CASE))
    for transfer in (Transfer.draw, Transfer.host):
        prep = prepare(task, "cpu", dataclasses.replace(cfg, transfer=transfer))
        scratch = tmp_path / transfer.value
        scratch.mkdir()
        job = worker_job(prep, scratch / "candidate.py", cfg)
        if transfer == Transfer.draw:
            assert job["sets"] == [] and job["draw"]["seeds"] == prep.seeds, job.keys()
            assert job["arenas"]["in"]["path"].startswith(str(scratch)), job["arenas"]
        else:
            assert "draw" not in job and len(job["sets"]) == len(prep.sets)
            assert not job["arenas"]["in"]["path"].startswith(str(scratch)), job["arenas"]


def test_the_profile_step_builds_the_kernels_before_it_takes_the_device(tmp_path, monkeypatch):
    """A candidate judged on another machine has no kernels in this one's build cache: the
    profile step builds them in the compile service (sandboxed, on the CPU cores) before it
    takes the device for ncu, so the profiled worker's first call does not."""
    import assay.profile.tools
    import assay.verify.harness
    from assay import app
    from assay.bench.build import is_cached
    from assay.steps import profile as step
    from fake_results import make_fake_campaign

    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path / "kernels"))
    c = make_fake_campaign(tmp_path / "results", "unit", llms=("offline",), tasks=1, gens=1)
    (task,) = [p.name for p in (c.root / "offline").iterdir() if p.is_dir()]
    source = 'extern "C" int seven() { return 7; }\n'
    for path in c.root.glob(f"offline/{task}/gen_0/candidates/*.py"):  # the best among them
        path.write_text("from assay.bench.build import load_library\n"
                        f"SOURCE = {source!r}\n_lib = load_library(SOURCE, 'cpp')\n")
    order = []
    monkeypatch.setattr(step, "tool_missing",
                        lambda name, mode, target: None if name == "ncu" else "off")
    monkeypatch.setattr(app, "on_device", lambda cfg: order.append(("device", is_cached(source))))
    monkeypatch.setattr(assay.verify.harness, "prepare", lambda *a, **k: "prepared")
    monkeypatch.setattr(assay.profile.tools, "ncu_profile",
                        lambda prep, path, *a, **k: order.append(("ncu", is_cached(source))))
    cfg = app.compose([f"results_dir={tmp_path / 'results'}", "campaign=unit", f"task={task}",
                       "llm=offline", "target=cuda", "profile.torch_profiler=false"])
    out = step.profile(cfg)
    assert order == [("device", True), ("ncu", True)], order
    assert out["times"]["build_s"] > 0


def test_ncu_profiles_only_a_best_kernel_as_fast_as_ncu_min_speedup(tmp_path, monkeypatch):
    """``profile.ncu_min_speedup``: the step takes neither the device nor ncu's time for a best
    kernel slower than that over eager (a campaign of hundreds of tasks keeps the device for
    the kernels worth studying); at 0, the default, every task's best is profiled."""
    import assay.profile.tools
    import assay.verify.harness
    from assay import app
    import assay.verify.compile_service
    from assay.evolve.population import rank
    from assay.evolve.state import load_members
    from assay.steps import profile as step
    from fake_results import make_fake_campaign

    c = make_fake_campaign(tmp_path / "results", "unit", llms=("offline",), tasks=1, gens=1)
    (task,) = [p.name for p in (c.root / "offline").iterdir() if p.is_dir()]
    best = rank([m for m in load_members(c, "offline", task, 1) if m.accepted])[0].speedup
    assert best > 0
    runs = []
    monkeypatch.setattr(step, "tool_missing",
                        lambda name, mode, target: None if name == "ncu" else "off")
    monkeypatch.setattr(app, "on_device", lambda cfg: runs.append("device"))
    monkeypatch.setattr(assay.verify.harness, "prepare", lambda *a, **k: "prepared")
    monkeypatch.setattr(assay.profile.tools, "ncu_profile",
                        lambda prep, path, *a, **k: runs.append("ncu") or "table")
    monkeypatch.setattr(assay.verify.compile_service, "built_first", lambda *a, **k: {})
    for least, ran in ((0.0, True), (best * 0.99, True), (best * 1.01, False)):
        runs.clear()
        cfg = app.compose([f"results_dir={tmp_path / 'results'}", "campaign=unit",
                           f"task={task}", "llm=offline", "target=cuda",
                           "profile.torch_profiler=false", f"profile.ncu_min_speedup={least}"])
        out = step.profile(cfg)
        assert (runs, out["ncu"]) == ((["device", "ncu"], "table") if ran else ([], None)), \
            (least, best, runs)
    assert step.ncu_skipped(0.45, 1.0) == ("ncu: not run, the best kernel is 0.45x eager, "
                                           "below profile.ncu_min_speedup=1")
