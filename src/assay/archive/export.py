"""Export a campaign as a dataset: ``archive/level_<n>.parquet`` plus a dataset card.

The columns follow the Sakana AI CUDA Engineer archive's schema (Op_Name ... Clang_Tidy),
followed by Assay's own (Verdict_Reasons ... Cost_USD). One row per verified candidate,
accepted or not; ``Correct`` is the strict verifier's decision.

No torch and no mlflow on this path: polars only.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from assay.collect import collect, task_ids, task_info
from assay.layout import Campaign, write_atomic

ARCHIVE_SCHEMA: dict[str, pl.DataType] = {
    # Sakana AI CUDA Engineer archive
    "Op_Name": pl.String(),
    "Level_ID": pl.Int64(),
    "Task_ID": pl.Int64(),
    "Kernel_Name": pl.String(),
    "CUDA_Runtime": pl.Float64(),
    "PyTorch_Native_Runtime": pl.Float64(),
    "PyTorch_Compile_Runtime": pl.Float64(),
    "CUDA_Speedup_Native": pl.Float64(),
    "CUDA_Speedup_Compile": pl.Float64(),
    "CUDA_Code": pl.String(),
    "PyTorch_Code_Module": pl.String(),
    "PyTorch_Code_Functional": pl.String(),
    "Correct": pl.Boolean(),
    "Max_Diff": pl.Float64(),
    "Error": pl.String(),
    "NCU_Profile": pl.String(),
    "Torch_Profile": pl.String(),
    "Clang_Tidy": pl.String(),
    # Assay's own
    "Verdict_Reasons": pl.List(pl.String()),
    "Candidate_ID": pl.String(),
    "Parent_IDs": pl.List(pl.String()),
    "Generation": pl.Int64(),
    "LLM": pl.String(),
    "Tokens": pl.Int64(),
    "Cost_USD": pl.Float64(),
}
ARCHIVE_COLUMNS: list[str] = list(ARCHIVE_SCHEMA)

_DESCRIPTIONS = {
    "Op_Name": "task name (the KernelBench file stem without its number)",
    "Level_ID": "KernelBench level",
    "Task_ID": "task number within its level",
    "Kernel_Name": "candidate id (content hash of CUDA_Code)",
    "CUDA_Runtime": "candidate runtime in ms (null if it was not timed)",
    "PyTorch_Native_Runtime": "eager PyTorch runtime of the task in ms",
    "PyTorch_Compile_Runtime": "torch.compile runtime of the task in ms (null if unavailable)",
    "CUDA_Speedup_Native": "PyTorch_Native_Runtime / CUDA_Runtime",
    "CUDA_Speedup_Compile": "PyTorch_Compile_Runtime / CUDA_Runtime",
    "CUDA_Code": "candidate source (a KernelBench ModelNew file)",
    "PyTorch_Code_Module": "task source (KernelBench Model file)",
    "PyTorch_Code_Functional": "functional form of the task (null if not derived)",
    "Correct": "the verifier accepted the candidate (every check passed)",
    "Max_Diff": "largest absolute difference from the reference output",
    "Error": "verifier error, else the failed checks joined by '; ', else empty",
    "NCU_Profile": "Nsight Compute report (profiled kernel only, else null)",
    "Torch_Profile": "torch.profiler table (profiled kernel only, else null)",
    "Clang_Tidy": "clang-tidy output (profiled kernel only, else null)",
    "Verdict_Reasons": "names of the failed verifier checks (empty when Correct)",
    "Candidate_ID": "candidate id (same as Kernel_Name)",
    "Parent_IDs": "ids of the candidates this one was derived from",
    "Generation": "evolution generation (0: translation)",
    "LLM": "proposer backend that wrote the candidate",
    "Tokens": "LLM tokens spent on the proposal (in + out)",
    "Cost_USD": "LLM cost of the proposal in US dollars",
}


def archive_frame(df: pl.DataFrame) -> pl.DataFrame:
    """Map a ``collect()`` table onto the archive schema (columns in ARCHIVE_COLUMNS order)."""
    error = (pl.when(pl.col("error") != "").then(pl.col("error"))
               .otherwise(pl.col("reasons").list.join("; ")))
    out = df.select(
        pl.col("name").alias("Op_Name"),
        pl.col("level").alias("Level_ID"),
        pl.col("number").alias("Task_ID"),
        pl.col("candidate").alias("Kernel_Name"),
        pl.col("runtime_ms").alias("CUDA_Runtime"),
        pl.col("baseline_eager_ms").alias("PyTorch_Native_Runtime"),
        pl.col("baseline_compile_ms").alias("PyTorch_Compile_Runtime"),
        pl.col("speedup_eager").alias("CUDA_Speedup_Native"),
        pl.col("speedup_compile").alias("CUDA_Speedup_Compile"),
        pl.col("code").alias("CUDA_Code"),
        pl.col("task_source").alias("PyTorch_Code_Module"),
        pl.col("functional_source").alias("PyTorch_Code_Functional"),
        pl.col("accepted").alias("Correct"),
        pl.col("max_abs_err").alias("Max_Diff"),
        error.fill_null("").alias("Error"),
        pl.col("ncu_profile").alias("NCU_Profile"),
        pl.col("torch_profile").alias("Torch_Profile"),
        pl.col("clang_tidy").alias("Clang_Tidy"),
        pl.col("reasons").alias("Verdict_Reasons"),
        pl.col("candidate").alias("Candidate_ID"),
        pl.col("parents").alias("Parent_IDs"),
        pl.col("generation").alias("Generation"),
        pl.col("llm").alias("LLM"),
        pl.col("tokens").alias("Tokens"),
        pl.col("cost_usd").alias("Cost_USD"),
    )
    out = out.cast(ARCHIVE_SCHEMA)  # type: ignore[arg-type]
    assert out.columns == ARCHIVE_COLUMNS
    return out


def _write_parquet_atomic(frame: pl.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        frame.write_parquet(tmp, compression="zstd", statistics=True)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the dataset is meant to be shared
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export(campaign: Campaign) -> list[Path]:
    """Write ``archive/level_<n>.parquet`` for every level with a task record or a verified
    candidate (a level with no verified candidates gets an empty file with the full schema),
    and ``archive/README.md``. Returns the parquet paths, sorted by level."""
    df = collect(campaign)
    frame = archive_frame(df)
    levels = {task_info(campaign, t)["level"] for t in task_ids(campaign)}
    levels |= set(frame["Level_ID"].unique().to_list())
    out_dir = campaign.archive_dir()
    paths = []
    for level in sorted(levels):
        part = (frame.filter(pl.col("Level_ID") == level)
                     .sort(["Task_ID", "Op_Name", "LLM", "Generation", "Candidate_ID"]))
        path = out_dir / f"level_{level}.parquet"
        _write_parquet_atomic(part, path)
        paths.append(path)
    card = out_dir / "README.md"
    write_atomic(card, dataset_card(campaign, df, frame, sorted(levels)))
    os.chmod(card, 0o644)  # write_atomic's temp file is created 0600
    return paths


def _values(df: pl.DataFrame, col: str) -> str:
    vals = sorted(v for v in df[col].unique().to_list() if v) if not df.is_empty() else []
    return ", ".join(f"`{v}`" for v in vals) or "(none recorded)"


def _checks(df: pl.DataFrame) -> str:
    names: list[str] = []
    for checks in df["checks"].to_list() if not df.is_empty() else []:
        names += [c for c in checks if c not in names]
    return ", ".join(f"`{c}`" for c in names) or "(none recorded)"


def dataset_card(campaign: Campaign, df: pl.DataFrame, frame: pl.DataFrame,
                 levels: list[int]) -> str:
    lines = [
        f"# Assay kernel archive: `{campaign.name}`",
        "",
        "Kernels proposed by LLMs (and Assay's offline synthesizer) for KernelBench-format "
        "PyTorch tasks, evolved over generations and judged by Assay's strict verifier. "
        "Every verified candidate is a row, accepted or not.",
        "",
        f"- Verifier policy: {_values(df, 'policy')}",
        f"- Device: {_values(df, 'device')}",
        f"- Proposers (LLM column): {_values(df, 'llm')}",
        "",
        "## Files",
        "",
        "| file | rows | correct | tasks |",
        "|---|---:|---:|---:|",
    ]
    for level in levels:
        part = frame.filter(pl.col("Level_ID") == level)
        n_tasks = part.select(pl.col("Op_Name").n_unique()).item() if part.height else 0
        lines.append(f"| `level_{level}.parquet` | {part.height} | "
                     f"{int(part['Correct'].sum())} | {n_tasks} |")
    lines += [
        "",
        "## What `Correct` means",
        "",
        "`Correct` is true only when the verifier accepted the candidate: it ran its checks and "
        "every one passed. A rejected candidate lists the checks it failed in "
        "`Verdict_Reasons` (and its error, or those names, in `Error`). Speedups of rejected "
        "candidates, where present, are not results: only `Correct` rows count.",
        "",
        f"Checks seen in this campaign's verdicts: {_checks(df)}.",
        "",
        "## Schema",
        "",
        "The first 18 columns follow the Sakana AI CUDA Engineer archive; the rest are Assay's.",
        "",
        "| column | type | description |",
        "|---|---|---|",
    ]
    for name, dtype in ARCHIVE_SCHEMA.items():
        lines.append(f"| `{name}` | `{dtype}` | {_DESCRIPTIONS[name]} |")
    lines += ["", "Read with `polars.read_parquet(\"level_1.parquet\")` (or pandas / datasets).",
              ""]
    return "\n".join(lines)


def export_campaign(results_dir: str | Path, campaign_name: str) -> list[Path]:
    """Hydra-free entry point: export ``<results_dir>/<campaign_name>``."""
    return export(Campaign.at(results_dir, campaign_name))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Export a campaign's archive (parquet per level).")
    ap.add_argument("results_dir")
    ap.add_argument("campaign")
    args = ap.parse_args(argv)
    for p in export_campaign(args.results_dir, args.campaign):
        print(p)


if __name__ == "__main__":
    main()
