"""Our eager and torch.compile timings of KernelBench's tasks against KernelBench's published
ones (issue 16: "our eager and torch.compile baselines within 10% of KernelBench's published
H100 times for at least 90% of the tasks; explain the rest"). No device: it reads what the GPU
runs wrote.

    python benchmarks/kb_baselines.py --timing KB/timing/H100_Modal \\
        [--rows selfcheck.jsonl ...] [--gpu-of FILE=GPU ...] [--campaign results/kb ...] \\
        [--cache BASELINE_CACHE ...] [--out DIR]

``--rows``: JSONL rows of ``benchmarks/kb_selfcheck.py`` (the reference verified as its own
candidate: its ``runtime_ms`` is the verifier's eager timing of the task, flushed L2, fp32 without
TF32; where a row has ``eager_default_ms``, eager under PyTorch's default numerics, cuDNN in TF32
as KernelBench timed it, that is compared instead), later files' rows win per task; a row's GPU
is its ``gpu`` field, else the one ``--gpu-of`` names for its file. ``--campaign``: a campaign
folder of the DAG with ``tasks=kernelbench`` (``results/<campaign>``): its baseline step's
``baselines/<task>.json`` give eager and torch.compile (``eager_default_ms`` and
``compile_default_ms`` where set, as above), the GPU each names (``device_name``; a file
written before baselines named theirs: the campaign's ``device.json``, see
``benchmarks/dag_state_gpus.py``); a campaign's rows win over the self-check's.
``--cache``: baseline caches (``$ASSAY_BASELINE_CACHE``; the GPU state's ``baseline-cache/``):
the baselines the verify step timed again where the campaign's were another GPU's, each on its
own GPU (those naming it, ``device_name``). A task is compared once per GPU it was timed on.
``--timing``: KernelBench's folder of published times (``baseline_time_torch.json`` and
``baseline_time_torch_compile_inductor_default.json``: level -> task file -> mean ms, the
hardware named per entry); a task is matched by its level and number.

Prints, per timing (eager, torch.compile) and GPU model, how many tasks are within 10% of the
published time, the median ratio, and the tasks outside grouped by what they compute
(convolutions: KernelBench's eager ran cuDNN with PyTorch's default TF32 for convolutions, the
verifier in true fp32), with ``--out`` a Markdown table of every task.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

WITHIN = 0.10


def read_rows(files: list[str], gpu_of: dict[str, str]) -> dict[str, dict]:
    """The latest row per task over ``files`` (in order), each with ``_gpu``."""
    rows: dict[str, dict] = {}
    for f in files:
        for n, line in enumerate(Path(f).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"error: {f}:{n}: not a JSON row ({e.msg})")
            if "task" not in r:
                continue
            r["_gpu"] = r.get("gpu") or gpu_of.get(f) or "unknown GPU"
            rows[r["task"]] = r
    return rows


def kind(task: str) -> str:
    """What a task computes, for grouping the misses (from KernelBench's file names)."""
    t = task.lower()
    if "conv" in t or any(k in t for k in CNNS):
        return "convolution"
    if task.startswith("L3_") and any(k in t for k in MODEL_BLOCKS):
        return "model block (level 3)"  # (level 1's MinGPTNewGelu is an elementwise GELU)
    if any(k in t for k in ("matmul", "matrix", "gemm", "linear", "mlp", "bmm", "einsum",
                            "attention")):
        return "matrix product"
    return "memory-bound"


MODEL_BLOCKS = ("lstm", "gru", "rnn", "mamba", "swin", "vit", "transformer", "attention", "gpt")
# level 3's convolutional networks, whose names do not say "conv"
CNNS = ("resnet", "resnext", "vgg", "densenet", "efficientnet", "mobilenet", "googlenet",
        "inception", "squeezenet", "shufflenet", "regnet", "alexnet", "lenet", "unet", "convnext")


PUBLISHED = {"eager": "baseline_time_torch.json",
             "torch.compile": "baseline_time_torch_compile_inductor_default.json"}


def read_campaigns(folders: list[str]) -> dict[tuple[str, str], dict]:
    """{(task, GPU): {"eager": (ms, numerics), "torch.compile": (ms, numerics), "_gpu"}} from
    the campaigns' baseline files (later folders win)."""
    out: dict[tuple[str, str], dict] = {}
    for folder in map(Path, folders):
        device = folder / "device.json"
        if not (folder / "baselines").is_dir():
            sys.exit(f"error: {folder}: no baselines/ folder (a campaign's results folder?)")
        try:
            gpu = json.loads(device.read_text()).get("name") or "unknown GPU"
        except (OSError, ValueError):
            gpu = "unknown GPU"
        for f in sorted((folder / "baselines").glob("*.json")):
            try:
                b = json.loads(f.read_text())
            except ValueError as e:
                sys.exit(f"error: {f}: not JSON ({e.msg})")
            entry = _entry(b, b.get("device_name") or gpu)  # (a campaign resumed on another
            # GPU: its later baselines were timed there)
            out[(f.stem, entry["_gpu"])] = entry
    return out


def _entry(b: dict, gpu: str) -> dict:
    entry: dict = {"_gpu": gpu}
    for which, fp32, default in (("eager", "eager_ms", "eager_default_ms"),
                                 ("torch.compile", "compile_ms", "compile_default_ms")):
        if (t := timed(b, fp32, default)) is not None:
            entry[which] = t
    return entry


# A timed baseline in the baseline cache: <task>-<its key>.json (records and shapes have
# another word before the key)
CACHED = re.compile(r"^(L\d+_\d+_.*?)(?<!-record)(?<!-shapes)-([0-9a-f]{20})\.json$")


def read_cache(folders: list[str]) -> dict[tuple[str, str], dict]:
    """:func:`read_campaigns`' form from baseline caches (``$ASSAY_BASELINE_CACHE``, the GPU
    state's ``baseline-cache/``): the baselines the verify step timed again on its own GPU,
    where the campaign's were another's. Only those that name their GPU (``device_name``:
    written since 2026-12-07) are read."""
    out: dict[tuple[str, str], dict] = {}
    for folder in map(Path, folders):
        if not folder.is_dir():
            sys.exit(f"error: {folder}: not a folder (a baseline cache?)")
        for f in sorted(folder.glob("*.json")):
            m = CACHED.match(f.name)
            if not m:
                continue
            try:
                b = json.loads(f.read_text())
            except ValueError as e:
                sys.exit(f"error: {f}: not JSON ({e.msg})")
            if isinstance(b, dict) and b.get("device_name") and b.get("eager_ms"):
                out[(m.group(1), b["device_name"])] = _entry(b, b["device_name"])
    return out


def timed(b: dict, fp32: str, default: str) -> tuple[float, str] | None:
    """(ms, numerics) of a baseline: under PyTorch's default numerics where it was timed so
    (cuDNN tasks, as KernelBench timed them), else the verifier's true fp32; None if neither."""
    if b.get(default):
        return float(b[default]), "default (cuDNN TF32)"
    return (float(b[fp32]), "fp32") if b.get(fp32) else None


def from_rows(rows: dict[str, dict]) -> dict[tuple[str, str], dict]:
    """The self-check's accepted rows in :func:`read_campaigns`' form (eager only)."""
    return {(task, r["_gpu"]): {"_gpu": r["_gpu"],
                                "eager": timed(r, "runtime_ms", "eager_default_ms")}
            for task, r in rows.items() if r.get("accepted") and r.get("runtime_ms")}


def published_time(published: dict, task: str) -> dict | None:
    """KernelBench's entry of the task ``L<level>_<number>_...`` (its file ``<number>_*.py``)."""
    m = re.match(r"L(\d+)_(\d+)_", task)
    if not m:
        return None
    for name, ref in (published.get(f"level{m.group(1)}") or {}).items():
        if name.split("_", 1)[0] == m.group(2) and ref and ref.get("mean"):
            return ref
    return None


def compare(ours: dict[tuple[str, str], dict], published: dict[str, dict],
            which: str = "eager") -> list[dict]:
    out = []
    for (task, _gpu), r in sorted(ours.items()):
        ref = published_time(published, task)
        if which not in r or ref is None:
            continue
        ms, numerics = r[which]
        out.append({"task": task, "gpu": r["_gpu"], "ours_ms": ms, "numerics": numerics,
                    "published_ms": float(ref["mean"]), "published_on": ref.get("hardware", ""),
                    "ratio": ms / float(ref["mean"]), "kind": kind(task), "which": which})
    return out


def summary(rows: list[dict]) -> list[str]:
    lines = []
    for which, gpu in sorted({(r["which"], r["gpu"]) for r in rows}, key=lambda k: (
            list(PUBLISHED).index(k[0]), k[1])):
        mine = [r for r in rows if r["gpu"] == gpu and r["which"] == which]
        within = [r for r in mine if abs(r["ratio"] - 1) <= WITHIN]
        lines.append(f"{gpu}: {len(within)} of {len(mine)} tasks within {WITHIN:.0%} of the "
                     f"published {which} time ({len(within) / len(mine):.0%}); median ratio "
                     f"ours/published {statistics.median(r['ratio'] for r in mine):.3f}")
        for k in sorted({r["kind"] for r in mine}):
            ks = [r for r in mine if r["kind"] == k]
            slow = sum(r["ratio"] > 1 + WITHIN for r in ks)
            fast = sum(r["ratio"] < 1 - WITHIN for r in ks)
            median = statistics.median(r["ratio"] for r in ks)
            lines.append(f"  {k}: {len(ks)} tasks, median {median:.3f}, {slow} slower and "
                         f"{fast} faster than the published time by over {WITHIN:.0%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--timing", required=True, help="KernelBench's timing/H100_Modal folder")
    a.add_argument("--rows", nargs="*", default=[], help="kb_selfcheck.py JSONL files")
    a.add_argument("--gpu-of", nargs="*", default=[], metavar="FILE=GPU",
                   help="the GPU of a file whose rows do not name one")
    a.add_argument("--campaign", nargs="*", default=[], metavar="DIR",
                   help="campaign folders (results/<campaign>) of tasks=kernelbench")
    a.add_argument("--cache", nargs="*", default=[], metavar="DIR",
                   help="baseline caches: the verify step's baselines of its own GPU")
    a.add_argument("--out", help="a folder for baselines.md (every task)")
    args = a.parse_args(argv)
    if not args.rows and not args.campaign and not args.cache:
        a.error("give --rows, --campaign, --cache or several")
    eager = Path(args.timing) / PUBLISHED["eager"]
    if not eager.is_file():
        print(f"error: {eager}: not found (KernelBench's timing folder?)", file=sys.stderr)
        return 2
    gpu_of = dict(x.split("=", 1) for x in args.gpu_of)
    ours = from_rows(read_rows(args.rows, gpu_of)) if args.rows else {}
    ours.update(read_campaigns(args.campaign))
    ours.update(read_cache(args.cache))
    rows = []
    for which, name in PUBLISHED.items():
        path = Path(args.timing) / name
        if path.is_file():  # (torch.compile's may be missing from a copy)
            rows += compare(ours, json.loads(path.read_text()), which)
    if not rows:
        print("error: no task matched a published time", file=sys.stderr)
        return 2
    text = summary(rows)
    print("\n".join(text))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table = ["| task | timing | GPU | ours ms | our numerics | published ms (H100) | ratio "
                 "| kind |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        table += [f"| {r['task']} | {r['which']} | {r['gpu']} | {r['ours_ms']:.4g} | "
                  f"{r['numerics']} | {r['published_ms']:.4g} | {r['ratio']:.3f} | {r['kind']} |"
                  for r in sorted(rows, key=lambda r: (r["which"], r["gpu"],
                                                       -abs(r["ratio"] - 1)))]
        (out / "baselines.md").write_text("\n".join(["# Baselines: ours against KernelBench's "
                                                     "published times", ""] + text + [""]
                                                    + table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
