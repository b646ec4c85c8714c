"""The campaign report: one static, self-contained HTML page (inline CSS, inline SVG charts,
no scripts and no network), rendered with Jinja2 (autoescaped) from collect().

Sections: summary per LLM, leaderboard per level, speedup distribution, fast_p curves,
rejections by reason, tokens and cost per accepted kernel, best kernels' sources.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl
from jinja2 import DictLoader, Environment
from markupsafe import Markup, escape

from assay.collect import best_accepted, collect, spend, task_ids, task_info
from assay.layout import Campaign, write_atomic
from assay.report.compare import compare_frame, per_task

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
FAST_P_GRID = [round(0.01 * i, 2) for i in range(301)]  # p in 0..3
FAST_P_TABLE = (0.0, 1.0, 1.5, 2.0, 3.0)
# log2 bins of speedup over eager: edges and labels
HIST_EDGES = (0.0, 0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 8.0, math.inf)


# ---------------------------------------------------------------------------------------------
# inline SVG charts


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _num(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"


def _legend(names: list[str], x: float, y: float) -> list[str]:
    out = []
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        yy = y + 16 * i
        out.append(f'<rect x="{x}" y="{yy - 9}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14}" y="{yy}" class="lg">{escape(name)}</text>')
    return out


def svg_bar_chart(categories: list[str], series: dict[str, list[float]], *, xlabel: str = "",
                  ylabel: str = "", width: int = 680, height: int = 260,
                  counts: bool = True) -> Markup:
    """Grouped bars: one group per category, one bar per series (``counts``: integer ticks)."""
    left, right, top, bottom = 48, 130, 12, 48
    pw, ph = width - left - right, height - top - bottom
    vmax = max((v for vals in series.values() for v in vals), default=0.0)
    ymax = 4 * max(1, math.ceil(vmax / 4)) if counts else _nice_max(vmax)
    n_cat, n_ser = max(len(categories), 1), max(len(series), 1)
    group = pw / n_cat
    bar = group * 0.8 / n_ser
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img">']
    for i in range(5):
        v = ymax * i / 4
        y = top + ph - ph * v / ymax
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'class="grid"/><text x="{left - 6}" y="{y + 4:.1f}" class="yt">'
                     f'{_num(v)}</text>')
    for s, (name, vals) in enumerate(series.items()):
        color = PALETTE[s % len(PALETTE)]
        for c, v in enumerate(vals):
            h = ph * v / ymax
            x = left + group * c + group * 0.1 + bar * s
            parts.append(f'<rect x="{x:.1f}" y="{top + ph - h:.1f}" width="{bar:.1f}" '
                         f'height="{h:.1f}" fill="{color}"><title>{escape(name)}: '
                         f'{escape(categories[c])}: {_num(v)}</title></rect>')
    for c, label in enumerate(categories):
        x = left + group * (c + 0.5)
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 16}" class="xt">{escape(label)}</text>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" '
                 f'class="axis"/>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 6}" class="al">'
                 f'{escape(xlabel)}</text>')
    parts.append(f'<text x="12" y="{top + ph / 2:.1f}" class="al" '
                 f'transform="rotate(-90 12 {top + ph / 2:.1f})">{escape(ylabel)}</text>')
    parts += _legend(list(series), left + pw + 14, top + 12)
    parts.append("</svg>")
    return Markup("".join(parts))


def svg_line_chart(xs: list[float], series: dict[str, list[float]], *, xlabel: str = "",
                   ylabel: str = "", ymax: float | None = None, width: int = 680,
                   height: int = 260, percent: bool = False, step: bool = False) -> Markup:
    """Lines over a shared x axis (``step``: drawn as a step function)."""
    left, right, top, bottom = 48, 130, 12, 40
    pw, ph = width - left - right, height - top - bottom
    top_v = ymax if ymax is not None else _nice_max(
        max((v for vals in series.values() for v in vals), default=0.0))
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    span = (x1 - x0) or 1.0

    def px(x: float) -> float:
        return left + pw * (x - x0) / span

    def py(y: float) -> float:
        return top + ph - ph * y / top_v

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img">']
    for i in range(5):
        v = top_v * i / 4
        label = f"{v * 100:.0f}%" if percent else _num(v)
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
                     f'class="grid"/><text x="{left - 6}" y="{py(v) + 4:.1f}" class="yt">'
                     f'{label}</text>')
    ticks = sorted({round(x0 + span * i / 6, 2) for i in range(7)})
    for t in ticks:
        parts.append(f'<text x="{px(t):.1f}" y="{top + ph + 16}" class="xt">{_num(t)}</text>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" '
                 f'class="axis"/>')
    for s, (name, vals) in enumerate(series.items()):
        color = PALETTE[s % len(PALETTE)]
        pts: list[str] = []
        for i, (x, y) in enumerate(zip(xs, vals)):
            if step and i:  # hold the previous value up to this x
                pts.append(f"{px(x):.1f},{py(vals[i - 1]):.1f}")
            pts.append(f"{px(x):.1f},{py(y):.1f}")
        dash = ' stroke-dasharray="6 3"' if s % 2 else ""
        parts.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" '
                     f'stroke-width="2"{dash}><title>{escape(name)}</title></polyline>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 4}" class="al">'
                 f'{escape(xlabel)}</text>')
    parts.append(f'<text x="12" y="{top + ph / 2:.1f}" class="al" '
                 f'transform="rotate(-90 12 {top + ph / 2:.1f})">{escape(ylabel)}</text>')
    parts += _legend(list(series), left + pw + 14, top + 12)
    parts.append("</svg>")
    return Markup("".join(parts))


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


def _leaderboard(campaign: Campaign, df: pl.DataFrame, spent: pl.DataFrame,
                 llms: list[str]) -> list[dict[str, Any]]:
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
            verdict = (f"no candidate; {n_declined} proposal(s) declined"
                       if n_declined and not int(sp["proposed"].sum()) else "not verified yet")
        else:
            reasons = Counter(r for row in rows.iter_rows(named=True) for r in _reason_list(row))
            top = ", ".join(f"{k} ({v})" for k, v in reasons.most_common(2))
            verdict = f"no accepted kernel; rejected for {top}"
        roof = None
        if b is not None and b["roofline_ms"] is not None and b["runtime_ms"]:
            roof = b["roofline_ms"] / b["runtime_ms"] * 100
        tried = (set(rows["llm"].unique().to_list())
                 | set(spent.filter(pl.col("task") == t)["llm"].unique().to_list()))
        levels.setdefault(info["level"], []).append({
            "task": t, "name": info["name"], "best": b, "roofline_pct": roof,
            "verdict": verdict, "n_candidates": rows.height,
            "n_accepted": int(rows["accepted"].sum()) if rows.height else 0,
            "per_llm": [(per_llm[(lm, t)]["speedup_eager"] if (lm, t) in per_llm else None,
                         lm in tried) for lm in llms],
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


def _rejections(df: pl.DataFrame, llms: list[str]) -> tuple[list[dict[str, Any]], Markup | None]:
    counts: dict[str, Counter[str]] = {}
    for row in df.filter(~pl.col("accepted")).iter_rows(named=True):
        for r in _reason_list(row):
            counts.setdefault(r, Counter())[row["llm"]] += 1
    reasons = sorted(counts, key=lambda r: (-sum(counts[r].values()), r))
    rows = [{"reason": r, "total": sum(counts[r].values()),
             "per_llm": [counts[r].get(lm, 0) for lm in llms]} for r in reasons]
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


def report_context(campaign: Campaign) -> dict[str, Any]:
    df = collect(campaign)
    spent = spend(campaign)
    llms = sorted(set(df["llm"].unique().to_list()) | set(spent["llm"].unique().to_list()))

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
    rejections, rejection_chart = _rejections(df, llms)
    leaderboard = _leaderboard(campaign, df, spent, llms)
    kernels = [row for lvl in leaderboard for row in lvl["rows"] if row["best"] is not None]
    return {
        "campaign": campaign.name,
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "devices": sorted(v for v in df["device"].unique().to_list() if v),
        "policies": sorted(v for v in df["policy"].unique().to_list() if v),
        "n_candidates": df.height,
        "n_accepted": int(df["accepted"].sum()) if df.height else 0,
        "llms": llms,
        "summary": compare_frame(df, spent).to_dicts(),
        "leaderboard": leaderboard,
        "hist_chart": hist,
        "n_hist": accepted.height,
        "fast_chart": fast_chart,
        "fast_ps": FAST_P_TABLE,
        "fast_rows": fast_rows,
        "rejections": rejections,
        "rejection_chart": rejection_chart,
        "costs": _costs(df, spent, llms),
        "kernels": kernels,
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


def _env() -> Environment:
    env = Environment(loader=DictLoader({"report.html": TEMPLATE}), autoescape=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(x=_x, pct=_pct, pct100=_pct100, ms=_ms, usd=_usd, int=_int)
    return env


def render_report(campaign: Campaign) -> str:
    return _env().get_template("report.html").render(**report_context(campaign))


def write_report(campaign: Campaign) -> Path:
    """Write ``<campaign>/report.html`` atomically and return its path."""
    path = campaign.report()
    write_atomic(path, render_report(campaign))
    os.chmod(path, 0o644)  # write_atomic's temp file is created 0600
    return path


TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Assay report: {{ campaign }}</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: #1d232a; background: #fafbfc; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { margin-top: 36px; border-bottom: 2px solid #dde3ea;
     padding-bottom: 4px; } h3 { margin-bottom: 6px; }
.meta { color: #5a6672; }
table { border-collapse: collapse; margin: 8px 0 16px; background: #fff; }
th, td { border: 1px solid #dde3ea; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #eef2f6; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.ok td.v { color: #1a7f37; } tr.bad td.v { color: #b42318; }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: #0f1720; color: #e6edf3; padding: 12px 14px; overflow-x: auto;
      border-radius: 6px; max-height: 560px; }
details { margin: 6px 0; } summary { cursor: pointer; }
svg.chart { background: #fff; border: 1px solid #dde3ea; max-width: 100%; height: auto; }
svg .grid { stroke: #e7ecf1; } svg .axis { stroke: #5a6672; }
svg text { font: 11px system-ui, sans-serif; fill: #3a4450; }
svg .yt { text-anchor: end; } svg .xt { text-anchor: middle; } svg .al { text-anchor: middle; }
.note { color: #5a6672; font-size: 13px; }
</style>
</head>
<body><main>
<h1>Assay report: <code>{{ campaign }}</code></h1>
<p class="meta">{{ n_candidates }} verified candidates, {{ n_accepted }} accepted;
LLM backends: {{ llms | join(", ") or "none" }};
verifier policy: {{ policies | join(", ") or "-" }}; device: {{ devices | join(", ") or "-" }};
generated {{ generated }}.</p>

<h2>Summary per LLM</h2>
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
{% else %}
<p>No verified candidates yet.</p>
{% endif %}

<h2>Leaderboard</h2>
{% for lvl in leaderboard %}
<h3>Level {{ lvl.level }}</h3>
<table>
<tr><th>task</th><th>best kernel</th><th>llm</th><th>speedup vs eager</th>
<th>speedup vs compile</th><th>runtime</th><th>% of roofline</th>
{% for lm in llms %}<th>{{ lm }}</th>{% endfor %}<th>verdict</th></tr>
{% for r in lvl.rows %}
<tr class="{{ 'ok' if r.best else 'bad' }}" id="task-{{ r.task }}">
<td><code>{{ r.task }}</code></td>
{% if r.best %}
<td><a href="#kernel-{{ r.task }}"><code>{{ r.best.candidate }}</code></a></td>
<td>{{ r.best.llm }}</td>
<td class="n">{{ r.best.speedup_eager | x }}</td><td class="n">{{ r.best.speedup_compile | x }}</td>
<td class="n">{{ r.best.runtime_ms | ms }}</td><td class="n">{{ r.roofline_pct | pct100 }}</td>
{% else %}
<td>-</td><td>-</td><td class="n">-</td><td class="n">-</td><td class="n">-</td><td class="n">-</td>
{% endif %}
{% for s, tried in r.per_llm %}
<td class="n">{% if s is not none %}{{ s | x }}{% elif tried %}&#10007;{% else %}-{% endif %}</td>
{% endfor %}
<td class="v">{{ r.verdict }} ({{ r.n_accepted }}/{{ r.n_candidates }})</td></tr>
{% endfor %}
</table>
{% else %}
<p>No tasks.</p>
{% endfor %}
<p class="note">Per-LLM columns: that backend's best accepted speedup over eager
(&#10007;: tried, nothing accepted). % of roofline = roofline time / measured time.
The last column counts accepted / verified candidates.</p>

<h2>Speedup distribution</h2>
<p class="note">Speedup over eager PyTorch of all {{ n_hist }} accepted, timed candidates.</p>
{{ hist_chart }}

<h2>fast_p per LLM</h2>
<p class="note">fast_p: fraction of tried tasks whose best accepted kernel has speedup over eager
&gt; p (KernelBench). At p = 0 it is the fraction of tasks with an accepted kernel.</p>
{{ fast_chart }}
<table>
<tr><th>llm</th>{% for p in fast_ps %}<th>fast_{{ p }}</th>{% endfor %}</tr>
{% for r in fast_rows %}
<tr><td>{{ r.llm }}</td>{% for v in r["values"] %}<td class="n">{{ v | pct }}</td>{% endfor %}</tr>
{% endfor %}
</table>

<h2>Rejected candidates by reason</h2>
{% if rejections %}
<table>
<tr><th>failed check</th><th>total</th>{% for lm in llms %}<th>{{ lm }}</th>{% endfor %}</tr>
{% for r in rejections %}
<tr><td><code>{{ r.reason }}</code></td><td class="n">{{ r.total }}</td>
{% for c in r.per_llm %}<td class="n">{{ c }}</td>{% endfor %}</tr>
{% endfor %}
</table>
{{ rejection_chart }}
<p class="note">A candidate rejected for several checks counts once per check.</p>
{% else %}
<p>No rejected candidates.</p>
{% endif %}

<h2>Tokens and cost per accepted kernel</h2>
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

<h2>Best kernels</h2>
{% for r in kernels %}
<details id="kernel-{{ r.task }}"><summary><code>{{ r.task }}</code>:
<code>{{ r.best.candidate }}</code> by {{ r.best.llm }}, generation {{ r.best.generation }},
{{ r.best.speedup_eager | x }} over eager</summary>
<pre><code>{{ r.best.code }}</code></pre>
</details>
{% else %}
<p>No accepted kernels yet.</p>
{% endfor %}
</main></body>
</html>
"""
