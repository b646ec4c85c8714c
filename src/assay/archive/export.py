"""Export a campaign as a dataset: ``archive/level_<n>.parquet`` plus a dataset card.

The columns follow the Sakana AI CUDA Engineer archive's schema (Op_Name ... Clang_Tidy),
followed by Assay's own (Verdict_Reasons ... Cost_USD). One row per verified candidate,
accepted or not; ``Correct`` is the verifier's decision. A task that ended with no candidate
(its file could not be run, the proposer declined it, the budget ran out) has one row of its
own per LLM, without code (:func:`task_rows`).

The files load with polars and with Hugging Face ``datasets``
(``load_dataset("parquet", data_files=...)``, or ``load_dataset("<archive folder>")`` through
the card's front matter, one split per level with rows). The card (``archive/README.md``) states
the schema (polars dtypes and the ``datasets`` features they load as), the verifier's policy,
settings and checks, and the hardware (``device.json``).

No torch and no mlflow on this path: polars only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import yaml
from omegaconf import OmegaConf

from assay.collect import collect, device_info, task_ids, task_info
from assay.layout import Campaign, read_json, write_atomic
from assay.verify.checks import REGISTRY as VERIFIER_CHECKS

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
    "PyTorch_Native_Default_Runtime": pl.Float64(),
}
ARCHIVE_COLUMNS: list[str] = list(ARCHIVE_SCHEMA)


def datasets_type(dtype: pl.DataType) -> str:
    """The ``datasets`` feature a column of this polars dtype loads as (polars writes Arrow's
    large string and large list types): ``large_string``, ``int64``, ``float64``, ``bool`` or
    ``LargeList(<inner>)``."""
    if isinstance(dtype, pl.List):
        return f"LargeList({datasets_type(dtype.inner)})"
    names = {pl.String: "large_string", pl.Int64: "int64", pl.Float64: "float64",
             pl.Boolean: "bool"}
    for cls, name in names.items():
        if dtype == cls:
            return name
    raise ValueError(f"no datasets type for {dtype}")


# column -> the feature type `datasets.load_dataset("parquet", ...)` gives it
DATASETS_TYPES: dict[str, str] = {k: datasets_type(v) for k, v in ARCHIVE_SCHEMA.items()}

_DESCRIPTIONS = {
    "Op_Name": "task name (the KernelBench file stem without its number)",
    "Level_ID": "KernelBench level",
    "Task_ID": "task number within its level",
    "Kernel_Name": "candidate id (content hash of CUDA_Code); null on a task's row without "
                   "a candidate (its reason in Verdict_Reasons and Error)",
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
    "PyTorch_Native_Default_Runtime": "eager PyTorch runtime in ms under PyTorch's default "
                                      "numerics where they differ from the verifier's (cuDNN "
                                      "in TF32; PyTorch_Native_Runtime and CUDA_Runtime are "
                                      "true fp32), else null",
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
        pl.col("baseline_eager_default_ms").alias("PyTorch_Native_Default_Runtime"),
    )
    out = out.cast(ARCHIVE_SCHEMA)  # type: ignore[arg-type]
    assert out.columns == ARCHIVE_COLUMNS
    return out


def task_rows(campaign: Campaign, df: pl.DataFrame) -> pl.DataFrame:
    """One row (archive schema) per (llm, task) that ended with no candidate to verify, so that
    every task the campaign finished has its row: ``Verdict_Reasons`` ``["task_error"]`` (the
    task's record has an error: its file could not be run), ``["declined"]`` (generation 0
    came back with no code: the proposer's reasons) or ``["stopped"]`` (the LLM budget was
    reached first); ``Error`` says which, ``Kernel_Name`` and ``CUDA_Code`` are null. A task
    with candidates still waiting for their verdicts gets no row yet."""
    seen = set(zip(df["llm"].to_list(), df["task"].to_list())) if not df.is_empty() else set()
    rows: list[dict[str, Any]] = []
    for llm in campaign.llms() if campaign.root.is_dir() else []:
        for task in task_ids(campaign):
            if (llm, task) in seen:
                continue
            info = task_info(campaign, task)
            why = _no_candidate(campaign, llm, task, info)
            if why is None:
                continue
            bpath = campaign.baseline(task)
            base = read_json(bpath) if bpath.exists() else {}
            reason, error, tokens, cost = why
            rows.append({
                "Op_Name": info["name"], "Level_ID": info["level"], "Task_ID": info["number"],
                "PyTorch_Native_Runtime": base.get("eager_ms"),
                "PyTorch_Compile_Runtime": base.get("compile_ms"),
                "PyTorch_Code_Module": info.get("source"),
                "PyTorch_Code_Functional": info.get("functional_source"),
                "Correct": False, "Error": error, "Verdict_Reasons": [reason],
                "Parent_IDs": [], "Generation": 0, "LLM": llm, "Tokens": tokens,
                "Cost_USD": cost,
                "PyTorch_Native_Default_Runtime": base.get("eager_default_ms")})
    return pl.DataFrame(rows, schema=ARCHIVE_SCHEMA)


def _no_candidate(campaign: Campaign, llm: str, task: str, info: dict[str, Any]
                  ) -> tuple[str, str, int | None, float | None] | None:
    """(reason, error line, tokens, cost) where the (llm, task) ended with nothing to verify,
    else None (candidates proposed, or generation 0 not written yet). ``info``: task_info's."""
    path = campaign.proposals(llm, task, 0)
    if not path.exists():
        return ("task_error", str(info["error"]), None, None) if info.get("error") else None
    try:
        gen0 = read_json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(gen0, dict) or gen0.get("candidates"):
        return None
    tokens, cost = gen0.get("tokens"), gen0.get("cost_usd")
    if info.get("error"):
        return "task_error", str(info["error"]), tokens, cost
    if gen0.get("stopped"):
        return "stopped", f"stopped before a translation: {gen0.get('budget') or 'budget'}", \
            tokens, cost
    reasons = [str(d.get("reason", "")) for d in gen0.get("declined") or []
               if isinstance(d, dict)]
    return "declined", "declined: " + ("; ".join(r for r in reasons if r) or "no code"), \
        tokens, cost


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


