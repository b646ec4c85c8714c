"""Copies of a KernelBench-format folder at other sizes, for the synthesizer's coverage there.

    python benchmarks/other_sizes.py --source ../shared/kernelbench --out /tmp/kb_other
    PYTHONPATH=src python benchmarks/synth_suite.py --source /tmp/kb_other --plans-only \\
        --device cuda --out /tmp/plans_other
    python benchmarks/other_sizes.py --compare /tmp/plans/plans.json /tmp/plans_other/plans.json

The same task code at other sizes is a check the synthesizer must pass (a plan that depends on
a size coincidence, or a size tuned into a template, fails it). Each task file's module-level
sizes (``name = <int>`` at the top level) that are not structural (kernel sizes, strides,
paddings, dilations, groups, heads, layers, classes, windows, patches, image sizes: changing
those changes what the task is, or breaks its own arithmetic) are moved off their values:
``v -> v - 1`` for even ``v >= 4``, ``v -> v + 2`` for odd ``v >= 5`` (so a power of two becomes
odd, and no size stays a multiple of what it was). Smaller values are kept. Where the task's
own reference cannot run at those sizes (a LayerNorm's shape given apart from its input's, a
join of feature maps that odd sizes misalign: run on the meta device, no memory), the batch
size alone is moved; where even that breaks it, the file is copied unchanged and listed.

``--compare`` reads two ``plans.json`` (``synth_suite.py --plans-only``) and lists the tasks
planned in the first and not in the second, with the second's reason (exit status 1 if any).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import sys
from pathlib import Path

# Names of sizes that define what a task computes, or that its own arithmetic constrains.
STRUCTURAL = re.compile(r"kernel|stride|pad|dilation|group|head|layer|class|window|patch|"
                        r"image|img|depth|ghost|cluster|ratio|scale|expansion|stage|block",
                        re.IGNORECASE)


def other_value(v: int) -> int:
    """``v`` moved off its value (see the module's doc)."""
    if v >= 4 and v % 2 == 0:
        return v - 1
    if v >= 5:
        return v + 2
    return v


def resized(source: str, names: re.Pattern | None = None) -> tuple[str, dict[str, tuple[int, int]]]:
    """``source`` with its module-level int sizes moved (those ``names`` matches, else every
    non-structural one); what changed."""
    lines = source.splitlines(keepends=True)
    changed: dict[str, tuple[int, int]] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
                and type(node.value.value) is int and node.lineno == node.end_lineno):
            continue
        name, value = node.targets[0].id, node.value.value
        new = other_value(value)
        wanted = names.search(name) if names else not STRUCTURAL.search(name)
        if not wanted or new == value:
            continue
        line = lines[node.lineno - 1]
        col, end = node.value.col_offset, node.value.end_col_offset
        lines[node.lineno - 1] = line[:col] + str(new) + line[end:]
        changed[name] = (value, new)
    return "".join(lines), changed


def runs(source: str, name: str) -> bool:
    """Whether the task ``source`` builds its model and runs its forward on the meta device
    (loaded as every task file is: :meth:`assay.tasks.model.Task.module`)."""
    import torch

    from assay.tasks.model import Task, source_hash

    task = Task(name, 0, 0, name, Path(name), source, source_hash(source))
    try:
        mod = task.module()
        with torch.device("meta"):
            mod.Model(*mod.get_init_inputs())(*mod.get_inputs())
    except Exception:  # noqa: BLE001 - any failure: the task does not run at these sizes
        return False
    return True


def write_copies(source: Path, out: Path) -> dict[str, list[str]]:
    """Every ``level*/*.py`` of ``source`` into ``out`` at other sizes: the file names by what
    moved (``all``, ``batch`` only, ``none``: the reference runs at no other sizes tried,
    ``unjudged``: not even at its own on the meta device, moved anyway)."""
    kinds: dict[str, list[str]] = {"all": [], "batch": [], "none": [], "unjudged": []}
    paths = sorted(source.glob("level*/*.py"))
    for i, path in enumerate(paths, 1):
        dest = out / path.parent.name / path.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text()
        rel = f"{path.parent.name}/{path.name}"
        moved, changed = resized(text)
        batch, _ = resized(text, re.compile(r"^batch", re.IGNORECASE))
        if not changed:
            kind, written = "none", text
        elif runs(moved, rel):
            kind, written = "all", moved
        elif not runs(text, rel):
            kind, written = "unjudged", moved
        elif batch != text and runs(batch, rel):
            kind, written = "batch", batch
        else:
            kind, written = "none", text
        kinds[kind].append(rel)
        dest.write_text(written)
        print(f"[{i}/{len(paths)}] {rel}: {kind}", flush=True)
    for extra in ("LICENSE", "README.md"):
        if (source / extra).is_file():
            shutil.copy2(source / extra, out / extra)
    return kinds


def plans(path: Path) -> tuple[set[str], dict[str, str]]:
    """The tasks a ``plans.json`` (``synth_suite.py --plans-only``) plans, and the declined ones
    with their reasons."""
    try:
        rows = json.loads(path.read_text())["tasks"]
        planned = {r["task"] for r in rows if r["declined"] is None}
        return planned, {r["task"]: r["declined"] for r in rows if r["declined"] is not None}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: {path}: not a plans.json of synth_suite.py --plans-only "
                 f"({type(e).__name__}: {e})")


def compare(first: Path, second: Path) -> int:
    a, _ = plans(first)
    b, why = plans(second)
    lost = sorted(a - b)
    print(f"planned at the first sizes: {len(a)}; at the other sizes: {len(b & a)} of them")
    print(f"planned at the first sizes only: {len(lost)}")
    for task in lost:
        print(f"  {task}: {why.get(task, '(no reason listed)')}")
    return 1 if lost else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, help="a KernelBench-format folder (level*/)")
    ap.add_argument("--out", type=Path, help="where the copies go (level*/)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("FIRST", "SECOND"),
                    help="two plans.json: the tasks the first plans and the second does not")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not (args.source and args.out):
        ap.error("--source and --out, or --compare")
    if not any(args.source.glob("level*/*.py")):
        print(f"{args.source}: no level*/*.py task files", file=sys.stderr)
        return 2
    kinds = write_copies(args.source, args.out)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {len(v)}" for k, v in kinds.items()))
    for kind in ("none", "unjudged"):
        if kinds[kind]:
            print(f"{kind}: {', '.join(kinds[kind])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
