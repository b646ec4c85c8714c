"""Log a campaign to MLflow: one experiment per campaign, one parent run per LLM backend, one
child run per (llm, task).

Layout in MLflow:

- experiment ``<campaign name>`` (with a ``sqlite:///<path>`` tracking URI its artifacts go to
  ``<db dir>/mlartifacts/<campaign>``; otherwise MLflow's default location);
- parent run ``<llm>`` tagged ``assay.kind=llm``, ``assay.llm=<llm>``;
- child run ``<task>`` tagged ``mlflow.parentRunId``, ``assay.kind=task``, ``assay.llm``,
  ``assay.task``, ``assay.level``; with

  - per generation (``step=g``): ``best_speedup_eager`` (best accepted speedup over eager in
    generations <= g, 0 while none is accepted; so its latest value is the task's best),
    ``accepted_frac`` and ``n_candidates`` (verified candidates of generation g), ``tokens`` and
    ``cost_usd`` (spent on generation g's proposals, declined ones included: collect.spend),
    for every generation with proposals or verdicts on disk (no ``accepted_frac`` where
    nothing was verified);
  - final (at the last generation's step): ``best_speedup_eager``, ``best_speedup_compile``
    (the highest over accepted kernels, 0 if none) and ``accepted`` (0/1);
  - params: the flattened config (dotted keys; None and secret-looking keys skipped);
  - artifacts: ``summary.json`` (the final metrics and the best candidate's id, always),
    ``best_kernel.py`` (the best accepted kernel) and ``profile.json`` (when it names a
    profiled candidate).

``log_task`` is idempotent: runs are found by their tags, and metrics/params already logged are
not logged again. Several processes may log into one SQLite file at once: find-or-create and
writes happen under a file lock beside the database, and "database is locked" errors are
retried with backoff. MLflow is imported here only, inside functions: it stays off the import
path of the GPU steps.
"""

from __future__ import annotations

import json
import math
import random
import re
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from assay.layout import Campaign, read_json, write_json

MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_KEY = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
BATCH_PARAMS_TAGS = 100  # MAX_PARAMS_TAGS_PER_BATCH
BATCH_METRICS = 1000  # MAX_METRICS_PER_BATCH
LOCK_TIMEOUT_S = 600.0
RETRIES = 8

_SECRET = re.compile(r"(api[_-]?key|secret|password|passwd|credential|auth[_-]?token|"
                     r"access[_-]?token|bearer)", re.IGNORECASE)
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- ]")


# ---------------------------------------------------------------------------------------------
# params


