"""Replay every evolve job of a finished campaign locally and compare what it proposed.

    python benchmarks/slurm/replay_evolve.py WORKDIR OVERRIDES
    (OVERRIDES as in Snakemake's config, e.g. campaign=ci,tasks=ci,evolve=ci,target=cpu)

Generations >= 1 choose their parents by measured speedup, so two runs of one campaign (on any
executor) can breed different children. What must not differ is the step itself: given the
files a generation was bred from (the verdicts of generations < g and the recorded stepping
stones), `python -m assay.steps.evolve` proposes the same candidates wherever it runs. For each
(llm, task, gen >= 1) of WORKDIR/results/<campaign>, this copies the tree truncated before that
generation (keeping its stones.json), runs the evolve step here, and compares the candidate ids
with those the campaign's own job wrote. Prints one line per job; exit status 1 on a mismatch.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main(workdir: str, overrides: str) -> int:
    ovr = [o for o in overrides.split(",") if o]
    campaign = next((o.split("=", 1)[1] for o in ovr if o.startswith("campaign=")), "default")
    results = Path(workdir) / "results"
    root = results / campaign
    bad = 0
    jobs = sorted(root.glob("*/*/gen_*/proposals.json"))
    for props in jobs:
        gen = int(props.parent.name.split("_")[1])
        if gen < 1:
            continue
        task_dir = props.parent.parent
        llm, task = task_dir.parent.name, task_dir.name
        want = json.loads(props.read_text())["candidates"]
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "results"
            shutil.copytree(results, copy)
            tdir = copy / campaign / llm / task
            for d in tdir.glob("gen_*"):
                g = int(d.name.split("_")[1])
                if g > gen:
                    shutil.rmtree(d)
                elif g == gen:
                    for p in d.iterdir():  # keep the stepping stones recorded for this generation
                        if p.name != "stones.json":
                            shutil.rmtree(p) if p.is_dir() else p.unlink()
            r = subprocess.run([sys.executable, "-m", "assay.steps.evolve", *ovr, f"llm={llm}",
                                f"task={task}", f"gen={gen}"], cwd=tmp, capture_output=True,
                               text=True)
            out = tdir / f"gen_{gen}" / "proposals.json"
            got = json.loads(out.read_text())["candidates"] if out.exists() else None
        same = r.returncode == 0 and got == want
        bad += not same
        print(f"{llm}/{task} gen {gen}: job proposed {len(want)} {want}; replay "
              f"{'identical' if same else f'DIFFERENT: {got} (exit {r.returncode})'}")
        if r.returncode != 0:
            print(re.sub(r"(?m)^", "    ", r.stderr[-1500:]))
    print(f"{sum(1 for p in jobs if not p.parent.name.endswith('_0'))} evolve jobs replayed, "
          f"{bad} different")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