def export(campaign: Campaign, verify_settings: dict[str, Any] | None = None) -> list[Path]:
    """Write ``archive/level_<n>.parquet`` for every level with a task record or a verified
    candidate (a level with no verified candidates gets an empty file with the full schema),
    and ``archive/README.md``, the dataset card. ``verify_settings``: the verifier's config
    to state in the card (else the campaign's ``config.yaml``, else the policy's defaults).
    Returns the parquet paths, sorted by level."""
    df = collect(campaign)
    frame = pl.concat([archive_frame(df), task_rows(campaign, df)])
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
    write_atomic(card, dataset_card(campaign, df, frame, sorted(levels), verify_settings))
    os.chmod(card, 0o644)  # write_atomic's temp file is created 0600
    return paths


def _values(df: pl.DataFrame, col: str) -> str:
    vals = sorted(v for v in df[col].unique().to_list() if v) if not df.is_empty() else []
    return ", ".join(f"`{v}`" for v in vals) or "(none recorded)"


def _check_names(df: pl.DataFrame) -> list[str]:
    names: list[str] = []
    for checks in df["checks"].to_list() if not df.is_empty() else []:
        names += [c for c in checks if c not in names]
    return names


POLICIES = {
    "strict": "only the candidate's own kernels count: any ATen compute op or library kernel "
              "(cuBLAS, cuDNN, ATen's) in the timed calls rejects it",
    "permissive": "library calls are allowed and their share of the time is reported "
                  "(`library_time_frac`), up to `max_library_time_frac`",
}


