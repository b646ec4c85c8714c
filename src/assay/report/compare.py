"""Compare LLM backends (and campaigns): one row per (campaign, llm), computed from collect().

Metrics, per task: a task is *tried* by an llm when the llm proposed anything for it (a verified
candidate, or proposals on disk: a task whose proposals were all declined counts as tried and
failed); its *best* kernel is the accepted candidate with the highest speedup over eager.

- ``accepted``: tasks with at least one accepted kernel;
- ``fast_1``: KernelBench's fast_p with p = 1: the fraction of tried tasks whose best accepted
  kernel is strictly faster than eager PyTorch (speedup_eager > 1);
- ``geomean_speedup_accepted``: geometric mean of the best speedup over eager, over the
  accepted tasks only (tasks without an accepted kernel do not count; null when there are none);
- ``tokens``, ``cost_usd``: spent by the proposer, from the generations' proposals.json
  totals (``collect.spend``: declined and not yet verified proposals included); without
  them, summed over the verified candidates.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import polars as pl

from assay.collect import COLLECT_SCHEMA, SPEND_SCHEMA, collect, spend
from assay.layout import Campaign

COMPARE_SCHEMA: dict[str, pl.DataType] = {
    "campaign": pl.String(),
    "llm": pl.String(),
    "tasks_tried": pl.Int64(),
    "accepted": pl.Int64(),
    "fast_1": pl.Float64(),
    "geomean_speedup_accepted": pl.Float64(),
    "tokens": pl.Int64(),
    "cost_usd": pl.Float64(),
}


KEYS = ["campaign", "llm", "task"]


def per_task(df: pl.DataFrame, spent: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per (campaign, llm, task) tried: whether any kernel was accepted, the best
    accepted speedups (null if none; the compile one is the highest over accepted kernels),
    counts, tokens and cost. ``spent`` (a ``collect.spend()`` table) adds the tasks with
    proposals but no verified candidate, and replaces the token and cost sums by the spend."""
    acc = pl.col("accepted")
    out = (df.group_by(KEYS, maintain_order=True)
             .agg(accepted=acc.any(),
                  n_candidates=pl.len().cast(pl.Int64),
                  n_accepted=acc.sum().cast(pl.Int64),
                  best_speedup_eager=pl.col("speedup_eager").filter(acc).max(),
                  best_speedup_compile=pl.col("speedup_compile").filter(acc).max(),
                  tokens=pl.col("tokens").sum(),
                  cost_usd=pl.col("cost_usd").sum()))
    if spent is not None and not spent.is_empty():
        sp = spent.group_by(KEYS).agg(spent_tokens=pl.col("tokens").sum(),
                                      spent_cost=pl.col("cost_usd").sum())
        out = (out.join(sp, on=KEYS, how="full", coalesce=True)
                  .with_columns(accepted=acc.fill_null(False),
                                n_candidates=pl.col("n_candidates").fill_null(0),
                                n_accepted=pl.col("n_accepted").fill_null(0),
                                tokens=pl.coalesce("spent_tokens", "tokens"),
                                cost_usd=pl.coalesce("spent_cost", "cost_usd"))
                  .drop("spent_tokens", "spent_cost"))
    return out.sort(KEYS)


def _fast_expr(p: float) -> pl.Expr:
    return (pl.col("accepted") & (pl.col("best_speedup_eager") > p)).fill_null(False)


def fast_p(df: pl.DataFrame, p: float, spent: pl.DataFrame | None = None) -> float:
    """KernelBench's fast_p over the tasks tried in ``df`` (a collect() table, possibly filtered
    to one llm): the fraction of tried (campaign, llm, task) whose best accepted kernel has
    speedup_eager > p. Untimed accepted kernels do not count as fast. With ``spent`` (a
    ``collect.spend()`` table, filtered alike), tasks with proposals but no verified candidate
    count as tried. 0.0 when there is no tried task."""
    tasks = per_task(df, spent)
    if tasks.is_empty():
        return 0.0
    return float(tasks.select(_fast_expr(p).mean()).item())


def compare_frame(df: pl.DataFrame, spent: pl.DataFrame | None = None) -> pl.DataFrame:
    """The compare table of a collect() table and, optionally, its spend() table."""
    tasks = per_task(df, spent)
    if tasks.is_empty():
        return pl.DataFrame(schema=COMPARE_SCHEMA)
    best = pl.col("best_speedup_eager")
    ok = pl.col("accepted") & (best > 0)
    table = (tasks
             .group_by(["campaign", "llm"])
             .agg(tasks_tried=pl.len(),
                  accepted=pl.col("accepted").sum(),
                  fast_1=_fast_expr(1.0).mean(),
                  geomean_speedup_accepted=best.filter(ok).log().mean().exp(),
                  tokens=pl.col("tokens").sum(),
                  cost_usd=pl.col("cost_usd").sum())
             .cast(COMPARE_SCHEMA)  # type: ignore[arg-type]
             .select(list(COMPARE_SCHEMA)))
    return table.sort(["fast_1", "geomean_speedup_accepted", "campaign", "llm"],
                      descending=[True, True, False, False], nulls_last=True)


def compare_table(campaigns: Sequence[Campaign]) -> pl.DataFrame:
    """One row per (campaign, llm) over ``campaigns``, best first (fast_1, then geomean,
    descending). Campaigns are told apart by name."""
    frames = [collect(c) for c in campaigns]
    spends = [spend(c) for c in campaigns]
    df = pl.concat(frames) if frames else pl.DataFrame(schema=COLLECT_SCHEMA)
    sp = pl.concat(spends) if spends else pl.DataFrame(schema=SPEND_SCHEMA)
    return compare_frame(df, sp)


def _fmt(v: object, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "pct":
        return f"{float(v) * 100:.1f}%"  # type: ignore[arg-type]
    if kind == "x":
        return f"{float(v):.3f}x"  # type: ignore[arg-type]
    if kind == "usd":
        return f"${float(v):.4f}"  # type: ignore[arg-type]
    if kind == "int":
        return f"{int(v):,}"  # type: ignore[call-overload]
    return str(v)


def render_compare(df: pl.DataFrame, title: str = "Assay: LLM backends compared",
                   width: int = 120) -> str:
    """The compare table as plain text (a rich table, no colour codes)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    cols = [("campaign", "campaign", "str"), ("llm", "llm", "str"),
            ("tasks_tried", "tried", "int"), ("accepted", "accepted", "int"),
            ("fast_1", "fast_1", "pct"),
            ("geomean_speedup_accepted", "geomean speedup (accepted)", "x"),
            ("tokens", "tokens", "int"), ("cost_usd", "cost", "usd")]
    for _, header, kind in cols:
        table.add_column(header, justify="left" if kind == "str" else "right")
    for row in df.iter_rows(named=True):
        table.add_row(*(_fmt(row.get(key), kind) for key, _, kind in cols))
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False,
            legacy_windows=False).print(table)
    return buf.getvalue()
