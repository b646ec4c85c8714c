"""Pull the candidate file out of an LLM's answer.

Answers are chatty: prose, a plan, several code blocks (a first draft, a corrected one, a
usage example). The rule: the *last* fenced ``python`` block that defines ``class ModelNew``
wins; failing that, the last fenced block of any language (or none) that does; failing that,
an answer that is nothing but code. A block that does not parse is skipped in favour of an
earlier one that does; if none parses the error names the syntax error's line.

No torch, no litellm: this runs anywhere.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

__all__ = ["NoCodeError", "CodeBlock", "fenced_blocks", "extract_candidate", "parse_strategy",
           "STRATEGIES"]

STRATEGIES = ("tiling", "fusion", "vectorization", "tensor_cores", "memory_layout", "other")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*?)[ \t]*$")
_PY_LANGS = {"python", "py", "python3", "py3", "pycon", "ipython", "python3.11"}


class NoCodeError(ValueError):
    """The answer holds no usable candidate; the message is the decline reason."""


@dataclass(frozen=True)
class CodeBlock:
    lang: str  # the fence's info string, lower-cased first word ("" when none)
    code: str
    line: int  # 1-based line of the opening fence in the answer
    end: int = 0  # 1-based line of the closing fence (the last line when left open)
    closed: bool = True

    @property
    def is_python(self) -> bool:
        return self.lang in _PY_LANGS


def fenced_blocks(answer: str) -> list[CodeBlock]:
    """Every fenced block in order. A fence left open at the end of the answer (a truncated
    answer, or a model that forgot to close it) still counts, marked ``closed=False``."""
    blocks: list[CodeBlock] = []
    lines = answer.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), m.group("indent")
        info = m.group("info").strip()
        lang = info.split()[0].lower().strip("{}.") if info else ""
        body: list[str] = []
        j = i + 1
        closed = False
        while j < len(lines):
            c = _FENCE.match(lines[j])
            # a closing fence: same character, at least as long, no info string
            if c and c.group("fence")[0] == fence[0] and len(c.group("fence")) >= len(fence) \
                    and not c.group("info").strip():
                closed = True
                break
            body.append(lines[j])
            j += 1
        text = "\n".join(body)
        if indent:
            text = textwrap.dedent(text)
        blocks.append(CodeBlock(lang, text.strip("\n") + "\n", i + 1, min(j + 1, len(lines)),
                                closed))
        i = j + 1
    return blocks


def _defines(tree: ast.Module, class_name: str) -> bool:
    return any(isinstance(n, ast.ClassDef) and n.name == class_name for n in tree.body)


def extract_candidate(answer: str, class_name: str = "ModelNew") -> str:
    """The candidate file's text from an LLM answer; raises ``NoCodeError`` when there is none.

    ``class_name`` is ``ModelNew`` for kernels; the stage-1 functional rewrite asks for
    ``Model``.
    """
    if not isinstance(answer, str) or not answer.strip():
        raise NoCodeError("empty answer")
    mention = re.compile(rf"\bclass\s+{re.escape(class_name)}\b")
    blocks = [b for b in fenced_blocks(answer) if mention.search(b.code)]
    python = [b for b in blocks if b.is_python]
    others = [b for b in blocks if not b.is_python]
    # preference order: python blocks last-to-first, then any other block last-to-first
    ordered = list(reversed(python)) + list(reversed(others))
    if not ordered and mention.search(answer) and not fenced_blocks(answer):
        # no fences at all: accept an answer that is nothing but the file
        ordered = [CodeBlock("", answer.strip("\n") + "\n", 1, answer.count("\n") + 1)]
    if not ordered:
        raise NoCodeError(f"answer has no python code block defining class {class_name}")
    first_error: str | None = None
    for block in ordered:
        try:
            tree = ast.parse(block.code)
        except SyntaxError as e:
            if first_error is None:
                where = f"line {e.lineno} of the code block" if e.lineno else "the code block"
                trunc = "" if block.closed else " (the block is not closed: answer truncated?)"
                first_error = f"candidate code does not parse: {e.msg} at {where}{trunc}"
            continue
        if not _defines(tree, class_name):
            if first_error is None:
                first_error = (f"code block mentions class {class_name} but does not define it "
                               f"at module level")
            continue
        return block.code
    raise NoCodeError(first_error or f"answer has no python code block defining class "
                                     f"{class_name}")


_STRATEGY_LINE = re.compile(
    r"^[ \t>*_#-]*strategy[ \t*_]*[:=\-–—][ \t*_`\"']*(?P<value>[A-Za-z][A-Za-z _\-]*)",
    re.IGNORECASE | re.MULTILINE)
_ALIASES = {"tensor_core": "tensor_cores", "tensorcores": "tensor_cores", "tc": "tensor_cores",
            "wmma": "tensor_cores", "mma": "tensor_cores", "layout": "memory_layout",
            "memory": "memory_layout", "coalescing": "memory_layout", "tile": "tiling",
            "tiled": "tiling", "blocking": "tiling", "fuse": "fusion", "fused": "fusion",
            "kernel_fusion": "fusion", "vectorize": "vectorization", "vectorized": "vectorization",
            "simd": "vectorization", "vector": "vectorization"}


def _normalize_strategy(value: str) -> str | None:
    words = re.split(r"[\s\-]+", value.strip().lower())
    # try the longest prefix first: "tensor cores with wmma" -> tensor_cores
    for k in range(min(len(words), 3), 0, -1):
        cand = "_".join(words[:k]).strip("_")
        if cand in STRATEGIES:
            return cand
        if cand in _ALIASES:
            return _ALIASES[cand]
    return None


def parse_strategy(answer: str, default: str = "other") -> str:
    """The niche the model named on a ``Strategy: <name>`` line (outside code blocks first)."""
    if not isinstance(answer, str):
        return default
    lines = answer.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    inside = {n for b in fenced_blocks(answer) for n in range(b.line, b.end + 1)}
    outside = "\n".join(text for n, text in enumerate(lines, 1) if n not in inside)
    for text in (outside, answer):
        for m in _STRATEGY_LINE.finditer(text):
            s = _normalize_strategy(m.group("value"))
            if s:
                return s
    return default
