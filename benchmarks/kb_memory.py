"""Memory-aware verification on KernelBench's largest tasks: the plan against what was used.

    python benchmarks/kb_memory.py --out DIR                      # cuda, the tasks below
    python benchmarks/kb_memory.py --out DIR --tasks level1/24_LogSoftmax.py   # in KernelBench
    python benchmarks/kb_memory.py --out DIR --device cpu --tasks data/tasks/level1/1_ReLU.py

For each task (default: KernelBench level 1's 7_Matmul_with_small_K_dimension_, 24_LogSoftmax
and 25_Swish at their own sizes, which ran out of GPU memory inside the verifier's preparation
before planning existed) it verifies the task's own ``Model`` as the candidate (policy
permissive, reference ops allowed: the candidate is honest by construction, so every check
and buffer of the protocol is exercised) in a child process of its own, and records

- the plan: placement of the references, device and host bytes needed, free at the start, and
  the steps of a lighter protocol where the configured one does not fit (``memory_plan``);
- measured: the harness's ``torch.cuda.max_memory_allocated``, the device-wide peak in use
  (``torch.cuda.mem_get_info`` polled every 10 ms while it ran, harness and worker together,
  CUDA contexts included), and the host's peak in use over its level before the task;
- /dev/shm's and the temp folder's free space (the arenas live there, not planned);
- the verdict (accepted, or its reasons: ``too_large`` with the numbers where it cannot fit)
  and the seconds per phase.

Writes DIR/kb_memory.json and DIR/kb_memory.md. A child that dies (out of memory included)
is a row with its exit status and the tail of its output, never the end of the run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# Where KernelBench is: --kernelbench, else the first of these that exists.
KERNELBENCH = [REPO / "shared" / "kernelbench", REPO.parent / "shared" / "kernelbench",
               REPO.parents[1] / "shared" / "kernelbench"]
# The three that ran out of memory, then three the plan fits on an 80 GB H100: two with the
# references on the host (compared on the device in chunks), one on the device (68 GiB).
DEFAULT_TASKS = ["level1/7_Matmul_with_small_K_dimension_.py", "level1/24_LogSoftmax.py",
                 "level1/25_Swish.py", "level1/100_HingeLoss.py", "level1/42_Max_Pooling_2D.py",
                 "level2/5_ConvTranspose2d_Subtract_Tanh.py"]
GiB = 1 << 30


class Peak:
    """Polls device-wide and host memory in use on a thread; keeps the maxima."""

    def __init__(self, device: str, every_s: float = 0.01):
        import psutil

        self.device, self.every_s = device, every_s
        self.host0 = psutil.virtual_memory().used
        self.host = self.dev = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil
        import torch

        while not self._stop.is_set():
            self.host = max(self.host, psutil.virtual_memory().used - self.host0)
            if self.device == "cuda":
                free, total = torch.cuda.mem_get_info()
                self.dev = max(self.dev, total - free)
            time.sleep(self.every_s)

    def __enter__(self) -> "Peak":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def one(task_path: str, device: str, size: str) -> dict:
    """Plan, then verify the task's own Model as the candidate; in this (child) process."""
    import shutil
    import tempfile

    import torch

    from assay.tasks.model import Task, resolve_size
    from assay.verify.harness import verify
    from assay.verify.memory import plan_task
    from assay.verify.settings import VerifyConfig

    cfg = VerifyConfig(policy="permissive", reject_reference_ops=False)
    t0 = time.perf_counter()
    task = Task.from_file(task_path, size=resolve_size(size, device))
    plan = plan_task(task, device, cfg)
    plan_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        cand = Path(tmp) / "model_as_candidate.py"
        cand.write_text(task.source + "\n\nModelNew = Model\n")
        times: dict = {}
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with Peak(device) as peak:
            v = verify(task, cand, device, cfg, times=times, plan=plan)
    shm, tmp_dir = shutil.disk_usage("/dev/shm"), shutil.disk_usage(tempfile.gettempdir())
    return {
        "task": task.id, "device": device, "size": task.size,
        "shm_free_b": shm.free, "tmp_free_b": tmp_dir.free,
        "plan": plan.to_dict() if plan else None, "plan_s": plan_s,
        "accepted": v.accepted, "reasons": v.reasons,
        "details": {r: v.checks[r]["detail"][:500] for r in v.reasons},
        "harness_max_allocated_b": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "device_peak_used_b": peak.dev if device == "cuda" else None,
        "host_peak_used_b": peak.host,
        "seconds": time.perf_counter() - t0,
        "times": {k: v for k, v in times.items() if isinstance(v, (int, float))},
    }


def _gib(b) -> str:
    return "-" if b is None else f"{b / GiB:.1f}"


def table(rows: list[dict]) -> str:
    out = ["| task | verdict | placement | plan device GiB | measured device peak GiB "
           "(harness max_allocated) | plan host GiB | host peak GiB | free device / host GiB "
           "| seconds |", "|" + "---|" * 9]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['task']} | **no verdict**: {r['error'][:200]} | | | | | | | |")
            continue
        p = r["plan"] or {}
        verdict = "accepted" if r["accepted"] else "rejected: " + ", ".join(r["reasons"])
        if p.get("reductions"):  # verified with a lighter protocol: which steps
            verdict += " (lighter: " + ", ".join(p["reductions"]) + ")"
        out.append(
            f"| {r['task']} | {verdict} | {p.get('placement', 'unplanned')} "
            f"| {_gib(p.get('device_need_b'))} | {_gib(r['device_peak_used_b'])} "
            f"({_gib(r['harness_max_allocated_b'])}) | {_gib(p.get('host_need_b'))} "
            f"| {_gib(r['host_peak_used_b'])} | {_gib(p.get('device_free_b'))} / "
            f"{_gib(p.get('host_free_b'))} | {r['seconds']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for kb_memory.json and kb_memory.md")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--size", default="auto", choices=["auto", "large", "small"])
    ap.add_argument("--tasks", nargs="+", help="task files (default: the three KernelBench "
                                               "tasks that ran out of memory)")
    ap.add_argument("--kernelbench", type=Path, help="KernelBench checkout (default: "
                    "shared/kernelbench beside or above the repository)")
    ap.add_argument("--timeout-s", type=int, default=540, help="per task")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child's own task
    args = ap.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.device, args.size), default=str))
        return 0
    if not args.out:
        ap.error("--out is required")
    kb = args.kernelbench or next((d for d in KERNELBENCH if d.is_dir()), KERNELBENCH[0])
    tasks = [t if Path(t).is_file() else str(kb / t) for t in (args.tasks or DEFAULT_TASKS)]
    rows = []
    for t in tasks:
        print(f"== {t}", flush=True)
        cmd = [sys.executable, __file__, "--one", t, "--device", args.device,
               "--size", args.size]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
            line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
            row = (json.loads(line[7:]) if line else
                   {"task": Path(t).stem, "error": f"exit {r.returncode}: "
                    + " ".join((r.stdout + r.stderr).split()[-60:])})
        except subprocess.TimeoutExpired:
            row = {"task": Path(t).stem, "error": f"timeout after {args.timeout_s} s"}
        print(json.dumps(row, default=str)[:600], flush=True)
        rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kb_memory.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    md = table(rows)
    (args.out / "kb_memory.md").write_text(md + "\n")
    print(md)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
