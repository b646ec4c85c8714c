"""The search state, read from and written to the results tree (the files are the truth).

Population, niches and lineage are all derived from the candidate and verdict files, so a
killed run resumes with exactly the state it had: nothing lives only in memory. The rest of
the search state is on disk too:

- ``gen_<g>/stones.json``: the stepping stones generation g's prompts use, recorded before the
  first request (other tasks finishing in between must not change a resumed step's prompts);
- ``gen_<g>/proposals.json``: the generation's candidates, declined proposals, tokens and cost
  (the budget's spend; see ``assay.evolve.budget``), ``stopped`` and ``budget`` when a cap
  applied, and for generation 0 the stage-1 outcome (``functional``);
- ``<llm>/<task>/functional.{py,json}``: stage 1 (``assay.evolve.functional``);
- the random choices come from ``app.rng_for(cfg, llm, task, gen)``, and LLM answers from the
  disk cache.
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
        vdir = c.verdicts_dir(llm, task, g)
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


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def measured_profile(verdict: dict[str, Any], record: dict[str, Any] | None,
                     peaks: dict[str, Any] | None) -> dict[str, Any] | None:
    """A profile summary from what the verifier measured, for parents that the profile step
    has not profiled (it profiles the final best kernel only): achieved bandwidth and FLOP
    rate against the device's measured peaks, which bound the kernel is nearer, how noisy the
    timing was, and the kernels that ran."""
    rt = verdict.get("runtime_ms")
    if not verdict.get("accepted") or not rt:
        return None
    lines = []
    rec, pk = record or {}, peaks or {}
    secs = float(rt) / 1e3
    shares = {}
    if rec.get("min_bytes"):
        gbs = float(rec["min_bytes"]) / secs / 1e9
        line = f"memory: moves at least {_fmt(float(rec['min_bytes']) / 1e6)} MB, {_fmt(gbs)} GB/s"
        if pk.get("bandwidth_gbs"):
            shares["memory"] = gbs / float(pk["bandwidth_gbs"])
            line += (f" = {_fmt(100 * shares['memory'])}% of the measured copy bandwidth "
                     f"({_fmt(float(pk['bandwidth_gbs']))} GB/s)")
        lines.append(line)
    if rec.get("flops"):
        gfs = float(rec["flops"]) / secs / 1e9
        line = f"compute: {_fmt(float(rec['flops']) / 1e6)} MFLOP, {_fmt(gfs)} GFLOP/s"
        if pk.get("flops_tflops"):
            shares["compute"] = gfs / (float(pk["flops_tflops"]) * 1e3)
            line += (f" = {_fmt(100 * shares['compute'])}% of the measured fp32 peak "
                     f"({_fmt(float(pk['flops_tflops']))} TFLOP/s)")
        lines.append(line)
    if shares:
        bound = max(shares, key=shares.get)
        other = "compute" if bound == "memory" else "memory"
        lines.append(f"nearest bound: {bound} ({_fmt(100 * shares[bound])}% of its peak; the "
                     f"rest of the time is overhead, latency or {other})")
    if verdict.get("runtime_iqr_ms") is not None:
        lines.append(f"timing spread: IQR {_fmt(float(verdict['runtime_iqr_ms']))} ms over a "
                     f"median of {_fmt(float(rt))} ms")
    kernels = verdict.get("kernels_launched") or []
    if kernels:
        lines.append(f"{len(kernels)} kernel(s) in the profiled call: "
                     + ", ".join(map(str, kernels[:8])))
    if not lines:
        return None
    return {"summary": "(measured by the verifier)\n" + "\n".join(lines), "source": "verdict"}


def as_parent(c: Campaign, llm: str, task: str, m: Member) -> Parent:
    """A member with its code, verdict and a profile: the profile step's when it profiled this
    candidate, else a summary of what the verifier measured."""
    profile_path = c.profile(llm, task)
    profile = read_json(profile_path) if profile_path.exists() else None
    if profile and profile.get("candidate") != m.id:
        profile = None
    if profile is None:
        rec_path = c.task_record(task)
        record = read_json(rec_path) if rec_path.exists() else None
        # the peaks of the GPU the verdict was timed on (a campaign resumed on another GPU:
        # device.json is the first one's)
        peaks = m.verdict.get("device_peaks") or \
            (read_json(c.device()) if c.device().exists() else None)
        profile = measured_profile(m.verdict, record, peaks)
    meta = dict(m.meta)
    meta.setdefault("task", task)
    return Parent(m.id, c.candidate(llm, task, m.generation, m.id).read_text(), m.verdict,
                  meta, profile)


def stones_path(c: Campaign, llm: str, task: str, gen: int) -> Path:
    return c.stones(llm, task, gen)


def save_stones(c: Campaign, llm: str, task: str, gen: int,
                stones: list[tuple[Path, str, str, int, str]]) -> None:
    """Record which stepping stones generation ``gen``'s prompts use (campaign folder, llm,
    task, generation, id), so a resumed step sends the same prompts whatever finished since."""
    write_json(stones_path(c, llm, task, gen),
               [{"campaign": str(root), "llm": lm, "task": t, "generation": g, "id": cid}
                for root, lm, t, g, cid in stones])


def load_stones(c: Campaign, llm: str, task: str, gen: int) -> list[Parent] | None:
    """The recorded stepping stones of a generation; None when none were recorded yet."""
    path = stones_path(c, llm, task, gen)
    if not path.exists():
        return None
    out = []
    for s in read_json(path):
        other = Campaign(Path(s["campaign"]))
        members = [m for m in load_members(other, s["llm"], s["task"], s["generation"])
                   if m.id == s["id"] and m.generation == s["generation"]]
        if members and other.candidate(s["llm"], s["task"], s["generation"], s["id"]).exists():
            out.append(as_parent(other, s["llm"], s["task"], members[0]))
    return out


def known_ids(c: Campaign, llm: str, task: str, before_gen: int) -> set[str]:
    """Candidates of earlier generations (a rerun of generation g may rewrite its own)."""
    return {p.stem for g in range(before_gen)
            for p in c.candidates_dir(llm, task, g).glob("*.py")}


def write_generation(c: Campaign, llm: str, task: str, gen: int,
                     proposals: list[Proposal], seen: set[str] | None = None,
                     stopped: str | None = None, budget: dict[str, Any] | None = None,
                     extra_spend: tuple[int, float] = (0, 0.0),
                     functional: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write new candidates (content-named, deduplicated) and the generation's proposals.json.

    ``stopped`` notes why the generation ended early (``"budget"``); ``budget`` is the cap and
    spend it was made under; ``extra_spend`` adds (tokens, cost) spent outside the proposals
    (stage 1's rewrite), and ``functional`` its outcome, for generation 0."""
    seen = set(seen or ())
    ids, declined = [], []
    # The workflow declares the folder an output of translate and evolve: made even when empty.
    c.candidates_dir(llm, task, gen).mkdir(parents=True, exist_ok=True)
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
    summary: dict[str, Any] = {
        "generation": gen, "llm": llm, "task": task, "candidates": ids, "declined": declined,
        "tokens": sum(p.tokens_in + p.tokens_out for p in proposals) + int(extra_spend[0]),
        "cost_usd": sum(p.cost_usd for p in proposals) + float(extra_spend[1])}
    if stopped:
        summary["stopped"] = stopped
    if budget:
        summary["budget"] = budget
    if functional is not None:
        summary["functional"] = {k: functional.get(k) for k in
                                 ("accepted", "reasons", "detail", "id", "model",
                                  "tokens_in", "tokens_out", "cost_usd")}
    write_json(c.proposals(llm, task, gen), summary)
    return summary


def task_record(c: Campaign, task: str) -> dict[str, Any]:
    path: Path = c.task_record(task)
    return read_json(path) if path.exists() else {"id": task, "error": "no task record"}
