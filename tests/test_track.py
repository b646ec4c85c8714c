"""MLflow tracking: layout (experiment / parent per llm / child per task), idempotence, and 8
processes logging into one SQLite file at once."""

from __future__ import annotations

import importlib
import multiprocessing
from pathlib import Path

import pytest

from assay.layout import Campaign, read_json
from assay.track.mlflow_log import (
    _is_locked_error,
    artifact_location,
    flatten_params,
    lock_path,
    log_task,
)

try:
    from fake_results import add_candidate, add_declined, make_fake_campaign, write_task
except ImportError:  # tests/ imported as a package
    from tests.fake_results import (add_candidate, add_declined, make_fake_campaign,
                                    write_task)

pytest.importorskip("mlflow")

PARAMS = {"campaign": "test", "llm": {"name": "offline", "api_key": "sk-secret", "temp": None,
                                     "api_key_env": "OPENAI_API_KEY"},
          "evolve": {"generations": 2, "operators": ["mutate", "crossover"]},
          "verify": {"policy": "strict", "atol": 1e-4}}


def _client(uri: str):  # noqa: ANN202
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri: str, exp_id: str, kind: str) -> list:
    return _client(uri).search_runs([exp_id], filter_string=f"tags.`assay.kind` = '{kind}'")


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in _client(uri).get_metric_history(run_id, key))


def test_flatten_params() -> None:
    flat = flatten_params({**PARAMS, "long": "x" * 7000, "bad key+": 1, "none": None})
    assert flat["llm.name"] == "offline"
    assert "llm.api_key" not in flat and "llm.temp" not in flat and "none" not in flat
    assert flat["llm.api_key_env"] == "OPENAI_API_KEY"
    assert "db.password" not in flatten_params({"db.password": "x"})  # already flat
    assert flat["evolve.generations"] == "2"
    assert flat["evolve.operators"] == '["mutate", "crossover"]'
    assert flat["verify.atol"] == "0.0001"
    assert len(flat["long"]) == 6000
    assert flat["bad key_"] == "1"
    assert all(isinstance(v, str) for v in flat.values())


def test_paths_beside_the_db(tmp_path: Path) -> None:
    c = Campaign(tmp_path / "camp")
    uri = f"sqlite:///{tmp_path}/ml/mlflow.db"
    assert lock_path(uri, c) == tmp_path / "ml" / "mlflow.db.lock"
    assert artifact_location(uri, c) == str(tmp_path / "ml" / "mlartifacts" / "camp")
    assert artifact_location("http://localhost:5000", c) is None
    assert lock_path("http://localhost:5000", c) == c.root / ".mlflow.lock"


def test_locked_error_detection() -> None:
    try:
        try:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        except RuntimeError as inner:
            raise ValueError("API request failed") from inner
    except ValueError as e:
        assert _is_locked_error(e)
    assert not _is_locked_error(ValueError("no such table"))


