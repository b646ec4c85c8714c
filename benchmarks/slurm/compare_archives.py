"""Compare two archives of one campaign on the columns that do not depend on timing.

    python benchmarks/slurm/compare_archives.py LOCAL.parquet SLURM.parquet

Deterministic columns: Op_Name, Task_ID, Kernel_Name, Correct, CUDA_Code, Candidate_ID,
Parent_IDs, Generation, LLM (runtimes, speedups, profiles and error texts differ between any two
runs). What must agree, and is checked (exit status 1 otherwise):
  - generation 0 (translation: the offline synthesizer is deterministic from the seed): the same
    rows in both archives;
  - every candidate found in both archives (same id = same code): the same verdict (Correct)
    and the same task and LLM.
Generations >= 1 pick their parents by measured speedup, so two runs of the campaign (on any
executor) may breed different children, reach one child from different parents, or drop a child
as a duplicate of a known candidate; their counts and lineage are reported, not required to
match. `replay_evolve.py` checks those jobs instead: same input files, same proposals.
Prints a markdown table per task and generation.
"""

from __future__ import annotations

import sys

import polars as pl

COLUMNS = ["Op_Name", "Task_ID", "Kernel_Name", "Correct", "CUDA_Code", "Candidate_ID",
           "Parent_IDs", "Generation", "LLM"]


def load(path: str) -> pl.DataFrame:
    frame = pl.read_parquet(path).select(COLUMNS)
    # Lists (Parent_IDs) become a sorted string, so rows compare and sort as plain values.
    return frame.with_columns(
        pl.col(c).list.sort().list.join(",") if frame.schema[c] == pl.List(pl.String) else pl.col(c)
        for c in COLUMNS
    ).sort(COLUMNS)


VERDICT = ["Op_Name", "Task_ID", "Kernel_Name", "Correct", "CUDA_Code", "LLM"]


def main(local_path: str, slurm_path: str) -> int:
    local, slurm = load(local_path), load(slurm_path)
    gen0 = local.filter(pl.col("Generation") == 0).equals(slurm.filter(pl.col("Generation") == 0))
    both = local.join(slurm, on="Candidate_ID", how="inner", suffix="_slurm")
    same_verdict = all(both[c].equals(both[f"{c}_slurm"]) for c in VERDICT)
    same_lineage = int(((both["Parent_IDs"] == both["Parent_IDs_slurm"])
                        & (both["Generation"] == both["Generation_slurm"])).sum())
    print("| task | gen | candidates local / slurm | accepted local / slurm | in both |")
    print("| --- | --- | --- | --- | --- |")
    keys = sorted(set(local.select("Task_ID", "Op_Name", "Generation").rows())
                  | set(slurm.select("Task_ID", "Op_Name", "Generation").rows()))
    for task, op, gen in keys:
        a = local.filter((pl.col("Task_ID") == task) & (pl.col("Generation") == gen))
        b = slurm.filter((pl.col("Task_ID") == task) & (pl.col("Generation") == gen))
        common = a.join(b.select("Candidate_ID"), on="Candidate_ID", how="semi")
        print(f"| {task} {op} | {gen} | {a.height} / {b.height} | {int(a['Correct'].sum())} / "
              f"{int(b['Correct'].sum())} | {common.height} |")
    print()
    print(f"- rows: {local.height} local, {slurm.height} slurm; whole archives "
          f"{'identical' if local.equals(slurm) else 'differ in generations >= 1'}")
    print(f"- generation 0 identical on {', '.join(COLUMNS)}: {'yes' if gen0 else 'NO'}")
    print(f"- {both.height} candidates in both archives; same code and same verdict "
          f"({', '.join(VERDICT)}): {'yes' if same_verdict else 'NO'}; same parents and "
          f"generation: {same_lineage} of {both.height}")
    ok = gen0 and same_verdict
    print(f"- verdict: {'AGREE' if ok else 'DISAGREE'}")
    if not ok:
        bad = both.filter(pl.any_horizontal(pl.col(c) != pl.col(f"{c}_slurm") for c in VERDICT))
        print("candidates judged differently:",
              bad.select("Task_ID", "Candidate_ID", "Correct", "Correct_slurm").rows())
        if not gen0:
            g0 = [f.filter(pl.col("Generation") == 0) for f in (local, slurm)]
            print("generation 0 only in local:", g0[0].join(g0[1], on=COLUMNS, how="anti")
                  .select("Task_ID", "Candidate_ID", "Correct").rows())
            print("generation 0 only in slurm:", g0[1].join(g0[0], on=COLUMNS, how="anti")
                  .select("Task_ID", "Candidate_ID", "Correct").rows())
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: compare_archives.py LOCAL.parquet SLURM.parquet")
    sys.exit(main(sys.argv[1], sys.argv[2]))