def check_description(name: str) -> str:
    """What a failed check rejects, from the verifier's registry (the README's table); a name
    no longer registered (an older campaign's verdict) says so."""
    check = VERIFIER_CHECKS.get(name)
    if check is None:
        return "(not a check of this verifier version: see the verdict detail)"
    return check.rejects


def _verify_settings(campaign: Campaign, policy: str | None,
                     given: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
    """The verifier's settings and where they come from."""
    if given:
        return dict(given), "the export step's config"
    path = campaign.root / "config.yaml"
    if path.exists():
        try:
            cfg = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            cfg = {}
        if isinstance(cfg, dict) and isinstance(cfg.get("verify"), dict):
            return cfg["verify"], f"the campaign's `{path.name}`"
    if policy:
        from assay.app import ConfigError, compose

        try:  # composed, so the policy's file gets what it inherits and the schema's defaults
            d = OmegaConf.to_container(compose([f"verify={policy}"]).verify, resolve=True,
                                       enum_to_str=True)
        except ConfigError:
            d = None
        if isinstance(d, dict):
            return d, (f"`config/verify/{policy}.yaml`, the policy's defaults; the "
                       "campaign's own overrides are not recorded in its folder")
    return {}, ""


def _fmt_setting(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt_setting(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_fmt_setting(x) for x in v) + "]"
    return str(v)


def _hardware(campaign: Campaign, df: pl.DataFrame) -> list[str]:
    dev = device_info(campaign)
    targets = _values(df, "target")
    lines = []
    if dev:
        lines.append(f"- Device: **{dev.get('name') or 'unknown'}** (`device.json`), target "
                     f"{targets}")
        bw, tf = dev.get("bandwidth_gbs"), dev.get("flops_tflops")
        lines.append(f"- Measured memory bandwidth: "
                     f"{f'{bw:.4g} GB/s' if bw is not None else 'unknown'}; measured fp32 "
                     f"peak: {f'{tf:.4g} TFLOP/s' if tf is not None else 'unknown'} (the "
                     "roofline check's ceilings, measured once per device)")
        if isinstance(dev.get("measured_with"), dict):
            lines.append(f"- Measured with: {_fmt_setting(dev['measured_with'])}")
    else:
        lines.append(f"- Device: {_values(df, 'device')} (no `device.json`), target {targets}")
    lines.append(f"- Device names in the verdicts: {_values(df, 'device')}")
    return lines


def _front_matter(campaign: Campaign, frame: pl.DataFrame, levels: list[int]) -> list[str]:
    """The Hugging Face card header: one split per level that has rows (``datasets`` refuses
    empty splits), so ``load_dataset("<archive folder>")`` loads them all."""
    full = [lv for lv in levels if frame.filter(pl.col("Level_ID") == lv).height]
    lines = ["---", f"pretty_name: {json.dumps(f'Assay kernel archive: {campaign.name}')}",
             "tags:", "- code", "- cuda", "- kernels", "- kernelbench", "- verified"]
    if full:
        lines += ["configs:", "- config_name: default", "  data_files:"]
        for lv in full:
            lines += [f"  - split: level_{lv}", f"    path: level_{lv}.parquet"]
    lines += ["---", ""]
    return lines


def dataset_card(campaign: Campaign, df: pl.DataFrame, frame: pl.DataFrame,
                 levels: list[int], verify_settings: dict[str, Any] | None = None) -> str:
    policies = sorted(v for v in df["policy"].unique().to_list() if v) if df.height else []
    settings, source = _verify_settings(campaign, policies[0] if len(policies) == 1 else None,
                                        verify_settings)
    full = [lv for lv in levels if frame.filter(pl.col("Level_ID") == lv).height]
    empty = [lv for lv in levels if lv not in full]
    lines = _front_matter(campaign, frame, levels) + [
        f"# Assay kernel archive: `{campaign.name}`",
        "",
        "Kernels proposed by LLMs (and Assay's offline synthesizer) for KernelBench-format "
        "PyTorch tasks, evolved over generations and judged by Assay's verifier. "
        "Every verified candidate is a row, accepted or not.",
        "",
        f"- Verifier policy: {_values(df, 'policy')}",
        f"- Device: {_values(df, 'device')}",
        f"- Proposers (LLM column): {_values(df, 'llm')}",
        f"- Rows: {frame.height}, of which `Correct`: {int(frame['Correct'].sum())}",
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
        "## Loading",
        "",
        "```python",
        "import polars as pl",
        "df = pl.read_parquet(\"level_1.parquet\")  # or pl.read_parquet(\"level_*.parquet\")",
        "",
        "from datasets import load_dataset",
        "ds = load_dataset(\"parquet\", data_files={\"level_1\": \"level_1.parquet\"})",
        "ds = load_dataset(\"path/to/archive\")  # every level with rows, split level_<n>",
        "```",
        "",
    ]
    if empty:
        names = ", ".join(f"`level_{lv}.parquet`" for lv in empty)
        lines += [f"{names}: no verified candidate at that level yet; the file has the full "
                  "schema and no rows, and is left out of the splits above (`datasets` "
                  "refuses an empty split).", ""]
    lines += [
        "## What `Correct` means",
        "",
        "`Correct` is true only when the verifier accepted the candidate: it ran its checks and "
        "every one passed. A rejected candidate lists the checks it failed in "
        "`Verdict_Reasons` (and its error, or those names, in `Error`). Speedups of rejected "
        "candidates, where present, are not results: only `Correct` rows count.",
        "",
        "## The verifier",
        "",
        "Each candidate runs in its own process (own session and scratch folder, resource "
        "limits, no network where the machine allows it, a time limit), on inputs and weights "
        "drawn from secret seeds, and never shares a process with the reference, the expected "
        "outputs or the baseline timings. Eager and torch.compile baselines are timed by the "
        "same code in a process that never loads a candidate: device-wide sync, cache flushed "
        "before each call, inputs rotated among buffers, warm-up by time, median.",
        "",
    ]
    for pol in policies:
        lines.append(f"- Policy `{pol}`: {POLICIES.get(pol, 'see the verifier settings')}.")
    if policies:
        lines.append("")
    if settings:
        lines += [f"Settings, from {source}:", ""]
        for key, value in settings.items():
            lines.append(f"- `{key}`: {_fmt_setting(value)}")
        lines.append("")
    checks = _check_names(df)
    lines += ["Checks run in this campaign's verdicts (a failed check's name is the rejection "
              "reason):", "", "| check | rejects |", "|---|---|"]
    for name in checks:
        lines.append(f"| `{name}` | {check_description(name)} |")
    if not checks:
        lines.append("| (none recorded) | |")
    lines += ["", "## Hardware", ""] + _hardware(campaign, df) + [
        "",
        "## Schema",
        "",
        "The first 18 columns follow the Sakana AI CUDA Engineer archive; the rest are Assay's. "
        "Types: the polars dtype, and the `datasets` feature the column loads as (polars "
        "writes Arrow's large string and large list types).",
        "",
        "| column | polars | datasets | description |",
        "|---|---|---|---|",
    ]
    for name, dtype in ARCHIVE_SCHEMA.items():
        lines.append(f"| `{name}` | `{dtype}` | `{DATASETS_TYPES[name]}` | "
                     f"{_DESCRIPTIONS[name]} |")
    lines.append("")
    return "\n".join(lines)


def schema_from_card(text: str) -> dict[str, tuple[str, str]]:
    """``{column: (polars dtype, datasets type)}`` as the card's schema table states them."""
    out = {}
    rows = re.findall(r"^\| `([A-Za-z_]+)` \| `([^`]+)` \| `([^`]+)` \|", text, flags=re.M)
    for name, pl_type, ds_type in rows:
        out[name] = (pl_type, ds_type)
    return out


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
