"""The search state, read from and written to the results tree (the files are the truth).

Population, niches and lineage are all derived from the candidate and verdict files, so a
killed run resumes with exactly the state it had: nothing lives only in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from assay.evolve.population import Member
from assay.layout import Campaign, read_json, write_atomic, write_json
from assay.propose.base import Parent
from assay.records import Proposal


def load_members(c: Campaign, llm: str, task: str, upto_gen: int) -> list[Member]:
    """Every verified candidate of generations 0..upto_gen."""
    members = []
    for g in range(upto_gen + 1):
        vdir = c.gen_dir(llm, task, g) / "verdicts"
        if not vdir.exists():
            continue
        for vf in sorted(vdir.glob("*.json")):
            cid = vf.stem
            meta_path = c.proposal_meta(llm, task, g, cid)
            code_path = c.candidate(llm, task, g, cid)
            meta = read_json(meta_path) if meta_path.exists() else {}
            code_len = len(code_path.read_text()) if code_path.exists() else 0
            members.append(Member(cid, g, read_json(vf), meta, code_len))
    return members


def as_parent(c: Campaign, llm: str, task: str, m: Member) -> Parent:
    profile_path = c.profile(llm, task)
    profile = read_json(profile_path) if profile_path.exists() else None
    if profile and profile.get("candidate") != m.id:
        profile = None
    return Parent(m.id, c.candidate(llm, task, m.generation, m.id).read_text(), m.verdict,
                  m.meta, profile)


def known_ids(c: Campaign, llm: str, task: str, before_gen: int) -> set[str]:
    """Candidates of earlier generations (a rerun of generation g may rewrite its own)."""
    return {p.stem for g in range(before_gen)
            for p in (c.gen_dir(llm, task, g) / "candidates").glob("*.py")}


def write_generation(c: Campaign, llm: str, task: str, gen: int,
                     proposals: list[Proposal], seen: set[str] | None = None) -> dict[str, Any]:
    """Write new candidates (content-named, deduplicated) and the generation's proposals.json."""
    seen = set(seen or ())
    ids, declined = [], []
    for p in proposals:
        if p.code is None:
            declined.append({"operator": p.operator, "parents": p.parents,
                             "reason": p.declined or "no code"})
            continue
        cid = p.id
        if cid in seen:
            continue  # the same code was verified already: never twice
        seen.add(cid)
        write_atomic(c.candidate(llm, task, gen, cid), p.code)
        write_json(c.proposal_meta(llm, task, gen, cid), p.meta(gen, llm, task))
        ids.append(cid)
    summary = {"generation": gen, "llm": llm, "task": task, "candidates": ids,
               "declined": declined,
               "tokens": sum(p.tokens_in + p.tokens_out for p in proposals),
               "cost_usd": sum(p.cost_usd for p in proposals)}
    write_json(c.proposals(llm, task, gen), summary)
    return summary


def task_record(c: Campaign, task: str) -> dict[str, Any]:
    path: Path = c.task_record(task)
    return read_json(path) if path.exists() else {"id": task, "error": "no task record"}
