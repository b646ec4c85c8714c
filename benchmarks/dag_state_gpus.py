"""Name the GPU of each baseline in a GPU DAG state (``gpu_phases.sh``'s ``state.tgz``) whose
baselines predate the field (``device_name``, written by the baseline step since 2026-12-07),
from the day each was written: the sessions' evidence says which GPU each session had. The
verify step times a baseline again where it names another GPU than its own, or none; a state
whose baselines say where they were timed is spared that for the baselines of the GPU it runs
on. Modification times are kept, so no verdict judged against a baseline turns stale.

    python3 benchmarks/dag_state_gpus.py IN.tgz OUT.tgz --before "2026-12-07=NVIDIA H200" \\
        --since "NVIDIA H100 80GB HBM3"

``--before DAY=GPU`` (repeatable, any order): a baseline written before DAY (UTC) and on or
after the previous DAY was timed on GPU; ``--since GPU``: those written on or after the last
DAY. Baselines that name their GPU already, or were not timed (a skipped task), are left as
they are; so is every other file.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from datetime import datetime, timezone
from pathlib import Path


def gpu_of(mtime: float, before: list[tuple[float, str]], since: str | None) -> str | None:
    """The GPU of a file written at ``mtime`` (seconds since the epoch): the first of
    ``before`` (sorted by day) whose day is after it, else ``since``."""
    for day, gpu in before:
        if mtime < day:
            return gpu
    return since


def is_baseline(name: str) -> bool:
    parts = Path(name).parts
    return len(parts) >= 2 and parts[-2] == "baselines" and name.endswith(".json")


def name_gpus(src: Path, dst: Path, before: list[tuple[float, str]], since: str | None) -> int:
    """Copy the state ``src`` to ``dst`` with its baselines' GPUs named; returns how many."""
    named = 0
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for member in tin:
            data = tin.extractfile(member).read() if member.isfile() else None
            if data is not None and is_baseline(member.name):
                try:
                    doc = json.loads(data)
                except ValueError:
                    doc = None
                gpu = gpu_of(member.mtime, before, since)
                if isinstance(doc, dict) and "device_name" not in doc and gpu \
                        and doc.get("device") == "cuda" and doc.get("eager_ms") is not None:
                    data = (json.dumps({**doc, "device_name": gpu}, indent=2) + "\n").encode()
                    member.size = len(data)  # (the member keeps its mtime)
                    named += 1
            tout.addfile(member, io.BytesIO(data) if data is not None else None)
    return named


def day_gpu(text: str) -> tuple[float, str]:
    day, _, gpu = text.partition("=")
    try:
        when = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()
        if not gpu.strip():
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not DAY=GPU (e.g. 2026-12-07=NVIDIA H200)") from None
    return when, gpu.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="a state.tgz")
    ap.add_argument("dst", type=Path, help="the copy to write")
    ap.add_argument("--before", type=day_gpu, action="append", default=[],
                    help="DAY=GPU: baselines written before DAY were timed on GPU")
    ap.add_argument("--since", help="the GPU of the baselines written on or after the last DAY")
    args = ap.parse_args(argv)
    if not args.src.is_file():
        print(f"error: {args.src}: no such file", file=sys.stderr)
        return 2
    try:
        named = name_gpus(args.src, args.dst, sorted(args.before), args.since)
    except (tarfile.TarError, OSError, EOFError) as e:
        print(f"error: {args.src}: {e}", file=sys.stderr)
        return 2
    print(f"{named} baseline(s) named their GPU; wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
