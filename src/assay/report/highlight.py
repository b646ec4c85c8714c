"""Syntax highlighting for the report: candidate files are Python with the kernel's C++/CUDA
source in string literals, so those strings are highlighted as C++/CUDA and the rest as Python.

Pygments (a dependency of rich, so present wherever the report runs) with CSS classes under
``.hl`` (``css()`` gives the rules, to inline in the page); without Pygments the code is only
escaped. Every line gets a line-number span, so the output is meant for a ``<pre class="hl">``.
"""

from __future__ import annotations

import functools
import io
import re
import tokenize

from markupsafe import Markup, escape

STYLE = "github-dark"

# a string literal that holds kernel source rather than prose
_KERNEL_HINT = re.compile(r"__global__|__device__|#include|extern\s+\"C\"|blockIdx|threadIdx|"
                          r"torch::Tensor|\bvoid\s+\w+\s*\(|\bfor\s*\(\s*(int|size_t|long)\b")
_CUDA_HINT = re.compile(r"__global__|__device__|__shared__|blockIdx|threadIdx|<<<|cuda")
_STRING_START = re.compile(r"^(?P<prefix>[A-Za-z]*)(?P<quote>\"\"\"|'''|\"|')")


@functools.lru_cache(maxsize=1)
def _pygments():
    try:
        import pygments  # noqa: F401
    except ImportError:  # pragma: no cover - rich depends on pygments
        return None
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import CppLexer, CudaLexer, DiffLexer, PythonLexer

    return highlight, HtmlFormatter, {"python": PythonLexer, "cuda": CudaLexer,
                                      "cpp": CppLexer, "diff": DiffLexer}


def css() -> str:
    """The highlighter's CSS rules, scoped to ``.hl`` (empty without Pygments)."""
    pg = _pygments()
    if pg is None:
        return ""
    _, HtmlFormatter, _ = pg
    fmt = HtmlFormatter(style=STYLE)
    return "\n".join(line for line in fmt.get_style_defs(".hl").splitlines()
                     if line.startswith(".hl"))


def _fragment(text: str, language: str) -> str:
    """``text`` highlighted as ``language``: spans closed at every line end, no wrapper."""
    if not text:
        return ""
    pg = _pygments()
    if pg is None:
        return str(escape(text))
    highlight, HtmlFormatter, lexers = pg
    lexer = lexers[language](stripnl=False, ensurenl=False)
    html = highlight(text, lexer, HtmlFormatter(nowrap=True))
    if not text.endswith("\n") and html.endswith("\n"):  # the formatter ends every line
        html = html[:-1]
    return html


def _segments(code: str) -> list[tuple[str, str]]:
    """Split a Python file into (language, text) pieces: kernel source found in a string literal
    becomes a "cuda"/"cpp" piece and its prefix and quotes "quote" pieces, so each piece of
    Python handed to the lexer is whole tokens."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return [("python", code)]
    starts = [0]
    for line in code.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(row: int, col: int) -> int:
        return starts[row - 1] + col if row - 1 < len(starts) else len(code)

    out: list[tuple[str, str]] = []
    pos = 0
    for tok in tokens:
        if tok.type != tokenize.STRING:
            continue
        m = _STRING_START.match(tok.string)
        quote = m.group("quote") if m else ""
        if m is None or len(tok.string) < m.end() + len(quote):
            continue
        body = tok.string[m.end():len(tok.string) - len(quote)]
        if "\n" not in body or not _KERNEL_HINT.search(body):
            continue
        start = offset(*tok.start)
        if code[start:start + len(tok.string)] != tok.string:  # odd line endings: play safe
            return [("python", code)]
        out += [("python", code[pos:start]), ("quote", tok.string[:m.end()]),
                ("cuda" if _CUDA_HINT.search(body) else "cpp", body), ("quote", quote)]
        pos = start + len(tok.string)
    out.append(("python", code[pos:]))
    return [(lang, text) for lang, text in out if text]


def _numbered(html: str) -> Markup:
    lines = html.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    width = len(str(len(lines)))
    return Markup("\n".join(f'<span class="ln">{i:>{width}}</span>{line}'
                            for i, line in enumerate(lines, 1)))


def highlight_code(code: str | None, language: str = "python") -> Markup:
    """Highlighted HTML for ``code`` (``language``: python, cuda, cpp, diff), line-numbered
    except diffs. Python files have their kernel strings highlighted as CUDA / C++."""
    if not code:
        return Markup("")
    if language == "python":
        html = "".join(f'<span class="s2">{escape(text)}</span>' if lang == "quote"
                       else _fragment(text, lang) for lang, text in _segments(code))
    else:
        html = _fragment(code, language)
    if language == "diff":
        return Markup(html.rstrip("\n"))
    return _numbered(html)
