"""Run the red-team generator's variants (tests/redteam/, issue #19) through the real verifier.

    python benchmarks/redteam.py --target cpu|cuda --out DIR [--workers N] [--seed S]
                                 [--per-group N] [--only SUBSTR ...] [--budget-s S] [--gpus N]

Writes DIR/candidates/ (every generated file and manifest.json), DIR/results.jsonl (one row per
verified variant, appended as each finishes, so a killed run resumes where it stopped: rows
already there are skipped), DIR/redteam.json (the summary) and DIR/redteam.md (a table per
method and trigger). Exit code 0 when every exploit was rejected for one of its method's
reasons and every honest variant accepted, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from redteam.generate import Variant, generate, sample, write  # noqa: E402


def _pin_gpu(counter, gpu_ids: list[str]) -> None:
    """Pool initializer: worker i verifies on GPU ``gpu_ids[i mod N]`` (set before torch loads)."""
    import os

    with counter.get_lock():
        i = counter.value
        counter.value += 1
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu_ids[i % len(gpu_ids)]


def _one(v: Variant, path: str, budget_s: float) -> dict:
    from redteam.check import run

    try:
        return run(v, Path(path), budget_s)
    except Exception as e:  # noqa: BLE001 - a harness error is a row, not the end of the run
        return {**v.meta(), "accepted": None, "got": [], "outcome": "harness_error",
                "error": f"{type(e).__name__}: {e}"[:300], "failed": {}, "verify_s": None,
                "runtime_ms": None}


def summarize(rows: list[dict]) -> dict:
    by = collections.Counter((r["kind"], r["outcome"]) for r in rows)
    bad = [r for r in rows if r["outcome"] != "ok"]
    return {"variants": len(rows),
            "exploits": sum(n for (k, _), n in by.items() if k == "exploit"),
            "honest": sum(n for (k, _), n in by.items() if k == "honest"),
            "exploits_rejected": by[("exploit", "ok")],
            "exploits_accepted": by[("exploit", "accepted")],
            "exploits_known_gap": by[("exploit", "known_gap")],
            "exploits_wrong_reason": by[("exploit", "wrong_reason")],
            "honest_accepted": by[("honest", "ok")],
            "honest_rejected": by[("honest", "rejected")],
            "harness_errors": sum(n for (_, o), n in by.items() if o == "harness_error"),
            "not_ok": [{k: r[k] for k in ("id", "outcome", "got", "error")} for r in bad]}


def markdown(rows: list[dict], summary: dict, target: str) -> str:
    ex = [r for r in rows if r["kind"] == "exploit"]
    triggers = sorted({r["trigger"] for r in ex})
    methods = sorted({r["method"] for r in ex})
    cell = collections.defaultdict(lambda: [0, 0])
    for r in ex:
        c = cell[(r["method"], r["trigger"])]
        c[0] += r["outcome"] == "ok"
        c[1] += 1
    out = [f"# Red team, target {target}", "",
           f"{summary['exploits']} exploit variants: {summary['exploits_rejected']} rejected "
           f"for their method's reason, {summary['exploits_accepted']} accepted, "
           f"{summary['exploits_known_gap']} accepted as known gaps (KNOWN_GAPS), "
           f"{summary['exploits_wrong_reason']} rejected for another reason; "
           f"{summary['honest']} honest variants: {summary['honest_accepted']} accepted, "
           f"{summary['honest_rejected']} rejected; {summary['harness_errors']} harness errors.",
           "", "Exploits rejected / generated, per method (rows) and trigger (columns):", "",
           "| method | " + " | ".join(triggers) + " |",
           "| --- |" + " --- |" * len(triggers)]
    for m in methods:
        out.append(f"| {m} | " + " | ".join(
            f"{cell[(m, t)][0]}/{cell[(m, t)][1]}" if cell[(m, t)][1] else "" for t in triggers)
            + " |")
    ho = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        if r["kind"] == "honest":
            for m in r["mods"]:
                ho[m][0] += r["outcome"] == "ok"
                ho[m][1] += 1
    out += ["", "Honest variants accepted / generated, per harmless change (a pair counts for "
            "both):", "", "| change | accepted |", "| --- | --- |"]
    out += [f"| {m} | {a}/{n} |" for m, (a, n) in sorted(ho.items())]
    if summary["not_ok"]:
        out += ["", "Not as called for:", "", "| variant | outcome | reasons | error |",
                "| --- | --- | --- | --- |"]
        out += [f"| {b['id']} | {b['outcome']} | {', '.join(b['got'])} | "
                f"{b['error'][:120].replace('|', '/')} |" for b in summary["not_ok"]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--out", type=Path, required=True, help="output folder (resumed if present)")
    ap.add_argument("--workers", type=int, default=2, help="parallel verifications (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    ap.add_argument("--per-group", type=int, default=0,
                    help="a seeded sample: this many variants of each method and of each "
                         "harmless change (default 0: every variant)")
    ap.add_argument("--only", nargs="*", default=[], help="variants whose id contains any of these")
    ap.add_argument("--budget-s", type=float, default=0.1, help="timing budget per candidate")
    ap.add_argument("--gpus", type=int, default=1,
                    help="cuda: spread the workers over this many of the visible GPUs "
                         "(worker i on the (i mod N)-th)")
    a = ap.parse_args(argv)
    if a.workers < 1 or a.gpus < 1:
        ap.error("--workers and --gpus must be at least 1")

    variants = generate(a.target, a.seed)
    if a.per_group:
        variants = sample(variants, a.per_group, a.seed)
    if a.only:
        variants = [v for v in variants if any(s in v.id for s in a.only)]
    paths = write(variants, a.out / "candidates")
    results = a.out / "results.jsonl"
    done: dict[str, dict] = {}
    if results.exists():
        for line in results.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut off by a kill
            if row.get("outcome") != "harness_error":
                done[row["id"]] = row
    todo = [v for v in variants if v.id not in done]
    print(f"{len(variants)} variants ({len(variants) - len(todo)} already verified), "
          f"{a.workers} workers",
          flush=True)
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # the parent never forks a process holding CUDA
    pin = {}
    if a.target == "cuda" and a.gpus > 1:
        from assay.gpu import visible_gpus  # the ids this run was given (a lane's, say)

        ids = (visible_gpus() or [str(k) for k in range(a.gpus)])[:a.gpus]
        pin = {"initializer": _pin_gpu, "initargs": (ctx.Value("i", 0), ids)}
    with ProcessPoolExecutor(a.workers, mp_context=ctx, **pin) as pool, results.open("a") as f:
        futs = {pool.submit(_one, v, str(paths[v.id]), a.budget_s): v for v in todo}
        for i, fut in enumerate(as_completed(futs), 1):
            row = fut.result()
            done[row["id"]] = row
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"[{i}/{len(todo)} {time.perf_counter() - t0:.0f}s] {row['outcome']:12s} "
                  f"{row['id']} {','.join(row['got'])}", flush=True)
    rows = [done[v.id] for v in variants if v.id in done]
    summary = summarize(rows)
    (a.out / "redteam.json").write_text(json.dumps(
        {"target": a.target, "seed": a.seed, **summary, "rows": rows}, indent=1))
    (a.out / "redteam.md").write_text(markdown(rows, summary, a.target))
    print(markdown(rows, summary, a.target))
    return 0 if all(r["outcome"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
