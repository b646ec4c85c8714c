"""The budget cap of one LLM backend over a campaign, read from the results tree.

What a backend has spent is the sum of the ``tokens`` and ``cost_usd`` totals of its
generations' ``proposals.json`` files, over every task of the campaign (the stage-1 rewrite is
counted in its task's generation 0). The files are the truth: a resumed run sees exactly what
was spent, and replayed (cached) answers carry their original accounting, so a rerun makes the
same stop decisions as the run it continues.

The cap is checked before each operator call (translate's ``n`` answers are one call, each
mutation, crossover or repair another); a call that starts under the cap finishes, so a
campaign may end above the cap by at most one call. With several tasks running at once, which
task reaches the cap first depends on the order in which their generations finish.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from assay.layout import Campaign

STOPPED = "budget"


def spent(c: Campaign, llm: str, exclude: tuple[str, int] | None = None) -> tuple[int, float]:
    """(tokens, cost_usd) of ``llm``'s written generations in campaign ``c``, leaving out the
    generation ``exclude = (task, gen)`` (the one being made, which a rerun rewrites)."""
    tokens, cost = 0, 0.0
    llm_dir = c.root / llm
    if not llm_dir.is_dir():
        return tokens, cost
    for path in sorted(llm_dir.glob("*/gen_*/proposals.json")):
        task, gen_name = path.parent.parent.name, path.parent.name
        if exclude is not None and (task, f"gen_{exclude[1]}") == (exclude[0], gen_name):
            continue
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # written atomically: unreadable means not ours; do not guess
        tokens += int(d.get("tokens") or 0)
        cost += float(d.get("cost_usd") or 0.0)
    return tokens, cost


@dataclass
class Budget:
    """A backend's cap and what is spent so far (files before this step + this step)."""

    cap_usd: float | None = None
    cap_tokens: int | None = None
    spent_tokens: int = 0
    spent_usd: float = 0.0
    before_tokens: int = 0
    before_usd: float = 0.0

    @classmethod
    def for_step(cls, cfg: Any, c: Campaign, llm: str, task: str, gen: int) -> "Budget":
        cap_usd, cap_tokens = cfg.llm.budget_usd, cfg.llm.budget_tokens  # schemas.LLMConfig
        if cap_usd is None and cap_tokens is None:
            return cls()
        tokens, cost = spent(c, llm, exclude=(task, gen))
        return cls(None if cap_usd is None else float(cap_usd),
                   None if cap_tokens is None else int(cap_tokens), tokens, cost, tokens, cost)

    @property
    def capped(self) -> bool:
        return self.cap_usd is not None or self.cap_tokens is not None

    def exhausted(self) -> bool:
        return ((self.cap_tokens is not None and self.spent_tokens >= self.cap_tokens)
                or (self.cap_usd is not None and self.spent_usd >= self.cap_usd))

    def charge(self, proposals: Iterable[Any]) -> None:
        for p in proposals:
            self.spent_tokens += int(p.tokens_in) + int(p.tokens_out)
            self.spent_usd += float(p.cost_usd)

    def charge_raw(self, tokens: int, cost_usd: float) -> None:
        self.spent_tokens += int(tokens)
        self.spent_usd += float(cost_usd)

    def note(self) -> dict[str, Any] | None:
        """What proposals.json records about the cap (None when there is none)."""
        if not self.capped:
            return None
        return {"cap_usd": self.cap_usd, "cap_tokens": self.cap_tokens,
                "spent_before_tokens": self.before_tokens,
                "spent_before_usd": round(self.before_usd, 10),
                "spent_after_tokens": self.spent_tokens,
                "spent_after_usd": round(self.spent_usd, 10)}
