"""The campaign report: one static, self-contained HTML page (inline CSS, inline SVG charts,
no scripts, nothing fetched: a Content-Security-Policy forbids it), rendered with Jinja2
(autoescaped) from collect().

Sections: summary per LLM (and, optionally, other campaigns compared), leaderboard per level,
speedup distribution, fast_p curves per LLM, roofline scatter, the lineage tree of each task's
best kernel, rejections grouped by reason, tokens and cost per accepted kernel, and the kernels'
sources, syntax-highlighted. Rows link to their MLflow runs (``<llm>/<task>/tracked.json``).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import polars as pl
from jinja2 import DictLoader, Environment
from markupsafe import Markup

from assay.collect import (COLLECT_SCHEMA, SPEND_SCHEMA, best_accepted, collect, device_info,
                           spend, task_ids, task_info, tracked_runs)
from assay.layout import Campaign, write_atomic
from assay.verify.policy import ALLOWED_OPS
from assay.report.charts import (OPERATOR_COLORS, PALETTE, svg_bandwidth, svg_bar_chart,
                                 svg_line_chart, svg_lineage, svg_roofline)
from assay.report.compare import compare_frame, per_task
from assay.report.highlight import css as highlight_css
from assay.report.highlight import highlight_code

__all__ = ["DEFAULT_MLFLOW_UI", "mlflow_compare_url", "mlflow_run_url", "render_report",
           "report_context", "svg_bar_chart", "svg_line_chart", "write_report", "PALETTE",
           "OPERATOR_COLORS"]

FAST_P_GRID = [round(0.01 * i, 2) for i in range(301)]  # p in 0..3
FAST_P_TABLE = (0.0, 1.0, 1.5, 2.0, 3.0)
# log2 bins of speedup over eager: edges and labels
HIST_EDGES = (0.0, 0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 8.0, math.inf)
# Where `mlflow ui` serves by default; ASSAY_MLFLOW_UI, `assay report --mlflow-ui` or the Hydra
# key mlflow.ui_url override it. A tracking URI that is itself an http(s) server is used as is.
DEFAULT_MLFLOW_UI = "http://localhost:5000"
MAX_LINEAGE_NODES = 40
MAX_REJECTION_EXAMPLES = 25


def mlflow_ui_base(explicit: str | None = None) -> str:
    """The MLflow UI's base URL: ``explicit``, else $ASSAY_MLFLOW_UI, else the default."""
    return (explicit or os.environ.get("ASSAY_MLFLOW_UI") or DEFAULT_MLFLOW_UI).rstrip("/")


def _ui_of(tracked: dict[str, Any], base: str) -> str:
    """A tracking server is its own UI; a database's runs are shown by the UI at ``base``."""
    uri = str(tracked.get("tracking_uri") or "")
    if re.match(r"https?://", uri) and "***" not in uri:
        return uri.rstrip("/")
    return base


def mlflow_run_url(tracked: dict[str, Any] | None, base: str) -> str | None:
    """The MLflow UI page of a run recorded in a ``tracked.json`` (None without ids)."""
    if not tracked or not tracked.get("experiment_id") or not tracked.get("run_id"):
        return None
    return (f"{_ui_of(tracked, base)}/#/experiments/{tracked['experiment_id']}/runs/"
            f"{tracked['run_id']}")


def mlflow_compare_url(tracked: Sequence[dict[str, Any]], base: str, key: str = "run_id"
                       ) -> str | None:
    """The MLflow UI's run comparison (``#/compare-runs``) of the runs ``key`` names in several
    ``tracked.json`` (``run_id``: the tasks' child runs; ``parent_run_id``: the backends' parent
    runs). None unless at least two distinct runs of one UI are known."""
    usable = [t for t in tracked if t.get(key) and t.get("experiment_id")]
    runs = list(dict.fromkeys(str(t[key]) for t in usable))
    uis = {_ui_of(t, base) for t in usable}
    if len(runs) < 2 or len(uis) != 1:
        return None
    exps = list(dict.fromkeys(str(t["experiment_id"]) for t in usable))
    query = urlencode({"runs": json.dumps(runs, separators=(",", ":")),
                       "experiments": json.dumps(exps, separators=(",", ":"))},
                      quote_via=quote)
    return f"{uis.pop()}/#/compare-runs?{query}"


def _slug(*parts: str) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", p) for p in parts)


def _src_id(llm: str, task: str, cid: str) -> str:
    return "src-" + _slug(llm, task, cid)


# ---------------------------------------------------------------------------------------------
# the page's data


def _hist_labels() -> list[str]:
    labels = []
    for lo, hi in zip(HIST_EDGES, HIST_EDGES[1:]):
        if lo == 0:
            labels.append(f"<{_num(hi)}x")
        elif math.isinf(hi):
            labels.append(f">={_num(lo)}x")
        else:
            labels.append(f"{_num(lo)}-{_num(hi)}x")
    return labels