def flatten_params(params: Mapping[str, Any] | None, prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into MLflow params: dotted keys, string values of at most
    MAX_PARAM_VALUE characters; None values and secret-looking keys (api_key, password...,
    but not ``*_env``: names of environment variables) are skipped; lists become JSON."""
    out: dict[str, str] = {}
    if params is None:
        return out
    for key, value in params.items():
        key = str(key)
        full = f"{prefix}.{key}" if prefix else key
        if _SECRET.search(key) and not key.lower().endswith("_env"):
            continue  # a secret; "api_key_env" (the variable's name) is kept
        if value is None:
            continue
        if isinstance(value, Mapping) or (hasattr(value, "items") and
                                          not isinstance(value, (str, bytes))):
            out.update(flatten_params(value, full))
            continue
        if isinstance(value, (list, tuple)):
            text = json.dumps(list(value), default=str)
        else:
            text = str(value)
        out[_param_key(full)] = text[:MAX_PARAM_VALUE]
    return out


def _param_key(key: str) -> str:
    """A valid MLflow key: allowed characters only, no empty, '.' or '..' path segments."""
    key = _BAD_KEY_CHARS.sub("_", key)
    parts = [p for p in key.split("/") if p not in ("", ".", "..")]
    return ("/".join(parts) or "_")[:MAX_KEY].rstrip("/")


# ---------------------------------------------------------------------------------------------
# where the lock and the artifacts go


def _sqlite_path(tracking_uri: str) -> Path | None:
    if not tracking_uri.startswith("sqlite:"):
        return None
    rest = tracking_uri[len("sqlite:"):].split("?", 1)[0]
    if not rest.startswith("///"):
        return None
    path = rest[3:]  # sqlite:///rel/path.db -> rel/path.db; sqlite:////abs -> /abs
    if not path or path == ":memory:":
        return None
    return Path(path)


def _file_store_path(tracking_uri: str) -> Path | None:
    if tracking_uri.startswith("file:"):
        rest = tracking_uri[len("file:"):]
        return Path(rest[2:] if rest.startswith("//") else rest)
    if "://" not in tracking_uri and ":" not in tracking_uri.split("/", 1)[0]:
        return Path(tracking_uri)  # a plain path is a file store
    return None


def lock_path(tracking_uri: str, campaign: Campaign) -> Path:
    """The lock file that serializes our writers: beside the SQLite db or the file store;
    in the campaign folder for remote tracking servers."""
    db = _sqlite_path(tracking_uri)
    if db is not None:
        return db.with_name(db.name + ".lock")
    store = _file_store_path(tracking_uri)
    if store is not None:
        return store.with_name(store.name + ".lock")
    return campaign.root / ".mlflow.lock"


def artifact_location(tracking_uri: str, campaign: Campaign) -> str | None:
    """``<db dir>/mlartifacts/<campaign>`` for a SQLite store, else None (MLflow's default)."""
    db = _sqlite_path(tracking_uri)
    if db is None:
        return None
    return str((db.parent / "mlartifacts" / campaign.name).resolve())


# ---------------------------------------------------------------------------------------------
# what to log, from collect()


def task_metrics(campaign: Campaign, llm: str, task: str) -> dict[str, Any]:
    """Metrics per generation, final metrics and the best kernel of one (llm, task)."""
    import polars as pl

    from assay.collect import best_accepted, collect, spend

    df = collect(campaign, llm=llm, task=task)
    spent = {r["generation"]: r
             for r in spend(campaign, llm=llm, task=task).iter_rows(named=True)}
    steps: list[dict[str, float]] = []
    best_so_far = 0.0
    for g in sorted(set(df["generation"].to_list()) | set(spent)):
        part = df.filter(pl.col("generation") == g)
        acc = part.filter(pl.col("accepted"))
        gen_best = acc["speedup_eager"].drop_nulls().max() if acc.height else None
        if gen_best is not None:
            best_so_far = max(best_so_far, float(gen_best))  # type: ignore[arg-type]
        step: dict[str, float] = {
            "step": g,
            "best_speedup_eager": best_so_far,
            "n_candidates": float(part.height),
            "tokens": float(spent[g]["tokens"] if g in spent else part["tokens"].sum()),
            "cost_usd": float(spent[g]["cost_usd"] if g in spent else part["cost_usd"].sum()),
        }
        if part.height:  # no fraction of nothing (all declined, or not verified yet)
            step["accepted_frac"] = acc.height / part.height
        steps.append(step)
    acc = df.filter(pl.col("accepted"))
    best_compile = acc["speedup_compile"].drop_nulls().max() if acc.height else None
    best = best_accepted(df, by=("llm", "task"))
    best_row = best.row(0, named=True) if best.height else None
    return {
        "steps": steps,
        "final_step": steps[-1]["step"] if steps else 0,
        "final": {"best_speedup_eager": best_so_far,
                  "best_speedup_compile": float(best_compile or 0.0),  # type: ignore[arg-type]
                  "accepted": 1.0 if acc.height else 0.0},
        "best": best_row,
    }


# ---------------------------------------------------------------------------------------------
# MLflow


def _is_locked_error(e: BaseException) -> bool:
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text = str(cur).lower()
        if "database is locked" in text or "database table is locked" in text:
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _quote(value: str) -> str:
    return f'"{value}"' if "'" in value else f"'{value}'"


def _find_run(client: Any, experiment_id: str, tags: dict[str, str]) -> str | None:
    from mlflow.entities import ViewType

    flt = " and ".join(f"tags.`{k}` = {_quote(v)}" for k, v in tags.items())
    runs = client.search_runs([experiment_id], filter_string=flt,
                              run_view_type=ViewType.ACTIVE_ONLY,
                              order_by=["attributes.start_time ASC"])
    return runs[0].info.run_id if runs else None


def _experiment(client: Any, name: str, location: str | None, campaign: Campaign) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(name, artifact_location=location,
                                        tags={"assay.campaign": name,
                                              "assay.results": str(campaign.root.resolve())})
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


def _chunks(items: list, n: int) -> list[list]:
    return [items[i:i + n] for i in range(0, len(items), n)]


def _log_locked(tracking_uri: str, campaign: Campaign, llm: str, task: str,
                params: dict[str, str], data: dict[str, Any], level: int) -> dict[str, str]:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp_id = _experiment(client, campaign.name, artifact_location(tracking_uri, campaign),
                         campaign)

    parent_tags = {"assay.kind": "llm", "assay.llm": llm}
    parent_id = _find_run(client, exp_id, parent_tags)
    if parent_id is None:
        parent_id = client.create_run(exp_id, run_name=llm,
                                      tags={**parent_tags, "assay.campaign": campaign.name}
                                      ).info.run_id

    child_tags = {"assay.kind": "task", "assay.llm": llm, "assay.task": task}
    run_id = _find_run(client, exp_id, child_tags)
    if run_id is None:
        run_id = client.create_run(exp_id, run_name=task,
                                   tags={**child_tags, "mlflow.parentRunId": parent_id}
                                   ).info.run_id

    run = client.get_run(run_id)
    best = data["best"]
    tags = {**child_tags, "mlflow.parentRunId": parent_id, "assay.level": str(level),
            "assay.campaign": campaign.name,
            "assay.best_candidate": best["candidate"] if best else ""}
    new_tags = [RunTag(k, v) for k, v in tags.items() if run.data.tags.get(k) != v]

    existing = run.data.params
    new_params = []
    for k, v in params.items():
        if k not in existing:
            new_params.append(Param(k, v))
        elif existing[k] != v:
            warnings.warn(f"MLflow run {run_id} ({llm}/{task}): param {k!r} was logged as "
                          f"{existing[k]!r}; MLflow params cannot change, keeping it "
                          f"(new value {v!r})", stacklevel=3)

    now = int(time.time() * 1000)
    wanted: list[tuple[str, float, int]] = []
    for s in data["steps"]:
        wanted += [(k, float(v), int(s["step"])) for k, v in s.items() if k != "step"]
    wanted += [(k, float(v), int(data["final_step"])) for k, v in data["final"].items()]
    history: dict[str, set[tuple[int, float]]] = {}
    new_metrics = []
    for key, value, step in wanted:
        if not math.isfinite(value):
            continue
        if key not in history:
            history[key] = ({(m.step, m.value) for m in client.get_metric_history(run_id, key)}
                            if key in run.data.metrics else set())
        if (step, value) in history[key]:
            continue
        history[key].add((step, value))
        new_metrics.append(Metric(key, value, now, step))

    for chunk in _chunks(new_params, BATCH_PARAMS_TAGS):
        client.log_batch(run_id, params=chunk)
    for chunk in _chunks(new_tags, BATCH_PARAMS_TAGS):
        client.log_batch(run_id, tags=chunk)
    for chunk in _chunks(new_metrics, BATCH_METRICS):
        client.log_batch(run_id, metrics=chunk)

    with tempfile.TemporaryDirectory(prefix="assay-track-") as tmp:
        # Every child run has at least this artifact: MLflow's run comparison (3.17) fails
        # with a TypeError when one compared run has artifacts and another has none.
        summary = Path(tmp) / "summary.json"
        write_json(summary, {"campaign": campaign.name, "llm": llm, "task": task,
                             "level": level, "best_candidate": best["candidate"] if best else None,
                             "generations": len(data["steps"]), **data["final"]})
        client.log_artifact(run_id, str(summary))
        if best is not None:
            kernel = Path(tmp) / "best_kernel.py"
            kernel.write_text(best["code"])
            client.log_artifact(run_id, str(kernel))
        profile = campaign.profile(llm, task)
        if profile.exists() and read_json(profile).get("candidate"):  # not the empty one
            client.log_artifact(run_id, str(profile))

    client.set_terminated(run_id, "FINISHED")
    client.set_terminated(parent_id, "FINISHED")
    return {"experiment_id": exp_id, "parent_run_id": parent_id, "run_id": run_id}


def _redact(uri: str) -> str:
    """Drop a password from a URI (postgresql://user:pw@host/db) before writing it down."""
    return re.sub(r"://([^/:@]+):[^/@]*@", r"://\1:***@", uri)


def log_task(tracking_uri: str, campaign: Campaign, llm: str, task: str,
             params: Mapping[str, Any] | None) -> dict[str, str]:
    """Log one (llm, task) of ``campaign`` (see the module docstring); safe to rerun and to run
    from several processes at once. Returns {"experiment_id", "parent_run_id", "run_id"} and
    writes them to ``<llm>/<task>/tracked.json``."""
    from filelock import FileLock

    from assay.collect import task_info

    data = task_metrics(campaign, llm, task)  # reading the tree needs no lock
    level = task_info(campaign, task)["level"]
    flat = flatten_params(params)
    lock = lock_path(tracking_uri, campaign)
    lock.parent.mkdir(parents=True, exist_ok=True)
    db = _sqlite_path(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)

    delay = 0.25
    for attempt in range(RETRIES):
        try:
            with FileLock(str(lock), timeout=LOCK_TIMEOUT_S):
                ids = _log_locked(tracking_uri, campaign, llm, task, flat, data, level)
            break
        except Exception as e:  # noqa: BLE001 - only "database is locked" is retried
            if not _is_locked_error(e) or attempt == RETRIES - 1:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 8.0)
    write_json(campaign.tracked(llm, task), {"tracking_uri": _redact(tracking_uri),
                                             "experiment": campaign.name, **ids})
    return ids


def log_campaign(tracking_uri: str, campaign: Campaign, params: Mapping[str, Any] | None
                 ) -> list[dict[str, str]]:
    """``log_task`` for every (llm, task) of the campaign with generations on disk."""
    out = []
    if not campaign.root.is_dir():
        return out
    for llm in campaign.llms():
        d = campaign.root / llm
        for t in sorted(p.name for p in d.iterdir() if p.is_dir()):
            if campaign.generations(llm, t):
                out.append(log_task(tracking_uri, campaign, llm, t, params))
    return out
