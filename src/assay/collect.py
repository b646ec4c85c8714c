"""Read a campaign's results tree into one table: a row per verified candidate.

This is the one place that walks ``<llm>/<task>/gen_<g>/`` for the consumers of the tree
(archive export, report, compare, tracking). Each row is a verdict joined with its proposal's
metadata, the task record, the baseline and, for the profiled candidate, ``profile.json``.

Left out: proposals that were declined (no code), and candidates not verified yet (a proposal
without a verdict). No torch and no mlflow here: polars only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from assay.evolve.functional import load_functional
from assay.layout import Campaign, read_json

# One explicit schema, so an empty campaign still gives the right columns and dtypes.
COLLECT_SCHEMA: dict[str, pl.DataType] = {
    "campaign": pl.String(),
    "llm": pl.String(),
    "task": pl.String(),
    "level": pl.Int64(),
    "number": pl.Int64(),
    "name": pl.String(),
    "generation": pl.Int64(),
    "candidate": pl.String(),
    # proposal metadata
    "operator": pl.String(),
    "strategy": pl.String(),
    "parents": pl.List(pl.String()),
    "model": pl.String(),
    "tokens_in": pl.Int64(),
    "tokens_out": pl.Int64(),
    "tokens": pl.Int64(),
    "cost_usd": pl.Float64(),
    "wall_s": pl.Float64(),
    "code": pl.String(),
    # verdict
    "accepted": pl.Boolean(),
    "reasons": pl.List(pl.String()),
    "reason_details": pl.List(pl.String()),  # each failed check's detail, aligned with reasons
    "checks": pl.List(pl.String()),  # names of the checks the verifier ran
    "error": pl.String(),
    "max_abs_err": pl.Float64(),
    "rel_err": pl.Float64(),
    "runtime_ms": pl.Float64(),
    "runtime_iqr_ms": pl.Float64(),
    "baseline_eager_ms": pl.Float64(),
    "baseline_compile_ms": pl.Float64(),
    # eager under PyTorch's default numerics where they differ (cuDNN in TF32; the verifier's
    # eager and the candidates run true fp32): bench.baseline.time_default_numerics
    "baseline_eager_default_ms": pl.Float64(),
    "speedup_eager": pl.Float64(),
    "speedup_compile": pl.Float64(),
    "roofline_ms": pl.Float64(),
    "library_time_frac": pl.Float64(),
    "kernels_launched": pl.List(pl.String()),
    "device": pl.String(),
    # the GPU (or CPU) whose peaks the verdict used, which timed it (its device_peaks' name)
    "device_name": pl.String(),
    "policy": pl.String(),
    "verify_s": pl.Float64(),
    # task record and baseline
    "task_source": pl.String(),
    "functional_source": pl.String(),
    "task_error": pl.String(),
    "flops": pl.Float64(),
    "min_bytes": pl.Float64(),
    "target": pl.String(),
    "kernels": pl.String(),  # what the kernels are written in: cpu (C++), cuda, triton
    # profile.json, on the profiled candidate's rows only
    "profiled": pl.Boolean(),
    "ncu_profile": pl.String(),
    "torch_profile": pl.String(),
    "clang_tidy": pl.String(),
}

_TASK_ID = re.compile(r"^L(?P<level>\d+)_(?:(?P<number>\d+)_)?(?P<name>.*)$")


def _read(path: Path) -> Any:
    try:
        return read_json(path)
    except ValueError as e:  # json.JSONDecodeError: name the file, the tree is the truth
        raise ValueError(f"{path}: not valid JSON: {e}") from None


def _float(x: Any) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _int(x: Any) -> int:
    try:
        return int(x or 0)
    except (TypeError, ValueError):
        return 0


def _str(x: Any) -> str | None:
    return None if x is None else str(x)


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _strs(x: Any) -> list[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    return [str(v) for v in x]


def _details(verdict: dict[str, Any]) -> list[str]:
    """The detail of each failed check, in the order of ``reasons`` ("" when none recorded)."""
    checks = verdict.get("checks") or {}
    out = []
    for name in _strs(verdict.get("reasons")):
        c = checks.get(name) if isinstance(checks, dict) else None
        out.append(str(c.get("detail") or "") if isinstance(c, dict) else "")
    return out


def _first(*values: Any) -> Any:
    for v in values:
        if v is not None:
            return v
    return None


def task_info(campaign: Campaign, task: str) -> dict[str, Any]:
    """The task record, with level/number/name parsed from the id when the record is missing."""
    path = campaign.task_record(task)
    rec = _read(path) if path.exists() else {}
    m = _TASK_ID.match(task)
    level = rec.get("level", int(m.group("level")) if m else 0)
    number = rec.get("number", int(m.group("number")) if m and m.group("number") else 0)
    name = rec.get("name", m.group("name") if m else task)
    return {**rec, "id": task, "level": _int(level), "number": _int(number), "name": str(name)}


def device_info(campaign: Campaign) -> dict[str, Any]:
    """The campaign's ``device.json`` (the measured peaks the roofline uses): ``name``,
    ``bandwidth_gbs``, ``flops_tflops`` (None where unknown), plus whatever else it records.
    Empty dict when the file is missing."""
    path = campaign.device()
    if not path.exists():
        return {}
    d = _read(path)
    if not isinstance(d, dict):
        return {}
    return {**d, "name": _str(d.get("name")), "bandwidth_gbs": _float(d.get("bandwidth_gbs")),
            "flops_tflops": _float(d.get("flops_tflops"))}


def tracked_runs(campaign: Campaign) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(llm, task): <llm>/<task>/tracked.json}`` for every task the track step logged
    (keys ``tracking_uri``, ``experiment_id``, ``run_id``, ...). Unreadable files are left out:
    a missing link must not stop a report."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    if not campaign.root.is_dir():
        return out
    for lm in campaign.llms():
        for path in sorted((campaign.root / lm).glob("*/tracked.json")):
            try:
                d = read_json(path)
            except (OSError, ValueError):
                continue
            if isinstance(d, dict) and d.get("run_id") and d.get("experiment_id"):
                out[(lm, path.parent.name)] = d
    return out


def task_ids(campaign: Campaign) -> list[str]:
    """Every task with a task record (whether or not any candidate was verified for it)."""
    d = campaign.root / "tasks"
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def _task_dirs(campaign: Campaign, llm: str) -> list[str]:
    d = campaign.root / llm
    return sorted(p.name for p in d.iterdir()
                  if p.is_dir() and any(q.is_dir() for q in p.glob("gen_*")))


def collect(campaign: Campaign, llm: str | None = None, task: str | None = None) -> pl.DataFrame:
    """One row per verified candidate of ``campaign`` (optionally of one llm and/or one task).

    Columns and dtypes are ``COLLECT_SCHEMA``; rows are ordered by llm, task, generation,
    candidate.
    """
    columns: dict[str, list[Any]] = {k: [] for k in COLLECT_SCHEMA}
    if campaign.root.is_dir():
        llms = [llm] if llm is not None else campaign.llms()
        tasks_cache: dict[str, dict[str, Any]] = {}
        baseline_cache: dict[str, dict[str, Any]] = {}
        for lm in llms:
            if not (campaign.root / lm).is_dir():
                continue
            for t in ([task] if task is not None else _task_dirs(campaign, lm)):
                if t not in tasks_cache:
                    tasks_cache[t] = task_info(campaign, t)
                    bpath = campaign.baseline(t)
                    baseline_cache[t] = _read(bpath) if bpath.exists() else {}
                _collect_task(campaign, lm, t, tasks_cache[t], baseline_cache[t], columns)
    return pl.DataFrame(columns, schema=COLLECT_SCHEMA)


def _collect_task(campaign: Campaign, llm: str, task: str, rec: dict[str, Any],
                  base: dict[str, Any], columns: dict[str, list[Any]]) -> None:
    ppath = campaign.profile(llm, task)
    profile = _read(ppath) if ppath.exists() else {}
    profiled_id = profile.get("candidate")
    # Stage 1's rewrite of this (llm, task), when it was checked and accepted.
    functional_source = (load_functional(campaign, llm, task) or {}).get("source")
    for gen in campaign.generations(llm, task):
        cdir = campaign.candidates_dir(llm, task, gen)
        if not cdir.is_dir():
            continue
        for meta_path in sorted(cdir.glob("*.json")):
            cid = meta_path.stem
            meta = _read(meta_path)
            code_path = campaign.candidate(llm, task, gen, cid)
            if meta.get("declined") or meta.get("id") is None or not code_path.exists():
                continue  # declined: no code, nothing to verify
            vpath = campaign.verdict(llm, task, gen, cid)
            if not vpath.exists():
                continue  # not verified yet
            v = _read(vpath)
            is_profiled = profiled_id is not None and profiled_id == cid
            tin, tout = _int(meta.get("tokens_in")), _int(meta.get("tokens_out"))
            row = {
                "campaign": campaign.name, "llm": llm, "task": task,
                "level": rec["level"], "number": rec["number"], "name": rec["name"],
                "generation": gen, "candidate": cid,
                "operator": _str(meta.get("operator")), "strategy": _str(meta.get("strategy")),
                "parents": _strs(meta.get("parents")), "model": _str(meta.get("model")),
                "tokens_in": tin, "tokens_out": tout, "tokens": tin + tout,
                "cost_usd": _float(meta.get("cost_usd")) or 0.0,
                "wall_s": _float(meta.get("wall_s")),
                "code": code_path.read_text(),
                "accepted": bool(v.get("accepted", False)),
                "reasons": _strs(v.get("reasons")),
                "reason_details": _details(v),
                "checks": _strs(list(v.get("checks") or {})),
                "error": str(v.get("error") or ""),
                "max_abs_err": _float(v.get("max_abs_err")),
                "rel_err": _float(v.get("rel_err")),
                "runtime_ms": _float(v.get("runtime_ms")),
                "runtime_iqr_ms": _float(v.get("runtime_iqr_ms")),
                "baseline_eager_ms": _float(_first(v.get("baseline_eager_ms"),
                                                   base.get("eager_ms"))),
                "baseline_compile_ms": _float(_first(v.get("baseline_compile_ms"),
                                                     base.get("compile_ms"))),
                "baseline_eager_default_ms": _float(base.get("eager_default_ms")),
                "speedup_eager": _float(v.get("speedup_eager")),
                "speedup_compile": _float(v.get("speedup_compile")),
                "roofline_ms": _float(v.get("roofline_ms")),
                "library_time_frac": _float(v.get("library_time_frac")),
                "kernels_launched": _strs(v.get("kernels_launched")),
                "device": _str(v.get("device") or base.get("device")),
                "device_name": _str(_dict(v.get("device_peaks")).get("name")),
                "policy": _str(v.get("policy")),
                "verify_s": _float(v.get("verify_s")),
                "task_source": _str(rec.get("source")),
                "functional_source": _str(functional_source),
                "task_error": _str(rec.get("error")),
                "flops": _float(rec.get("flops")),
                "min_bytes": _float(rec.get("min_bytes")),
                "target": _str(base.get("target")),
                # a baseline written before target=triton: the device's own language
                "kernels": _str(base.get("kernels") or base.get("target")),
                "profiled": is_profiled,
                "ncu_profile": _str(profile.get("ncu")) if is_profiled else None,
                "torch_profile": _str(profile.get("torch_profile")) if is_profiled else None,
                "clang_tidy": _str(profile.get("clang_tidy")) if is_profiled else None,
            }
            for k, val in row.items():
                columns[k].append(val)


SPEND_SCHEMA: dict[str, pl.DataType] = {
    "campaign": pl.String(),
    "llm": pl.String(),
    "task": pl.String(),
    "generation": pl.Int64(),
    "proposed": pl.Int64(),  # candidates written (new code)
    "declined": pl.Int64(),  # proposals that came back without code
    "tokens": pl.Int64(),
    "cost_usd": pl.Float64(),
}


def spend(campaign: Campaign, llm: str | None = None, task: str | None = None) -> pl.DataFrame:
    """What the proposers spent: one row per (llm, task, generation) with proposals on disk.

    Taken from the generation's ``proposals.json`` totals, which also count declined proposals
    and duplicates of earlier code (both absent from ``collect()``); where that file has no
    totals, summed over the generation's proposal metadata files.
    """
    columns: dict[str, list[Any]] = {k: [] for k in SPEND_SCHEMA}
    if campaign.root.is_dir():
        for lm in ([llm] if llm is not None else campaign.llms()):
            if not (campaign.root / lm).is_dir():
                continue
            for t in ([task] if task is not None else _task_dirs(campaign, lm)):
                for gen in campaign.generations(lm, t):
                    row = _spend_gen(campaign, lm, t, gen)
                    if row is not None:
                        for k, v in row.items():
                            columns[k].append(v)
    return pl.DataFrame(columns, schema=SPEND_SCHEMA)


def _spend_gen(campaign: Campaign, llm: str, task: str, gen: int) -> dict[str, Any] | None:
    ppath = campaign.proposals(llm, task, gen)
    summary = _read(ppath) if ppath.exists() else None
    metas = [_read(p) for p in sorted(campaign.candidates_dir(llm, task, gen).glob("*.json"))]
    row = {"campaign": campaign.name, "llm": llm, "task": task, "generation": gen}
    if isinstance(summary, dict) and "tokens" in summary:
        return {**row, "proposed": len(summary.get("candidates") or []),
                "declined": len(summary.get("declined") or []),
                "tokens": _int(summary.get("tokens")),
                "cost_usd": _float(summary.get("cost_usd")) or 0.0}
    if not metas:
        return None
    return {**row,
            "proposed": sum(1 for m in metas if m.get("id") and not m.get("declined")),
            "declined": sum(1 for m in metas if m.get("declined") or not m.get("id")),
            "tokens": sum(_int(m.get("tokens_in")) + _int(m.get("tokens_out")) for m in metas),
            "cost_usd": sum(_float(m.get("cost_usd")) or 0.0 for m in metas)}


def best_accepted(df: pl.DataFrame, by: tuple[str, ...] = ("campaign", "llm", "task")
                  ) -> pl.DataFrame:
    """The best accepted candidate per group (highest speedup_eager; untimed ones rank last).

    Returns one row per group that has at least one accepted candidate, all columns of ``df``.
    """
    acc = df.filter(pl.col("accepted"))
    if acc.is_empty():
        return acc
    return (acc.sort([*by, "speedup_eager", "generation", "candidate"],
                     descending=[False] * len(by) + [True, False, False], nulls_last=True)
               .group_by(list(by), maintain_order=True).first())
