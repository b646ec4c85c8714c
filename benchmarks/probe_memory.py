"""What a harness keeps on the GPU after preparing a task (issue #16): run the self-check's
harness steps (memory plan, degeneracy record, cost, prepare, release) for KernelBench task
files and print, for every device segment still reserved, its size, what of it is allocated and
the Python frames that allocated its live blocks (torch.cuda.memory._record_memory_history).
    python3 benchmarks/probe_memory.py .kb/level1/96_HuberLoss.py ..."""
import sys
from pathlib import Path

import torch

from assay.tasks.analyze import cost, degeneracy
from assay.tasks.model import Task
from assay.verify.memory import plan_task
from assay.verify.reference import prepare
from assay.verify.selfcheck import selfcheck_config

GiB = 2**30


def state(what: str) -> None:
    print(f"  {what}: allocated {torch.cuda.memory_allocated() / GiB:.2f} GiB, "
          f"reserved {torch.cuda.memory_reserved() / GiB:.2f} GiB", flush=True)


def live_blocks() -> None:
    snap = torch.cuda.memory._snapshot()
    for seg in snap["segments"]:
        if seg["total_size"] < (256 << 20):
            continue
        print(f"  segment {seg['total_size'] / GiB:.2f} GiB, allocated "
              f"{seg['allocated_size'] / GiB:.3f} GiB")
        for b in seg["blocks"]:
            if b["state"] != "active_allocated":
                continue
            frames = [f"{Path(f['filename']).name}:{f['line']} {f['name']}"
                      for f in b.get("frames", []) if f["filename"].endswith(".py")][:6]
            print(f"    block {b['size'] / 2**20:.1f} MiB  " + " < ".join(frames))


def main() -> None:
    cfg = selfcheck_config()
    for path in sys.argv[1:]:
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(max_entries=200000)
        task = Task.from_file(Path(path), size="large")
        print(task.id, flush=True)
        plan = plan_task(task, "cuda", cfg)
        print(f"  plan: {plan.placement} {plan.protocol.transfer} {list(plan.reductions)}")
        degeneracy(task, "cuda")
        cost(task)
        state("after the record")
        prep = prepare(task, "cuda", cfg, plan)
        state("after prepare")
        prep.release_transients()
        state("after release_transients")
        live_blocks()
        del prep
        torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    main()
