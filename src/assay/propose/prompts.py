"""Render the Jinja2 prompt templates in ``prompts/`` into chat messages.

A template renders to text in which lines ``<|system|>``, ``<|user|>`` and ``<|assistant|>``
start messages; ``render`` splits it into ``[{"role": ..., "content": ...}, ...]``.
``translate.j2`` is the layout: it holds the system prompt (the candidate contract) in blocks
that the other operators' templates extend and override (``{% extends "translate.j2" %}``).

Templates see plain data only (strings, numbers, lists, dicts); the helpers here turn a
``Parent`` and its verdict/profile dicts into that data (``parent_view``), so the templates
stay free of logic and the rendered text is deterministic for the same inputs (it is part of
the LLM cache key).

The directory is the package's ``prompts/`` (``assay.resources``) unless the caller passes
one (``llm.prompts_dir`` in the config).
No torch, no litellm here.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import jinja2

from assay import resources
from assay.propose.extract import STRATEGIES

__all__ = ["STRATEGIES", "TEMPLATES", "PromptError", "prompts_dir", "render", "render_text",
           "parent_view", "verdict_summary", "profile_summary", "failure_details", "clip"]

TEMPLATES = ("translate", "mutate", "crossover", "repair", "functional")
ROLE_LINE = re.compile(r"^<\|(system|user|assistant)\|>[ \t]*$", re.MULTILINE)

LOG_CHARS = 6000  # compiler logs and check details are clipped to this (head + tail)
STONE_CHARS = 8000  # stepping-stone code is clipped to this


class PromptError(ValueError):
    """A template is missing, malformed, or needs a variable the caller did not pass."""


def prompts_dir() -> Path:
    return resources.prompts_dir()


@lru_cache(maxsize=8)
def _environment(directory: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["clip"] = clip
    env.filters["fmt"] = _fmt
    return env


def _template_name(name: str) -> str:
    return name if name.endswith(".j2") else f"{name}.j2"


def _defaults() -> dict[str, Any]:
    return {"strategies": list(STRATEGIES), "stepping_stones": [], "functional_source": None,
            "notes": None}


def render_text(name: str, directory: str | Path | None = None, **context: Any) -> str:
    """The template rendered to one string (role markers included)."""
    directory = Path(directory) if directory is not None else prompts_dir()
    env = _environment(str(directory))
    try:
        template = env.get_template(_template_name(name))
    except jinja2.TemplateNotFound:
        raise PromptError(f"prompt template {_template_name(name)!r} not found in "
                          f"{directory}") from None
    except jinja2.TemplateSyntaxError as e:
        raise PromptError(f"{e.filename or name}:{e.lineno}: template syntax error: "
                          f"{e.message}") from None
    values = {**_defaults(), **context}
    try:
        return template.render(**values)
    except jinja2.UndefinedError as e:
        raise PromptError(f"prompt {_template_name(name)}: {e.message} (pass it to "
                          f"render())") from None


def render(name: str, prompts_dir: str | Path | None = None, **context: Any) -> list[dict]:
    """Chat messages (system + user, in template order) for template ``name``.

    ``name`` is ``translate``, ``mutate``, ``crossover``, ``repair`` or ``functional``
    (with or without ``.j2``). Every variable the template uses must be passed
    (StrictUndefined); ``strategies``, ``stepping_stones``, ``functional_source`` and
    ``notes`` have defaults.
    """
    text = render_text(name, prompts_dir, **context)
    parts = ROLE_LINE.split(text)
    messages: list[dict] = []
    if parts[0].strip():
        raise PromptError(f"prompt {_template_name(name)}: text before the first role marker "
                          f"(<|system|> or <|user|>)")
    for role, content in zip(parts[1::2], parts[2::2]):
        content = _tidy(content)
        if content.strip():
            messages.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in messages):
        raise PromptError(f"prompt {_template_name(name)} rendered no user message")
    return messages


def _tidy(text: str) -> str:
    """Strip surrounding blank lines and trailing spaces (code inside is left as is)."""
    return text.strip("\n").rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# Views of parents, verdicts and profiles for the templates
# ---------------------------------------------------------------------------------------------

def clip(text: Any, limit: int = LOG_CHARS) -> str:
    """Keep the head and the tail of a long text (compiler errors are at both ends)."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}"


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def verdict_summary(verdict: dict[str, Any] | None) -> str:
    """A few lines a model can act on: decision, timings and speedups, errors, failed checks."""
    v = verdict or {}
    if not v:
        return "not verified yet"
    lines = [f"accepted: {_fmt(bool(v.get('accepted')))}"]
    if v.get("runtime_ms") is not None:
        t = f"runtime: {_fmt(v['runtime_ms'])} ms"
        if v.get("runtime_iqr_ms") is not None:
            t += f" (IQR {_fmt(v['runtime_iqr_ms'])} ms)"
        lines.append(t)
    base = []
    if v.get("baseline_eager_ms") is not None:
        base.append(f"PyTorch eager {_fmt(v['baseline_eager_ms'])} ms")
    if v.get("baseline_compile_ms") is not None:
        base.append(f"torch.compile {_fmt(v['baseline_compile_ms'])} ms")
    if base:
        lines.append("baselines: " + ", ".join(base))
    sp = []
    if v.get("speedup_eager") is not None:
        sp.append(f"{_fmt(v['speedup_eager'], 3)}x vs eager")
    if v.get("speedup_compile") is not None:
        sp.append(f"{_fmt(v['speedup_compile'], 3)}x vs torch.compile")
    if sp:
        lines.append("speedup: " + ", ".join(sp))
    if v.get("roofline_ms") is not None:
        r = f"roofline bound: {_fmt(v['roofline_ms'])} ms"
        if v.get("runtime_ms") and v["roofline_ms"]:
            r += f" (runtime is {_fmt(v['runtime_ms'] / v['roofline_ms'], 3)}x the bound)"
        lines.append(r)
    if v.get("max_abs_err") is not None or v.get("rel_err") is not None:
        lines.append(f"error vs reference: max abs {_fmt(v.get('max_abs_err'))}, "
                     f"rel {_fmt(v.get('rel_err'))}")
    kernels = v.get("kernels_launched") or []
    if kernels:
        more = f" (+{len(kernels) - 12} more)" if len(kernels) > 12 else ""
        lines.append("kernels launched: " + ", ".join(map(str, kernels[:12])) + more)
    if v.get("library_time_frac") is not None:
        lines.append(f"fraction of time in vendor libraries: {_fmt(v['library_time_frac'], 3)}")
    reasons = list(v.get("reasons") or [])
    if reasons:
        lines.append("failed checks: " + ", ".join(map(str, reasons)))
    checks = v.get("checks") or {}
    for name in reasons:
        detail = (checks.get(name) or {}).get("detail")
        if detail:
            lines.append(f"  {name}: {clip(detail, 600)}")
    if v.get("error"):
        lines.append("error: " + clip(v["error"], 600))
    return "\n".join(lines)