def _num(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"


def _histogram(values: list[float]) -> list[float]:
    counts = [0.0] * (len(HIST_EDGES) - 1)
    for v in values:
        for i, (lo, hi) in enumerate(zip(HIST_EDGES, HIST_EDGES[1:])):
            if lo <= v < hi:
                counts[i] += 1
                break
    return counts


def _reason_list(row: dict[str, Any]) -> list[str]:
    if row["reasons"]:
        return list(row["reasons"])
    return ["error"] if row["error"] else ["unspecified"]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _speed_class(speedup: float | None) -> str:
    """The badge of a speedup over eager: green only for a real gain (>= 1.0x)."""
    if speedup is None:
        return "unknown-tag"
    return "faster-tag" if speedup >= 1.0 else "slower-tag"


def _on_cpu(row: dict[str, Any]) -> bool:
    target = row.get("target")
    if target:
        return target == "cpu"
    return not str(row.get("device") or "").startswith("cuda")


def _launched(row: dict[str, Any]) -> dict[str, Any]:
    """What the profiler saw the kernel run, as the card shows it. On cuda: the device kernels.
    On cpu the profiler sees ATen ops only (the candidate's own C++ code is invisible to it), and
    allocations, views and copies (aten::empty...) are no one's kernels: only ATen compute ops
    are named, and their absence is said."""
    names = list(row.get("kernels_launched") or [])
    if not _on_cpu(row):
        return {"cpu": False, "names": names}
    return {"cpu": True, "names": [n for n in names if n not in ALLOWED_OPS]}


def _roofline_pct(row: dict[str, Any] | None) -> float | None:
    if row is None or row["roofline_ms"] is None or not row["runtime_ms"]:
        return None
    return row["roofline_ms"] / row["runtime_ms"] * 100


def _leaderboard(campaign: Campaign, df: pl.DataFrame, spent: pl.DataFrame,
                 llms: list[str], links: dict[tuple[str, str], str],
                 compare: dict[str, str]) -> list[dict[str, Any]]:
    tasks = sorted(set(task_ids(campaign)) | set(df["task"].unique().to_list())
                   | set(spent["task"].unique().to_list()))
    infos = {t: task_info(campaign, t) for t in tasks}
    best = {r["task"]: r for r in best_accepted(df, by=("task",)).iter_rows(named=True)}
    per_llm = {(r["llm"], r["task"]): r
               for r in best_accepted(df, by=("llm", "task")).iter_rows(named=True)}
    levels: dict[int, list[dict[str, Any]]] = {}
    for t in sorted(tasks, key=lambda t: (infos[t]["level"], infos[t]["number"], t)):
        info = infos[t]
        rows = df.filter(pl.col("task") == t)
        b = best.get(t)
        if b is not None:
            verdict = "accepted"
        elif info.get("error"):
            verdict = f"task error: {info['error']}"
        elif rows.is_empty():
            sp = spent.filter(pl.col("task") == t)
            n_declined = int(sp["declined"].sum()) if sp.height else 0
            verdict = (f"no candidate: the LLM declined {_count(n_declined, 'proposal')}"
                       if n_declined and not int(sp["proposed"].sum()) else "not verified yet")
        else:
            reasons = Counter(r for row in rows.iter_rows(named=True) for r in _reason_list(row))
            top = ", ".join(f"{k} ({v})" for k, v in reasons.most_common(2))
            verdict = f"no accepted kernel; rejected for {top}"
        tried = (set(rows["llm"].unique().to_list())
                 | set(spent.filter(pl.col("task") == t)["llm"].unique().to_list()))
        link = links.get((b["llm"], t)) if b is not None else next(
            (links[(lm, t)] for lm in llms if (lm, t) in links), None)
        levels.setdefault(info["level"], []).append({
            "task": t, "anchor": _slug(t), "name": info["name"], "best": b,
            "roofline_pct": _roofline_pct(b), "verdict": verdict, "n_candidates": rows.height,
            "n_accepted": int(rows["accepted"].sum()) if rows.height else 0,
            "link": link, "compare": compare.get(t),
            "per_llm": [{"speedup": per_llm[(lm, t)]["speedup_eager"]
                         if (lm, t) in per_llm else None,
                         "tried": lm in tried, "link": links.get((lm, t))} for lm in llms],
        })
    return [{"level": lv, "rows": levels[lv]} for lv in sorted(levels)]


def _costs(df: pl.DataFrame, spent: pl.DataFrame, llms: list[str]) -> list[dict[str, Any]]:
    out = []
    for lm in llms:
        part = df.filter(pl.col("llm") == lm)
        sp = spent.filter(pl.col("llm") == lm)
        acc = part.filter(pl.col("accepted"))
        n_acc = acc.height
        n_solved = acc["task"].n_unique() if n_acc else 0
        if sp.height:
            tokens, cost = int(sp["tokens"].sum()), float(sp["cost_usd"].sum())
        else:
            tokens, cost = int(part["tokens"].sum()), float(part["cost_usd"].sum())
        out.append({"llm": lm, "proposed": int(sp["proposed"].sum()) if sp.height else None,
                    "declined": int(sp["declined"].sum()) if sp.height else None,
                    "candidates": part.height, "accepted": n_acc,
                    "solved": n_solved, "tokens": tokens, "cost": cost,
                    "tokens_per_kernel": tokens / n_acc if n_acc else None,
                    "cost_per_kernel": cost / n_acc if n_acc else None,
                    "cost_per_task": cost / n_solved if n_solved else None})
    return out


def _rejections(df: pl.DataFrame, llms: list[str], links: dict[tuple[str, str], str]
                ) -> tuple[list[dict[str, Any]], Markup | None]:
    counts: dict[str, Counter[str]] = {}
    examples: dict[str, list[dict[str, Any]]] = {}
    for row in df.filter(~pl.col("accepted")).iter_rows(named=True):
        details = dict(zip(row["reasons"], row["reason_details"] or []))
        for r in _reason_list(row):
            counts.setdefault(r, Counter())[row["llm"]] += 1
            detail = details.get(r) or (row["error"] if r == "error" or
                                        (r == "compiles" and row["error"]) else "")
            examples.setdefault(r, []).append({
                "task": row["task"], "task_anchor": _slug(row["task"]), "llm": row["llm"],
                "generation": row["generation"], "candidate": row["candidate"],
                "operator": row["operator"], "detail": (detail or row["error"] or "")[:400],
                "link": links.get((row["llm"], row["task"]))})
    reasons = sorted(counts, key=lambda r: (-sum(counts[r].values()), r))
    rows = [{"reason": r, "total": sum(counts[r].values()),
             "per_llm": [counts[r].get(lm, 0) for lm in llms],
             "examples": examples[r][:MAX_REJECTION_EXAMPLES],
             "more": max(0, len(examples[r]) - MAX_REJECTION_EXAMPLES)} for r in reasons]
    chart = None
    if reasons:
        chart = svg_bar_chart(reasons, {lm: [float(counts[r].get(lm, 0)) for r in reasons]
                                        for lm in llms},
                              xlabel="failed check", ylabel="rejected candidates")
    return rows, chart


def _fast_curve(df: pl.DataFrame, spent: pl.DataFrame, ps: list[float]) -> list[float]:
    """fast_p at every p of ``ps`` (same definition as compare.fast_p, computed once)."""
    tasks = per_task(df, spent)
    if tasks.is_empty():
        return [0.0 for _ in ps]
    bests = [b for ok, b in zip(tasks["accepted"].to_list(),
                                tasks["best_speedup_eager"].to_list()) if ok and b is not None]
    return [sum(b > p for b in bests) / tasks.height for p in ps]


def _roofline(df: pl.DataFrame, llms: list[str], device: dict[str, Any],
              best_ids: set[tuple[str, str, str]]) -> dict[str, Any]:
    """Every accepted, timed kernel on one of two charts: the roofline (tasks that count FLOPs:
    intensity against GFLOP/s) or the bandwidth roof (tasks with bytes but no FLOPs, whose
    intensity is 0: traffic against GB/s). Kernels of tasks with neither count are left out,
    and counted."""
    acc = df.filter(pl.col("accepted") & pl.col("runtime_ms").is_not_null()
                    & (pl.col("runtime_ms") > 0))
    compute, memory, left_out = [], [], 0
    for r in acc.iter_rows(named=True):
        flops, nbytes = r["flops"] or 0.0, r["min_bytes"] or 0.0
        if nbytes <= 0 or flops < 0:
            left_out += 1
            continue
        seconds = r["runtime_ms"] * 1e-3
        gbs = nbytes / seconds / 1e9
        pct = _roofline_pct(r)
        is_best = (r["llm"], r["task"], r["candidate"]) in best_ids
        head = f"{r['task']}: {r['candidate']} ({r['llm']}, generation {r['generation']})"
        tail = (f", {_x(r['speedup_eager'])} over eager"
                + (f", {pct:.1f}% of roofline" if pct is not None else ""))
        point = {"series": r["llm"], "best": is_best,
                 "href": f"#kernel-{_slug(r['task'])}" if is_best else None}
        if flops > 0:
            ai, gflops = flops / nbytes, flops / seconds / 1e9
            compute.append({**point, "ai": ai, "gflops": gflops,
                            "title": f"{head}\n{ai:.3g} FLOP/byte, {gflops:.3g} GFLOP/s{tail}"})
        else:
            memory.append({**point, "bytes": nbytes, "gbs": gbs,
                           "title": f"{head}\n{_si_bytes(nbytes)} moved at least, "
                                    f"{gbs:.3g} GB/s{tail}"})
    return {
        "chart": svg_roofline(compute, llms, bandwidth_gbs=device.get("bandwidth_gbs"),
                              flops_tflops=device.get("flops_tflops")) if compute else None,
        "bandwidth_chart": svg_bandwidth(memory, llms, bandwidth_gbs=device.get("bandwidth_gbs"))
        if memory else None,
        "n_compute": len(compute), "n_memory": len(memory), "left_out": left_out}


def _si_bytes(v: float) -> str:
    for div, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if v >= div:
            return f"{v / div:.3g} {suffix}"
    return f"{v:.0f} B"


def _node_lines(row: dict[str, Any] | None, cid: str, gen: int) -> tuple[list[str], str]:
    if row is None:
        return [cid, f"generation {gen}", "not verified"], "unknown"
    op = row["operator"] or "?"
    if row["accepted"]:
        third = f"{_x(row['speedup_eager'])} eager" if row["speedup_eager"] else "accepted"
        return [cid, f"gen {gen} · {op}", third], "accepted"
    return [cid, f"gen {gen} · {op}", "✗ " + ", ".join(_reason_list(row))], "rejected"


def _diff(parent: str, child: str, pid: str, cid: str) -> str:
    return "".join(difflib.unified_diff(parent.splitlines(keepends=True),
                                        child.splitlines(keepends=True),
                                        fromfile=pid, tofile=cid, n=2))


def _lineage(df: pl.DataFrame, best: dict[str, Any], links: dict[tuple[str, str], str]
             ) -> dict[str, Any]:
    """Who begat the best kernel: its ancestors through proposal ``parents`` (crossovers have
    several), as an SVG tree and the members' sources (each with its diff from its first
    parent)."""
    llm, task = best["llm"], best["task"]
    rows = {r["candidate"]: r for r in df.filter((pl.col("llm") == llm)
                                                 & (pl.col("task") == task))
                                         .iter_rows(named=True)}
    gen_of: dict[str, int] = {best["candidate"]: best["generation"]}
    order: list[str] = []
    edges: list[tuple[str, str, str]] = []
    queue = [best["candidate"]]
    truncated = False
    while queue:
        cid = queue.pop(0)
        if cid in order:
            continue
        if len(order) >= MAX_LINEAGE_NODES:
            truncated = True
            break
        order.append(cid)
        row = rows.get(cid)
        if row is None:
            continue
        for p in row["parents"] or []:
            edges.append((p, cid, row["operator"] or "?"))
            if p not in gen_of:
                prow = rows.get(p)
                gen_of[p] = prow["generation"] if prow is not None else gen_of[cid] - 1
            queue.append(p)
    kept = set(order)
    edges = [e for e in edges if e[0] in kept and e[1] in kept]
    nodes, members = [], []
    for cid in sorted(order, key=lambda c: (gen_of[c], c)):
        row = rows.get(cid)
        lines, status = _node_lines(row, cid, gen_of[cid])
        anchor = _src_id(llm, task, cid)
        title = [f"{cid}: {status}"]
        if row is not None:
            title += [f"operator {row['operator']}, strategy {row['strategy']}",
                      f"parents: {', '.join(row['parents']) or 'none'}",
                      f"model {row['model'] or '-'}, {row['tokens']:,} tokens"]
        nodes.append({"id": cid, "generation": gen_of[cid], "lines": lines, "status": status,
                      "best": cid == best["candidate"], "title": "\n".join(title),
                      "href": f"#{anchor}" if row is not None else None})
        if row is None:
            continue
        parents = row["parents"] or []
        first = rows.get(parents[0]) if parents else None
        members.append({
            "row": row, "anchor": anchor, "status": status, "is_best": cid == best["candidate"],
            "parents": [{"id": p, "anchor": _src_id(llm, task, p) if p in rows else None}
                        for p in parents],
            "tag": (_x(row["speedup_eager"]) if status == "accepted"
                    else ", ".join(_reason_list(row))),
            "tag_class": (_speed_class(row["speedup_eager"]) if status == "accepted"
                          else f"{status}-tag"),
            "diff_from": parents[0] if first is not None else None,
            "diff": highlight_code(_diff(first["code"], row["code"], parents[0], cid), "diff")
            if first is not None else None,
            # the best kernel's and the roots' sources in full; the others as their diffs
            "source": highlight_code(row["code"])
            if cid == best["candidate"] or first is None else None,
        })
    svg = svg_lineage(nodes, edges, uid=_slug(task))
    return {"svg": svg, "members": members, "truncated": truncated,
            "n_nodes": len(nodes), "operators": sorted({e[2] for e in edges})}


def _target_labels(df: pl.DataFrame) -> list[str]:
    """The campaign's targets as the report names them: the device, and the kernels' language
    where it is not the device's own (``cpu, Triton kernels``: Triton's interpreter)."""
    pairs = {(t, k) for t, k in zip(df["target"].to_list(), df["kernels"].to_list()) if t}
    return sorted(t if not k or k == t else f"{t}, {k.capitalize()} kernels" for t, k in pairs)


def _comparison(campaigns: Sequence[Campaign], current: str) -> dict[str, Any]:
    """The compare table, fast_p curves and per-task best speedups of several campaigns."""
    frames = [collect(c) for c in campaigns]
    spends = [spend(c) for c in campaigns]
    df = pl.concat(frames) if frames else pl.DataFrame(schema=COLLECT_SCHEMA)
    sp = pl.concat(spends) if spends else pl.DataFrame(schema=SPEND_SCHEMA)
    table = compare_frame(df, sp)
    keys = [(c.name, lm) for c in campaigns
            for lm in sorted(set(df.filter(pl.col("campaign") == c.name)["llm"].to_list())
                             | set(sp.filter(pl.col("campaign") == c.name)["llm"].to_list()))]

    def part(frame: pl.DataFrame, cname: str, lm: str) -> pl.DataFrame:
        return frame.filter((pl.col("campaign") == cname) & (pl.col("llm") == lm))

    curves = {f"{cn}/{lm}": _fast_curve(part(df, cn, lm), part(sp, cn, lm), FAST_P_GRID)
              for cn, lm in keys}
    chart = svg_line_chart(FAST_P_GRID, curves, xlabel="p (speedup threshold over eager)",
                           ylabel="fast_p", ymax=1.0, percent=True, step=True)
    tasks_t = per_task(df, sp)
    best = {(r["campaign"], r["llm"], r["task"]): r for r in tasks_t.iter_rows(named=True)}
    tasks = sorted(set(tasks_t["task"].to_list()))
    rows = [{"task": t, "cells": [best.get((cn, lm, t)) for cn, lm in keys]} for t in tasks]
    # each campaign's targets beside its name where the campaigns differ in them: a cuda and a
    # triton campaign of the same tasks are the two forms side by side
    labels = {c.name: ", ".join(_target_labels(f)) for c, f in zip(campaigns, frames)}
    if len(set(labels.values())) <= 1:
        labels = {}
    return {"table": table.to_dicts(), "chart": chart, "keys": keys, "rows": rows,
            "current": current, "labels": labels}


def report_context(campaign: Campaign, *, mlflow_ui: str | None = None,
                   compare_with: Sequence[Campaign] = ()) -> dict[str, Any]:
    """Everything the template shows. ``mlflow_ui``: the MLflow UI's base URL (see
    ``mlflow_ui_base``); ``compare_with``: other campaigns to compare this one with."""
    df = collect(campaign)
    spent = spend(campaign)
    llms = sorted(set(df["llm"].unique().to_list()) | set(spent["llm"].unique().to_list()))
    device = {"name": None, "bandwidth_gbs": None, "flops_tflops": None,
              **device_info(campaign)}
    base = mlflow_ui_base(mlflow_ui)
    tracked = tracked_runs(campaign)
    links = {k: url for k, v in tracked.items()
             if (url := mlflow_run_url(v, base)) is not None}
    by_task: dict[str, list[dict[str, Any]]] = {}
    for (_, t), v in sorted(tracked.items()):
        by_task.setdefault(t, []).append(v)
    compare = {t: url for t, vs in by_task.items()
               if (url := mlflow_compare_url(vs, base)) is not None}
    compare_llms = mlflow_compare_url(list(tracked.values()), base, key="parent_run_id")

    def of(frame: pl.DataFrame, lm: str) -> pl.DataFrame:
        return frame.filter(pl.col("llm") == lm)

    accepted = df.filter(pl.col("accepted") & pl.col("speedup_eager").is_not_null())
    hist = svg_bar_chart(_hist_labels(), {
        lm: _histogram(accepted.filter(pl.col("llm") == lm)["speedup_eager"].to_list())
        for lm in llms}, xlabel="speedup over eager PyTorch", ylabel="accepted kernels")
    curves = {lm: _fast_curve(of(df, lm), of(spent, lm), FAST_P_GRID) for lm in llms}
    fast_chart = svg_line_chart(FAST_P_GRID, curves, xlabel="p (speedup threshold over eager)",
                                ylabel="fast_p", ymax=1.0, percent=True, step=True)
    fast_rows = [{"llm": lm, "values": _fast_curve(of(df, lm), of(spent, lm), list(FAST_P_TABLE))}
                 for lm in llms]
    rejections, rejection_chart = _rejections(df, llms, links)
    leaderboard = _leaderboard(campaign, df, spent, llms, links, compare)
    kernels = []
    for lvl in leaderboard:
        for row in lvl["rows"]:
            b = row["best"]
            if b is None:
                continue
            lineage = _lineage(df, b, links)
            kernels.append({**row, "src_anchor": _src_id(b["llm"], b["task"], b["candidate"]),
                            "lineage": lineage, "launched": _launched(b),
                            "tag_class": _speed_class(b["speedup_eager"]),
                            "best_source": next(m["source"] for m in lineage["members"]
                                                if m["is_best"]),
                            "task_source": highlight_code(b["task_source"])})
    best_ids = {(k["best"]["llm"], k["task"], k["best"]["candidate"]) for k in kernels}
    roofline = _roofline(df, llms, device, best_ids)
    others = [c for c in compare_with if c.root.resolve() != campaign.root.resolve()]
    return {
        "campaign": campaign.name,
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "devices": sorted(v for v in df["device"].unique().to_list() if v),
        "device": device,
        # the GPUs the verdicts were timed on (each its own peaks), where not only device.json's
        "timed_on": sorted(v for v in df["device_name"].unique().to_list() if v),
        "targets": _target_labels(df),
        "policies": sorted(v for v in df["policy"].unique().to_list() if v),
        "n_candidates": df.height,
        "n_accepted": int(df["accepted"].sum()) if df.height else 0,
        "llms": llms,
        "colors": {lm: PALETTE[i % len(PALETTE)] for i, lm in enumerate(llms)},
        "mlflow_ui": base,
        "n_links": len(links),
        "compare_llms": compare_llms,
        "summary": compare_frame(df, spent).to_dicts(),
        "leaderboard": leaderboard,
        "hist_chart": hist,
        "n_hist": accepted.height,
        "fast_chart": fast_chart,
        "fast_ps": FAST_P_TABLE,
        "fast_rows": fast_rows,
        "roofline": roofline,
        "rejections": rejections,
        "rejection_chart": rejection_chart,
        "costs": _costs(df, spent, llms),
        "kernels": kernels,
        "comparison": _comparison([campaign, *others], campaign.name) if others else None,
        "highlight_css": Markup(highlight_css()),
        "operator_colors": OPERATOR_COLORS,
    }


# ---------------------------------------------------------------------------------------------
# rendering


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _pct100(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.4g} ms"


def _usd(v: Any) -> str:
    return "-" if v is None else f"${v:.4f}"


def _int(v: Any) -> str:
    return "-" if v is None else f"{int(round(v)):,}"


def _g(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}"


def _env() -> Environment:
    env = Environment(loader=DictLoader({"report.html": TEMPLATE}), autoescape=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(x=_x, pct=_pct, pct100=_pct100, ms=_ms, usd=_usd, int=_int, g=_g,
                       slug=_slug)
    return env


def render_report(campaign: Campaign, *, mlflow_ui: str | None = None,
                  compare_with: Sequence[Campaign] = ()) -> str:
    return _env().get_template("report.html").render(
        **report_context(campaign, mlflow_ui=mlflow_ui, compare_with=compare_with))


def write_report(campaign: Campaign, *, mlflow_ui: str | None = None,
                 compare_with: Sequence[Campaign] = ()) -> Path:
    """Write ``<campaign>/report.html`` atomically and return its path. ``mlflow_ui``: base
    URL of the MLflow UI for the run links; ``compare_with``: campaigns to compare with."""
    path = campaign.report()
    write_atomic(path, render_report(campaign, mlflow_ui=mlflow_ui, compare_with=compare_with))
    os.chmod(path, 0o644)
    return path


TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none';
               form-action 'none'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Assay report: {{ campaign }}</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: #1d232a; background: #fafbfc; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { margin-top: 36px; border-bottom: 2px solid #dde3ea;
     padding-bottom: 4px; } h3 { margin-bottom: 6px; }
a { color: #0b5cad; } a:hover { color: #083e75; }
nav { position: sticky; top: 0; background: #fafbfcf0; border-bottom: 1px solid #dde3ea;
      padding: 6px 0; z-index: 2; font-size: 13px; }
nav a { margin-right: 14px; text-decoration: none; }
.meta { color: #5a6672; }
.facts { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.fact { background: #fff; border: 1px solid #dde3ea; border-radius: 6px; padding: 6px 12px; }
.fact b { display: block; font-size: 18px; }
table { border-collapse: collapse; margin: 8px 0 16px; background: #fff; }
th, td { border: 1px solid #dde3ea; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #eef2f6; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.ok td.v { color: #1a7f37; } tr.bad td.v { color: #b42318; }
td.detail { max-width: 520px; font-size: 12.5px; color: #3a4450; word-break: break-word; }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: #0d1117; color: #e6edf3; padding: 12px 14px; overflow-x: auto;
      border-radius: 6px; max-height: 560px; margin: 6px 0 10px; }
pre .ln { display: inline-block; min-width: 2.2em; margin-right: 12px; color: #6e7681;
          text-align: right; user-select: none; }
{{ highlight_css }}
details { margin: 6px 0; } summary { cursor: pointer; }
section.kernel { background: #fff; border: 1px solid #dde3ea; border-radius: 8px;
                 padding: 4px 16px 10px; margin: 16px 0; }
section.kernel table { margin: 6px 0 10px; }
svg.chart { background: #fff; border: 1px solid #dde3ea; max-width: 100%; height: auto;
            display: block; margin: 8px 0; }
svg .grid { stroke: #e7ecf1; } svg .axis { stroke: #5a6672; }
svg text { font: 11px system-ui, sans-serif; fill: #3a4450; }
svg .yt { text-anchor: end; } svg .xt { text-anchor: middle; } svg .al { text-anchor: middle; }
svg.lineage .node rect { stroke-width: 1.5; }
svg.lineage .accepted rect { fill: #e9f6ec; stroke: #1a7f37; }
svg.lineage .rejected rect { fill: #fdeeee; stroke: #b42318; }
svg.lineage .unknown rect { fill: #f2f4f7; stroke: #8c959f; stroke-dasharray: 4 3; }
svg.lineage .best rect { stroke: #bf8700; stroke-width: 3; }
svg.lineage text.id { font: bold 11.5px ui-monospace, Menlo, Consolas, monospace; fill: #1d232a; }
svg.lineage text.nl { font-size: 11px; }
svg a:hover rect, svg a:hover circle { filter: brightness(0.92); }
.note { color: #5a6672; font-size: 13px; }
.tag { display: inline-block; border-radius: 4px; padding: 0 6px; font-size: 12px;
       color: #fff; }
.accepted-tag, .faster-tag { background: #1a7f37; } .rejected-tag { background: #b42318; }
.slower-tag { background: #9a6700; }
.unknown-tag { background: #8c959f; }
</style>
</head>
<body><main>
{% macro ext(link, text) %}<a href="{{ link }}" target="_blank" rel="noopener">{{ text }}</a>
{%- endmacro %}
{% macro run(link) %}{% if link %}{{ ext(link, "run") }}{% else %}-{% endif %}{% endmacro %}
<h1>Assay report: <code>{{ campaign }}</code></h1>
<p class="meta">{{ n_candidates }} verified candidates, {{ n_accepted }} accepted;
LLM backends: {{ llms | join(", ") or "none" }};
verifier policy: {{ policies | join(", ") or "-" }};
target: {{ targets | join(", ") or "-" }}; generated {{ generated }}.</p>
<div class="facts">
<div class="fact">device<b>{{ device.name or (devices | join(", ")) or "-" }}</b></div>
<div class="fact">memory bandwidth (measured)<b>{{ device.bandwidth_gbs | g }} GB/s</b></div>
<div class="fact">fp32 peak (measured)<b>{{ device.flops_tflops | g }} TFLOP/s</b></div>
{% if timed_on and timed_on != [device.name] %}<div class="fact">verdicts timed on (each with
its own peaks)<b>{{ timed_on | join(", ") }}</b></div>{% endif %}
<div class="fact">accepted / verified<b>{{ n_accepted }} / {{ n_candidates }}</b></div>
<div class="fact">MLflow runs linked<b>{{ n_links }}</b></div>
</div>
<nav><a href="#summary">Summary</a>
{% if comparison %}<a href="#comparison">Comparison</a>{% endif %}
<a href="#leaderboard">Leaderboard</a><a href="#speedups">Speedups</a>
<a href="#fast-p">fast_p</a><a href="#roofline">Roofline</a><a href="#rejections">Rejections</a>
<a href="#costs">Tokens &amp; cost</a><a href="#kernels">Best kernels &amp; lineage</a></nav>

<h2 id="summary">Summary per LLM</h2>
{% if summary %}
<table>
<tr><th>llm</th><th>tasks tried</th><th>accepted tasks</th><th>fast_1</th>
<th>geomean speedup (accepted tasks)</th><th>tokens</th><th>cost</th></tr>
{% for r in summary %}
<tr><td>{{ r.llm }}</td><td class="n">{{ r.tasks_tried }}</td><td class="n">{{ r.accepted }}</td>
<td class="n">{{ r.fast_1 | pct }}</td><td class="n">{{ r.geomean_speedup_accepted | x }}</td>
<td class="n">{{ r.tokens | int }}</td><td class="n">{{ r.cost_usd | usd }}</td></tr>
{% endfor %}
</table>
<p class="note">fast_1: fraction of tried tasks whose best accepted kernel beats eager PyTorch
(speedup &gt; 1). The geometric mean is over tasks with an accepted kernel only.</p>
{% if compare_llms %}<p>{{ ext(compare_llms, "compare the backends in MLflow") }} (their
parent runs side by side; each task's <b>compare</b> link in the
leaderboard does the same for that task's runs).</p>{% endif %}
{% else %}
<p>No verified candidates yet.</p>
{% endif %}

{% if comparison %}
<h2 id="comparison">Comparison with other campaigns</h2>
<table>
<tr><th>campaign</th><th>llm</th><th>tasks tried</th><th>accepted tasks</th><th>fast_1</th>
<th>geomean speedup (accepted tasks)</th><th>tokens</th><th>cost</th></tr>
{% for r in comparison.table %}
<tr{% if r.campaign == comparison.current %} class="ok"{% endif %}><td>{{ r.campaign }}
{%- if comparison.labels.get(r.campaign) %} ({{ comparison.labels[r.campaign] }}){% endif %}</td>
<td>{{ r.llm }}</td><td class="n">{{ r.tasks_tried }}</td><td class="n">{{ r.accepted }}</td>
<td class="n">{{ r.fast_1 | pct }}</td><td class="n">{{ r.geomean_speedup_accepted | x }}</td>
<td class="n">{{ r.tokens | int }}</td><td class="n">{{ r.cost_usd | usd }}</td></tr>
{% endfor %}
</table>
{{ comparison.chart }}
<h3>Best speedup over eager per task</h3>
<table>
<tr><th>task</th>
{% for cn, lm in comparison["keys"] %}<th>{{ cn }}<br>{{ lm }}
{%- if comparison.labels.get(cn) %}<br>{{ comparison.labels[cn] }}{% endif %}</th>{% endfor %}</tr>
{% for r in comparison.rows %}
<tr><td><code>{{ r.task }}</code></td>
{% for c in r.cells %}
<td class="n">{% if c is none %}-{% elif c.accepted %}{{ c.best_speedup_eager | x }}
{%- else %}&#10007;{% endif %}</td>
{% endfor %}
</tr>
{% endfor %}
</table>
<p class="note">&#10007;: tried, nothing accepted; -: not tried. Campaigns are told apart by
name; tasks by id.</p>
{% endif %}

<h2 id="leaderboard">Leaderboard</h2>
{% for lvl in leaderboard %}
<h3>Level {{ lvl.level }}</h3>
<table>
<tr><th>task</th><th>best kernel</th><th>llm</th><th>speedup vs eager</th>
<th>speedup vs compile</th><th>runtime</th><th>% of roofline</th>
{% for lm in llms %}<th>{{ lm }}</th>{% endfor %}<th>verdict</th><th>MLflow</th></tr>
{% for r in lvl.rows %}
<tr class="{{ 'ok' if r.best else 'bad' }}" id="task-{{ r.anchor }}">
<td><code>{{ r.task }}</code></td>
{% if r.best %}
<td><a href="#kernel-{{ r.anchor }}"><code>{{ r.best.candidate }}</code></a></td>
<td>{{ r.best.llm }}</td>
<td class="n">{{ r.best.speedup_eager | x }}
{%- if r.best.baseline_eager_default_ms and r.best.runtime_ms %}<br><small title="eager with
cuDNN in TF32, PyTorch's default numerics">{{ (r.best.baseline_eager_default_ms
/ r.best.runtime_ms) | x }} TF32 eager</small>{% endif %}</td>
<td class="n">{{ r.best.speedup_compile | x }}</td>
<td class="n">{{ r.best.runtime_ms | ms }}</td><td class="n">{{ r.roofline_pct | pct100 }}</td>
{% else %}
<td>-</td><td>-</td><td class="n">-</td><td class="n">-</td><td class="n">-</td><td class="n">-</td>
{% endif %}
{% for c in r.per_llm %}
<td class="n">{% if c.speedup is not none %}{{ c.speedup | x }}
{%- elif c.tried %}&#10007;{% else %}-{% endif %}</td>
{% endfor %}
<td class="v">{{ r.verdict }}{% if r.n_candidates %} ({{ r.n_accepted }}/{{ r.n_candidates }}
accepted){% endif %}</td>
<td>{{ run(r.link) }}{% if r.compare %} {{ ext(r.compare, "compare") }}{% endif %}</td></tr>
{% endfor %}
</table>
{% else %}
<p>No tasks.</p>
{% endfor %}
<p class="note">Per-LLM columns: that backend's best accepted speedup over eager
(&#10007;: tried, nothing accepted). % of roofline = roofline time / measured time.
Eager runs in true fp32, as every candidate must; where PyTorch's default numerics differ
(cuDNN in TF32 for convolutions and recurrent layers on a GPU) the speedup over eager run that
way is shown beneath ("TF32 eager").
The verdict column counts accepted / verified candidates. MLflow: the task's child run of the
best kernel's backend, and (compare) all its backends' runs side by side{% if n_links %} in
the MLflow UI at <code>{{ mlflow_ui }}</code>
(<code>mlflow ui --backend-store-uri sqlite:///results/mlflow.db</code>){% else %} (none
tracked yet){% endif %}.</p>

<h2 id="speedups">Speedup distribution</h2>
<p class="note">Speedup over eager PyTorch of all {{ n_hist }} accepted, timed candidates.</p>
{{ hist_chart }}

<h2 id="fast-p">fast_p per LLM</h2>
<p class="note">fast_p: fraction of tried tasks whose best accepted kernel has speedup over eager
&gt; p (KernelBench). At p = 0 it is the fraction of tasks with an accepted kernel.</p>
{{ fast_chart }}
<table>
<tr><th>llm</th>{% for p in fast_ps %}<th>fast_{{ p }}</th>{% endfor %}</tr>
{% for r in fast_rows %}
<tr><td>{{ r.llm }}</td>{% for v in r["values"] %}<td class="n">{{ v | pct }}</td>{% endfor %}</tr>
{% endfor %}
</table>

<h2 id="roofline">Roofline</h2>
<p class="note">Every accepted, timed kernel, on the chart its task's counts allow. The line is
the device's measured roof{% if not device.bandwidth_gbs or not device.flops_tflops %} (unknown:
no <code>device.json</code> peaks){% endif %}; large outlined points are the tasks' best
kernels.{% if roofline.left_out %} {{ roofline.left_out }} kernel(s) of tasks without a byte
count are not drawn.{% endif %}</p>
{% if roofline.chart %}
<h3>Compute: tasks that count FLOPs ({{ roofline.n_compute }})</h3>
<p class="note">The task's FLOPs over its minimum memory traffic (arithmetic intensity) against
the FLOPs per second the kernel attained.</p>
{{ roofline.chart }}
{% endif %}
{% if roofline.bandwidth_chart %}
<h3 id="bandwidth">Memory-bound: tasks that count no FLOPs ({{ roofline.n_memory }})</h3>
<p class="note">Their arithmetic intensity is 0 (nothing on the roofline's log axis), so they
are measured against the bandwidth roof alone: the task's minimum memory traffic against the
bytes per second the kernel attained moving it (minimum traffic / runtime; real traffic can only
be larger).</p>
{{ roofline.bandwidth_chart }}
{% endif %}
{% if not roofline.chart and not roofline.bandwidth_chart %}
<p>No accepted, timed kernel to draw.</p>
{% endif %}

<h2 id="rejections">Rejected candidates by reason</h2>
{% if rejections %}
<table>
<tr><th>failed check</th><th>total</th>{% for lm in llms %}<th>{{ lm }}</th>{% endfor %}</tr>
{% for r in rejections %}
<tr><td><a href="#reason-{{ r.reason | slug }}"><code>{{ r.reason }}</code></a></td>
<td class="n">{{ r.total }}</td>
{% for c in r.per_llm %}<td class="n">{{ c }}</td>{% endfor %}</tr>
{% endfor %}
</table>
{{ rejection_chart }}
<p class="note">A candidate rejected for several checks counts once per check.</p>
{% for r in rejections %}
<details id="reason-{{ r.reason | slug }}"><summary><code>{{ r.reason }}</code>: {{ r.total }}
rejected candidate(s)</summary>
<table>
<tr><th>task</th><th>llm</th><th>gen</th><th>candidate</th><th>operator</th><th>detail</th>
<th>MLflow</th></tr>
{% for e in r.examples %}
<tr><td><a href="#task-{{ e.task_anchor }}"><code>{{ e.task }}</code></a></td><td>{{ e.llm }}</td>
<td class="n">{{ e.generation }}</td><td><code>{{ e.candidate }}</code></td>
<td>{{ e.operator or "-" }}</td><td class="detail">{{ e.detail or "-" }}</td>
<td>{{ run(e.link) }}</td></tr>
{% endfor %}
</table>
{% if r.more %}<p class="note">and {{ r.more }} more (see the archive's
<code>Verdict_Reasons</code>).</p>{% endif %}
</details>
{% endfor %}
{% else %}
<p>No rejected candidates.</p>
{% endif %}

<h2 id="costs">Tokens and cost per accepted kernel</h2>
<table>
<tr><th>llm</th><th>proposed</th><th>declined</th><th>verified</th><th>accepted</th>
<th>tasks solved</th><th>tokens</th>
<th>cost</th><th>tokens / accepted kernel</th><th>cost / accepted kernel</th>
<th>cost / solved task</th></tr>
{% for r in costs %}
<tr><td>{{ r.llm }}</td><td class="n">{{ r.proposed | int }}</td>
<td class="n">{{ r.declined | int }}</td><td class="n">{{ r.candidates }}</td>
<td class="n">{{ r.accepted }}</td>
<td class="n">{{ r.solved }}</td><td class="n">{{ r.tokens | int }}</td>
<td class="n">{{ r.cost | usd }}</td><td class="n">{{ r.tokens_per_kernel | int }}</td>
<td class="n">{{ r.cost_per_kernel | usd }}</td><td class="n">{{ r.cost_per_task | usd }}</td></tr>
{% endfor %}
</table>
<p class="note">Tokens and cost: all the proposer spent (the generations' proposals.json
totals: declined proposals and candidates not yet verified included). Accepted kernels: accepted
candidates (several per task possible); solved tasks: tasks with at least one.</p>

<h2 id="kernels">Best kernels and their lineage</h2>
{% for k in kernels %}
{% set b = k.best %}
<section class="kernel" id="kernel-{{ k.anchor }}">
<h3><code>{{ k.task }}</code>: <code>{{ b.candidate }}</code>
<span class="tag {{ k.tag_class }}">{{ b.speedup_eager | x }} over eager</span></h3>
<table>
<tr><th>llm</th><th>model</th><th>generation</th><th>operator</th><th>strategy</th>
<th>runtime</th><th>vs eager</th><th>vs compile</th><th>% of roofline</th><th>max abs err</th>
<th>tokens</th><th>cost</th><th>MLflow</th></tr>
<tr><td>{{ b.llm }}</td><td>{{ b.model or "-" }}</td><td class="n">{{ b.generation }}</td>
<td>{{ b.operator or "-" }}</td><td>{{ b.strategy or "-" }}</td>
<td class="n">{{ b.runtime_ms | ms }}</td><td class="n">{{ b.speedup_eager | x }}</td>
<td class="n">{{ b.speedup_compile | x }}</td><td class="n">{{ k.roofline_pct | pct100 }}</td>
<td class="n">{{ b.max_abs_err | g }}</td><td class="n">{{ b.tokens | int }}</td>
<td class="n">{{ b.cost_usd | usd }}</td>
<td>{{ run(k.link) }}</td></tr>
</table>
{% if k.launched.cpu %}<p class="note">{% if k.launched.names %}Ops it ran:
{% for n in k.launched.names %}<code>{{ n }}</code>{{ ", " if not loop.last }}{% endfor %}.
{% else %}No compute op ran: the work was its own compiled code.{% endif %} (On the cpu target
the profiler sees ATen ops, not the candidate's C++ functions; allocations, views and copies
are not listed.)</p>
{% elif k.launched.names %}<p class="note">Kernels launched:
{% for n in k.launched.names %}<code>{{ n }}</code>{{ ", " if not loop.last }}{% endfor %}.</p>
{% endif %}
<p class="note">Lineage: {{ k.lineage.n_nodes }} candidate(s); arrows run from parent to child,
coloured by how the child was made; the outlined box is the best kernel. Click a box for its
source.{% if k.lineage.truncated %} Truncated at the closest ancestors.{% endif %}</p>
{{ k.lineage.svg }}
<details{% if loop.first %} open{% endif %} id="{{ k.src_anchor }}"><summary>source of the best
kernel <code>{{ b.candidate }}</code></summary>
<pre class="hl"><code>{{ k.best_source }}</code></pre>
</details>
<details><summary>the task (PyTorch reference)</summary>
<pre class="hl"><code>{{ k.task_source }}</code></pre>
</details>
{% for m in k.lineage.members if not m.is_best %}
<details id="{{ m.anchor }}"><summary>ancestor <code>{{ m.row.candidate }}</code>:
generation {{ m.row.generation }}, {{ m.row.operator or "?" }}
<span class="tag {{ m.tag_class }}">{{ m.tag }}</span></summary>
{% if m.diff %}<p class="note">Changes from its parent <code>{{ m.diff_from }}</code>:</p>
<pre class="hl"><code>{{ m.diff }}</code></pre>
{% else %}<pre class="hl"><code>{{ m.source }}</code></pre>{% endif %}
</details>
{% endfor %}
{% for m in k.lineage.members if m.is_best and m.diff %}
<details><summary>what the best kernel changed from its parent
<code>{{ m.diff_from }}</code></summary>
<pre class="hl"><code>{{ m.diff }}</code></pre>
</details>
{% endfor %}
</section>
{% else %}
<p>No accepted kernels yet.</p>
{% endfor %}
</main></body>
</html>
"""