def test_log_task_layout_and_idempotence(tmp_path: Path) -> None:
    c = make_fake_campaign(tmp_path / "results", tasks=2, gens=2)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ids = log_task(uri, c, "offline", "L1_1_ReLU", PARAMS)
    assert read_json(c.tracked("offline", "L1_1_ReLU"))["run_id"] == ids["run_id"]
    again = log_task(uri, c, "offline", "L1_1_ReLU", PARAMS)
    assert again == ids
    other = log_task(uri, c, "offline", "L2_1_Conv2d_ReLU_BiasAdd", PARAMS)
    assert other["parent_run_id"] == ids["parent_run_id"] and other["run_id"] != ids["run_id"]
    fake = log_task(uri, c, "fakellm", "L1_1_ReLU", PARAMS)
    assert fake["parent_run_id"] != ids["parent_run_id"]

    client = _client(uri)
    assert [e.name for e in client.search_experiments()].count("test") == 1
    assert len(_runs(uri, ids["experiment_id"], "llm")) == 2
    assert len(_runs(uri, ids["experiment_id"], "task")) == 3

    run = client.get_run(ids["run_id"])
    assert run.data.tags["mlflow.parentRunId"] == ids["parent_run_id"]
    assert run.data.tags["assay.task"] == "L1_1_ReLU" and run.data.tags["assay.level"] == "1"
    assert run.info.run_name == "L1_1_ReLU" and run.info.status == "FINISHED"
    parent = client.get_run(ids["parent_run_id"])
    assert parent.info.run_name == "offline" and parent.data.tags["assay.llm"] == "offline"
    assert run.data.params["verify.policy"] == "strict" and "llm.api_key" not in run.data.params
    # offline, task 0: accepted speedups 0.5 (gen 0), 1.0 (gen 1); 3 candidates per gen
    assert _history(uri, ids["run_id"], "best_speedup_eager") == [(0, 0.5), (1, 1.0)]
    assert _history(uri, ids["run_id"], "n_candidates") == [(0, 3.0), (1, 3.0)]
    assert _history(uri, ids["run_id"], "accepted_frac") == [(0, pytest.approx(1 / 3)),
                                                             (1, pytest.approx(1 / 3))]
    # tokens spent per generation, from proposals.json: gen 0 also has a declined (320) and a
    # pending (600) proposal
    assert _history(uri, ids["run_id"], "tokens") == [(0, 3 * 1400 + 320 + 600.0),
                                                      (1, 1410 + 2 * 1400.0)]
    assert _history(uri, ids["run_id"], "cost_usd") == [(0, pytest.approx(0.03 + 0.005)),
                                                        (1, pytest.approx(0.03))]
    assert run.data.metrics["accepted"] == 1.0
    assert run.data.metrics["best_speedup_compile"] == pytest.approx(0.8)
    arts = {a.path for a in client.list_artifacts(ids["run_id"])}
    assert arts == {"summary.json", "best_kernel.py", "profile.json"}
    summary = read_json(Path(client.download_artifacts(ids["run_id"], "summary.json",
                                                       str(tmp_path))))
    assert summary["best_candidate"] == run.data.tags["assay.best_candidate"]
    assert summary["accepted"] == 1.0 and summary["best_speedup_eager"] == 1.0
    assert run.info.artifact_uri.startswith(str(tmp_path / "mlartifacts" / "test"))
    # fakellm on its last task accepted nothing: zeros
    none = log_task(uri, c, "fakellm", "L2_1_Conv2d_ReLU_BiasAdd", PARAMS)
    nrun = client.get_run(none["run_id"])
    assert nrun.data.metrics["accepted"] == 0.0 and nrun.data.metrics["best_speedup_eager"] == 0
    assert {a.path for a in client.list_artifacts(none["run_id"])} == {"summary.json"}
    # a task whose every proposal was declined: its spend is logged, no accepted_frac
    t = write_task(c, 1, 7, "Matmul")
    add_declined(c, "offline", t, 0)
    dec = log_task(uri, c, "offline", t, PARAMS)
    assert _history(uri, dec["run_id"], "tokens") == [(0, 320.0)]
    assert _history(uri, dec["run_id"], "n_candidates") == [(0, 0.0)]
    assert "accepted_frac" not in client.get_run(dec["run_id"]).data.metrics
    assert client.get_run(dec["run_id"]).data.metrics["accepted"] == 0.0

    # a new generation on disk: the same run gets the new step, nothing is duplicated
    add_candidate(c, "offline", "L1_1_ReLU", 2, accepted=True, speedup=5.0, tag="g2")
    third = log_task(uri, c, "offline", "L1_1_ReLU", PARAMS)
    assert third == ids
    assert _history(uri, ids["run_id"], "best_speedup_eager") == [(0, 0.5), (1, 1.0), (2, 5.0)]
    assert _history(uri, ids["run_id"], "n_candidates") == [(0, 3.0), (1, 3.0), (2, 1.0)]
    assert client.get_run(ids["run_id"]).data.metrics["best_speedup_eager"] == 5.0
    assert len(_runs(uri, ids["experiment_id"], "task")) == 5


def test_eight_processes_one_sqlite_db(tmp_path: Path) -> None:
    tasks = 8
    c = make_fake_campaign(tmp_path / "results", llms=("offline",), tasks=tasks, gens=2)
    task_ids = sorted(p.stem for p in (c.root / "tasks").glob("*.json"))
    assert len(task_ids) == tasks
    uri = f"sqlite:///{tmp_path}/db/mlflow.db"  # fresh: the schema is created under the race
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(tasks, initializer=importlib.import_module, initargs=("mlflow.tracking",))
    try:
        results = pool.starmap(log_task, [(uri, c, "offline", t, PARAMS) for t in task_ids],
                               chunksize=1)
    finally:
        # close + join, not the context manager's terminate(): terminating idle workers can
        # kill one while it holds the task queue's lock, and the join then waits forever for
        # another blocked on that lock (seen once in CI, 2026-11-24).
        pool.close()
        pool.join()

    assert len({r["experiment_id"] for r in results}) == 1
    assert len({r["parent_run_id"] for r in results}) == 1
    assert len({r["run_id"] for r in results}) == tasks
    client = _client(uri)
    assert [e.name for e in client.search_experiments()].count("test") == 1
    exp_id = results[0]["experiment_id"]
    parents = _runs(uri, exp_id, "llm")
    assert len(parents) == 1 and parents[0].info.run_id == results[0]["parent_run_id"]
    children = _runs(uri, exp_id, "task")
    assert len(children) == tasks
    assert {r.data.tags["assay.task"] for r in children} == set(task_ids)
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert [s for s, _ in _history(uri, run.info.run_id, "best_speedup_eager")] == [0, 1]
        assert [s for s, _ in _history(uri, run.info.run_id, "cost_usd")] == [0, 1]
        assert run.data.metrics["accepted"] == 1.0
    for t, r in zip(task_ids, results):
        assert read_json(c.tracked("offline", t))["run_id"] == r["run_id"]
