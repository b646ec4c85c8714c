"""Inline SVG charts for the report: no scripts, no fonts or images to fetch, a ``<title>`` on
every mark (the browser shows it on hover). Every chart is an ``<svg class="chart">``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from markupsafe import Markup, escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
# how a candidate came to be (records.OPERATORS), for the lineage trees' edges
OPERATOR_COLORS = {"translate": "#57606a", "functional": "#8c959f", "mutate": "#1f77b4",
                   "crossover": "#9467bd", "repair": "#d97706"}
OTHER_OPERATOR = "#8c564b"


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _num(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"


def _legend(names: list[str], x: float, y: float) -> list[str]:
    out = []
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        yy = y + 16 * i
        out.append(f'<rect x="{x}" y="{yy - 9}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{x + 14}" y="{yy}" class="lg">{escape(name)}</text>')
    return out


def svg_bar_chart(categories: list[str], series: dict[str, list[float]], *, xlabel: str = "",
                  ylabel: str = "", width: int = 680, height: int = 260,
                  counts: bool = True) -> Markup:
    """Grouped bars: one group per category, one bar per series (``counts``: integer ticks)."""
    left, right, top, bottom = 48, 130, 12, 48
    pw, ph = width - left - right, height - top - bottom
    vmax = max((v for vals in series.values() for v in vals), default=0.0)
    ymax = 4 * max(1, math.ceil(vmax / 4)) if counts else _nice_max(vmax)
    n_cat, n_ser = max(len(categories), 1), max(len(series), 1)
    group = pw / n_cat
    bar = group * 0.8 / n_ser
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img">']
    for i in range(5):
        v = ymax * i / 4
        y = top + ph - ph * v / ymax
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'class="grid"/><text x="{left - 6}" y="{y + 4:.1f}" class="yt">'
                     f'{_num(v)}</text>')
    for s, (name, vals) in enumerate(series.items()):
        color = PALETTE[s % len(PALETTE)]
        for c, v in enumerate(vals):
            h = ph * v / ymax
            x = left + group * c + group * 0.1 + bar * s
            parts.append(f'<rect x="{x:.1f}" y="{top + ph - h:.1f}" width="{bar:.1f}" '
                         f'height="{h:.1f}" fill="{color}"><title>{escape(name)}: '
                         f'{escape(categories[c])}: {_num(v)}</title></rect>')
    for c, label in enumerate(categories):
        x = left + group * (c + 0.5)
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 16}" class="xt">{escape(label)}</text>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" '
                 f'class="axis"/>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 6}" class="al">'
                 f'{escape(xlabel)}</text>')
    parts.append(f'<text x="12" y="{top + ph / 2:.1f}" class="al" '
                 f'transform="rotate(-90 12 {top + ph / 2:.1f})">{escape(ylabel)}</text>')
    parts += _legend(list(series), left + pw + 14, top + 12)
    parts.append("</svg>")
    return Markup("".join(parts))


def svg_line_chart(xs: list[float], series: dict[str, list[float]], *, xlabel: str = "",
                   ylabel: str = "", ymax: float | None = None, width: int = 680,
                   height: int = 260, percent: bool = False, step: bool = False) -> Markup:
    """Lines over a shared x axis (``step``: drawn as a step function)."""
    left, right, top, bottom = 48, 130, 12, 40
    pw, ph = width - left - right, height - top - bottom
    top_v = ymax if ymax is not None else _nice_max(
        max((v for vals in series.values() for v in vals), default=0.0))
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    span = (x1 - x0) or 1.0

    def px(x: float) -> float:
        return left + pw * (x - x0) / span

    def py(y: float) -> float:
        return top + ph - ph * y / top_v

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img">']
    for i in range(5):
        v = top_v * i / 4
        label = f"{v * 100:.0f}%" if percent else _num(v)
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
                     f'class="grid"/><text x="{left - 6}" y="{py(v) + 4:.1f}" class="yt">'
                     f'{label}</text>')
    ticks = sorted({round(x0 + span * i / 6, 2) for i in range(7)})
    for t in ticks:
        parts.append(f'<text x="{px(t):.1f}" y="{top + ph + 16}" class="xt">{_num(t)}</text>')
    parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" '
                 f'class="axis"/>')
    for s, (name, vals) in enumerate(series.items()):
        color = PALETTE[s % len(PALETTE)]
        pts: list[str] = []
        for i, (x, y) in enumerate(zip(xs, vals)):
            if step and i:  # hold the previous value up to this x
                pts.append(f"{px(x):.1f},{py(vals[i - 1]):.1f}")
            pts.append(f"{px(x):.1f},{py(y):.1f}")
        dash = ' stroke-dasharray="6 3"' if s % 2 else ""
        parts.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" '
                     f'stroke-width="2"{dash}><title>{escape(name)}</title></polyline>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 4}" class="al">'
                 f'{escape(xlabel)}</text>')
    parts.append(f'<text x="12" y="{top + ph / 2:.1f}" class="al" '
                 f'transform="rotate(-90 12 {top + ph / 2:.1f})">{escape(ylabel)}</text>')
    parts += _legend(list(series), left + pw + 14, top + 12)
    parts.append("</svg>")
    return Markup("".join(parts))


def _log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]


def _si(v: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


class _LogLog:
    """A log-log frame both scatter charts share: decade grid, axes, the points, the legend."""

    left, right, top, bottom = 58, 130, 14, 44

    def __init__(self, xs: list[float], ys: list[float], width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pw, self.ph = width - self.left - self.right, height - self.top - self.bottom
        if not xs:
            xs, ys = [0.1, 10.0], [0.1, 10.0]
        self.x_lo = 10 ** math.floor(math.log10(min(xs) / 3))
        self.x_hi = 10 ** math.ceil(math.log10(max(xs) * 3))
        self.y_lo = 10 ** math.floor(math.log10(min(ys) / 3))
        self.y_hi = 10 ** math.ceil(math.log10(max(ys) * 3))

    def px(self, x: float) -> float:
        lo, hi = math.log10(self.x_lo), math.log10(self.x_hi)
        return self.left + self.pw * (math.log10(x) - lo) / (hi - lo)

    def py(self, y: float) -> float:
        lo, hi = math.log10(self.y_lo), math.log10(self.y_hi)
        return self.top + self.ph - self.ph * (math.log10(y) - lo) / (hi - lo)

    def open(self, cls: str, title: str) -> list[str]:
        left, top, pw, ph = self.left, self.top, self.pw, self.ph
        parts = [f'<svg class="chart {cls}" viewBox="0 0 {self.width} {self.height}" '
                 f'width="{self.width}" height="{self.height}" role="img"><title>{title}</title>']
        for t in _log_ticks(self.y_lo, self.y_hi):
            parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{self.py(t):.1f}" '
                         f'y2="{self.py(t):.1f}" class="grid"/><text x="{left - 6}" '
                         f'y="{self.py(t) + 4:.1f}" class="yt">{_si(t)}</text>')
        for t in _log_ticks(self.x_lo, self.x_hi):
            parts.append(f'<line x1="{self.px(t):.1f}" x2="{self.px(t):.1f}" y1="{top}" '
                         f'y2="{top + ph}" class="grid"/><text x="{self.px(t):.1f}" '
                         f'y="{top + ph + 16}" class="xt">{_si(t)}</text>')
        parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
                     f'class="axis"/>')
        return parts

    def points(self, points: Sequence[dict[str, Any]], series: Sequence[str],
               x: str, y: str) -> list[str]:
        index = {name: i for i, name in enumerate(series)}
        parts = []
        for p in sorted(points, key=lambda p: p["best"]):  # best ones on top
            color = PALETTE[index.get(p["series"], 0) % len(PALETTE)]
            r, stroke = (6, ' stroke="#1d232a" stroke-width="1.5"') if p["best"] else (3.5, "")
            mark = (f'<circle class="pt" cx="{self.px(p[x]):.1f}" cy="{self.py(p[y]):.1f}" '
                    f'r="{r}" fill="{color}" fill-opacity="0.85"{stroke}><title>'
                    f'{escape(p["title"])}</title></circle>')
            if p.get("href"):
                mark = f'<a href="{escape(p["href"])}">{mark}</a>'
            parts.append(mark)
        return parts

    def close(self, series: Sequence[str], xlabel: str, ylabel: str) -> list[str]:
        left, top, pw, ph = self.left, self.top, self.pw, self.ph
        parts = [f'<text x="{left + pw / 2:.1f}" y="{self.height - 6}" class="al">{xlabel}'
                 f'</text>',
                 f'<text x="14" y="{top + ph / 2:.1f}" class="al" '
                 f'transform="rotate(-90 14 {top + ph / 2:.1f})">{ylabel}</text>']
        parts += _legend(list(series), left + pw + 14, top + 12)
        y = top + 12 + 16 * len(series) + 10
        parts.append(f'<circle cx="{left + pw + 19}" cy="{y - 4}" r="6" fill="#fff" '
                     f'stroke="#1d232a" stroke-width="1.5"/><text x="{left + pw + 28}" y="{y}" '
                     f'class="lg">best of task</text>')
        parts.append("</svg>")
        return parts


def svg_roofline(points: Sequence[dict[str, Any]], series: Sequence[str], *,
                 bandwidth_gbs: float | None, flops_tflops: float | None,
                 width: int = 680, height: int = 320) -> Markup:
    """Roofline scatter, log-log: arithmetic intensity (FLOP/byte) against attained GFLOP/s,
    under the device's roof min(peak, intensity x bandwidth) when its peaks are known.

    ``points``: dicts with ``ai``, ``gflops``, ``series`` (colour: index in ``series``),
    ``best`` (drawn large, outlined), ``title`` (hover text) and optional ``href``.
    """
    peak = flops_tflops * 1e3 if flops_tflops else None  # GFLOP/s
    bw = bandwidth_gbs if bandwidth_gbs else None  # GB/s = GFLOP/s per FLOP/byte
    xs = [p["ai"] for p in points]
    ys = [p["gflops"] for p in points]
    if peak and bw:
        xs.append(peak / bw)  # the ridge point
        ys.append(peak)
    f = _LogLog(xs, ys, width, height)
    parts = f.open("roofline", "roofline")
    if peak and bw:
        ridge = peak / bw
        x_start = max(f.x_lo, f.y_lo / bw)  # where the bandwidth roof enters the plot
        roof = [(x_start, x_start * bw), (ridge, peak), (f.x_hi, peak)]
        pts = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in roof)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="#1d232a" '
                     f'stroke-width="2"><title>roof: min({_si(peak)} GFLOP/s, '
                     f'intensity x {bw:.3g} GB/s)</title></polyline>')
        parts.append(f'<text x="{f.px(ridge) + 4:.1f}" y="{f.py(peak) - 5:.1f}" class="lg">'
                     f'peak {_si(peak)} GFLOP/s</text>')
        xm = math.sqrt(x_start * ridge)
        parts.append(f'<text x="{f.px(xm):.1f}" y="{f.py(xm * bw) - 6:.1f}" class="lg" '
                     f'text-anchor="end">{bw:.3g} GB/s</text>')
    parts += f.points(points, series, "ai", "gflops")
    parts += f.close(series, "arithmetic intensity (FLOP / byte, minimum traffic)",
                     "attained GFLOP/s")
    return Markup("".join(parts))


def svg_bandwidth(points: Sequence[dict[str, Any]], series: Sequence[str], *,
                  bandwidth_gbs: float | None, width: int = 680, height: int = 320) -> Markup:
    """The memory-bound kernels' roof, log-log: the task's minimum traffic (bytes) against the
    bandwidth the kernel attained moving it (GB/s), under the device's measured bandwidth when
    known. For tasks that count no FLOPs (copies, activations, pooling by comparison...), whose
    arithmetic intensity is 0 and so has no place on the roofline's log axis.

    ``points``: dicts with ``bytes``, ``gbs``, ``series``, ``best``, ``title``, ``href``.
    """
    bw = bandwidth_gbs if bandwidth_gbs else None
    xs = [p["bytes"] for p in points]
    ys = [p["gbs"] for p in points] + ([bw] if bw else [])
    f = _LogLog(xs, ys or [1.0], width, height)
    parts = f.open("bandwidth", "bandwidth roof")
    if bw:
        y = f.py(bw)
        parts.append(f'<line x1="{f.left}" x2="{f.left + f.pw}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="#1d232a" stroke-width="2"><title>roof: {bw:.3g} GB/s measured '
                     f'bandwidth</title></line>')
        parts.append(f'<text x="{f.left + f.pw - 4}" y="{y - 5:.1f}" class="lg" '
                     f'text-anchor="end">{bw:.3g} GB/s</text>')
    parts += f.points(points, series, "bytes", "gbs")
    parts += f.close(series, "minimum memory traffic (bytes)", "attained GB/s")
    return Markup("".join(parts))


def svg_lineage(nodes: Sequence[dict[str, Any]], edges: Sequence[tuple[str, str, str]], *,
                uid: str) -> Markup:
    """A lineage tree (a DAG: crossovers have two parents), generations left to right.

    ``nodes``: dicts with ``id``, ``generation``, ``lines`` (up to three text lines),
    ``status`` ("accepted", "rejected" or "unknown"), ``best`` (bool), ``title`` and optional
    ``href``; ``edges``: (parent id, child id, the child's operator). ``uid`` makes the
    arrowhead ids unique in the page.
    """
    box_w, box_h, col_w, row_h, pad = 156, 52, 214, 64, 14
    gens = sorted({n["generation"] for n in nodes})
    col = {g: i for i, g in enumerate(gens)}
    by_gen: dict[int, list[dict[str, Any]]] = {g: [] for g in gens}
    for n in nodes:
        by_gen[n["generation"]].append(n)
    children: dict[str, list[str]] = {}
    for parent, child, _ in edges:
        children.setdefault(parent, []).append(child)
    y_of: dict[str, float] = {}
    # right to left: a node sits near the children already placed
    for g in reversed(gens):
        column = by_gen[g]
        column.sort(key=lambda n: (sum(y_of.get(c, 0.0) for c in children.get(n["id"], []))
                                   / max(1, len(children.get(n["id"], []))), n["id"]))
        for i, n in enumerate(column):
            y_of[n["id"]] = float(i)
    rows = max((len(v) for v in by_gen.values()), default=1)
    legend_h = 22
    width = pad * 2 + col_w * (len(gens) - 1) + box_w
    height = pad * 2 + row_h * (rows - 1) + box_h + legend_h + 18
    width = max(width, 470)

    def pos(nid: str, gen: int) -> tuple[float, float]:
        n_col = len(by_gen[gen])
        offset = (rows - n_col) * row_h / 2
        return pad + col[gen] * col_w, pad + 16 + offset + y_of[nid] * row_h

    gen_of = {n["id"]: n["generation"] for n in nodes}
    parts = [f'<svg class="chart lineage" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img"><title>lineage</title><defs>']
    ops = sorted({op for _, _, op in edges})
    for op in ops:
        color = OPERATOR_COLORS.get(op, OTHER_OPERATOR)
        parts.append(f'<marker id="arr-{uid}-{escape(op)}" viewBox="0 0 10 10" refX="9" '
                     f'refY="5" markerWidth="7" markerHeight="7" orient="auto">'
                     f'<path d="M0,0 L10,5 L0,10 z" fill="{color}"/></marker>')
    parts.append("</defs>")
    for g in gens:
        x = pad + col[g] * col_w + box_w / 2
        parts.append(f'<text x="{x:.1f}" y="{pad + 4}" class="xt">generation {g}</text>')
    for parent, child, op in edges:
        if parent not in gen_of or child not in gen_of:
            continue
        x0, y0 = pos(parent, gen_of[parent])
        x1, y1 = pos(child, gen_of[child])
        x0, y0, x1, y1 = x0 + box_w, y0 + box_h / 2, x1 - 2, y1 + box_h / 2
        mx = (x0 + x1) / 2
        color = OPERATOR_COLORS.get(op, OTHER_OPERATOR)
        parts.append(f'<path d="M{x0:.1f},{y0:.1f} C{mx:.1f},{y0:.1f} {mx:.1f},{y1:.1f} '
                     f'{x1:.1f},{y1:.1f}" fill="none" stroke="{color}" stroke-width="2" '
                     f'marker-end="url(#arr-{uid}-{escape(op)})"><title>{escape(op)}: '
                     f'{escape(parent)} -&gt; {escape(child)}</title></path>')
    for n in nodes:
        x, y = pos(n["id"], n["generation"])
        cls = f'node {n["status"]}' + (" best" if n["best"] else "")
        box = [f'<g class="{cls}"><title>{escape(n["title"])}</title>'
               f'<rect x="{x:.1f}" y="{y:.1f}" width="{box_w}" height="{box_h}" rx="6"/>']
        for i, line in enumerate(n["lines"][:3]):
            box.append(f'<text x="{x + 8:.1f}" y="{y + 15 + 15 * i:.1f}" '
                       f'class="{"id" if i == 0 else "nl"}">{escape(line)}</text>')
        box.append("</g>")
        mark = "".join(box)
        if n.get("href"):
            mark = f'<a href="{escape(n["href"])}">{mark}</a>'
        parts.append(mark)
    y = height - 10
    x = pad
    for op in ops:
        color = OPERATOR_COLORS.get(op, OTHER_OPERATOR)
        parts.append(f'<line x1="{x}" x2="{x + 22}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" '
                     f'stroke-width="2"/><text x="{x + 27}" y="{y}" class="lg">{escape(op)}'
                     f'</text>')
        x += 40 + 7 * len(op)
    parts.append("</svg>")
    return Markup("".join(parts))