def profile_summary(profile: dict[str, Any] | None, limit: int = 3000) -> str:
    """The profiler's summary if it wrote one, else its dict in compact form."""
    if not profile:
        return ""
    if isinstance(profile.get("summary"), str) and profile["summary"].strip():
        return clip(profile["summary"].strip(), limit)
    kernels = profile.get("kernels")
    if isinstance(kernels, list) and kernels and all(isinstance(k, dict) for k in kernels):
        rows = []
        for k in kernels[:15]:
            rows.append(", ".join(f"{key}={_fmt(val)}" for key, val in k.items()
                                  if not isinstance(val, (dict, list))))
        rest = {k: v for k, v in profile.items() if k != "kernels"}
        head = json.dumps(rest, sort_keys=True, default=str) if rest else ""
        return clip((head + "\n" if head else "") + "\n".join(rows), limit)
    return clip(json.dumps(profile, sort_keys=True, default=str, indent=1), limit)


def failure_details(verdict: dict[str, Any] | None, meta: dict[str, Any] | None = None) -> str:
    """What went wrong, for repair: the build log, the error, each failed check's detail."""
    v = verdict or {}
    meta = meta or {}
    parts: list[str] = []
    for key in ("build_log", "compile_log", "log"):
        if meta.get(key):
            parts.append(f"[{key}]\n{clip(meta[key])}")
    if v.get("error"):
        parts.append(f"[error]\n{clip(v['error'])}")
    checks = v.get("checks") or {}
    names = list(v.get("reasons") or []) or [n for n, c in checks.items()
                                            if not (c or {}).get("passed", True)]
    for name in names:
        detail = (checks.get(name) or {}).get("detail") or "(no detail)"
        parts.append(f"[failed check: {name}]\n{clip(detail)}")
    return "\n\n".join(parts) if parts else "(the verifier gave no details)"


def parent_view(parent: Any, code_limit: int | None = None) -> dict[str, Any]:
    """A ``Parent`` as plain data for templates."""
    verdict = dict(getattr(parent, "verdict", None) or {})
    meta = dict(getattr(parent, "meta", None) or {})
    code = parent.code if code_limit is None else clip(parent.code, code_limit)
    return {
        "id": parent.id,
        "code": code,
        "accepted": bool(verdict.get("accepted")),
        "speedup_eager": verdict.get("speedup_eager"),
        "speedup_compile": verdict.get("speedup_compile"),
        "runtime_ms": verdict.get("runtime_ms"),
        "reasons": list(verdict.get("reasons") or []),
        "strategy": meta.get("strategy") or "",
        "task": meta.get("task") or verdict.get("task") or "",
        "summary": verdict_summary(verdict),
        "profile": profile_summary(getattr(parent, "profile", None)),
        "failure": failure_details(verdict, meta),
    }


def parent_views(parents: Iterable[Any], code_limit: int | None = None) -> list[dict[str, Any]]:
    return [parent_view(p, code_limit) for p in parents]
