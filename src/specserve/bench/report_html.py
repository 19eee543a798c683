"""A self-contained HTML page that shows where each output token came from.

    write_html("report.html", llm.tokenizer, out, "users_controller.py: rename")

Each token is coloured by its source (prediction / ngram / draft when it was an accepted draft
token, target for the recovered or bonus token each step adds). A gutter shows per-line
acceptance (the fraction of the line's tokens that came from a drafter), a timeline plots every
step (proposed vs committed tokens), and a table sums up the request's statistics. No scripts,
no external assets: the page opens anywhere and can be attached to a bug report.
"""

from __future__ import annotations

import difflib
import html
from pathlib import Path

from ..edit.files import write_atomic
from ..engine.detokenize import IncrementalDetokenizer
from ..engine.stats import RequestOutput

COLORS = {
    "prediction": "#b7ebc0",
    "prompt": "#d9f2b3",
    "ngram": "#bcd9ff",
    "draft": "#ddc8ff",
    "target": "#ffffff",
    "none": "#e6e6e6",
}
DRAFT_SOURCES = ("prediction", "prompt", "ngram", "draft")
LEGEND = {
    "prediction": "accepted from the prediction",
    "prompt": "accepted from the prompt's code",
    "ngram": "accepted from n-gram lookup",
    "draft": "accepted from the draft model",
    "target": "produced by the target (recovered / bonus)",
}

Segment = tuple[str, str]  # (text, source) of one token's piece on one line

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 12px}
h2{font-size:15px;margin:22px 0 8px}
table.stats{border-collapse:collapse;font-size:13px}
table.stats td{padding:2px 10px;border-bottom:1px solid #e3e3e3}
table.stats td:first-child{color:#555}
.legend span.sw{display:inline-block;width:14px;height:14px;border:1px solid #aaa;vertical-align:middle;
  margin:0 4px 0 12px}
.legend{font-size:13px}
svg.timeline{width:100%;height:140px;background:#fff;border:1px solid #ddd}
table.code{border-collapse:collapse;font:12px/1.45 ui-monospace,Menlo,Consolas,monospace;background:#fff;
  border:1px solid #ddd;width:100%}
table.code td{padding:0 6px;vertical-align:top}
td.ln{color:#999;text-align:right;user-select:none;width:1%}
td.acc{width:70px;user-select:none}
td.acc div.bar{height:9px;margin-top:4px;background:#4caf50;opacity:.75}
td.acc div.track{background:#eee;width:60px}
td.src{white-space:pre}
td.src span.tok{border-radius:2px}
"""


def token_segments(tokenizer, output: RequestOutput) -> list[tuple[str, str]]:
    """(text, source) per output token, decoded incrementally exactly as the engine streams it.

    A token that completes no character (part of a multi-byte character) gets "" and its text
    appears with the token that completes it. The pieces join to `output.text`: a matched stop
    string is generated but not returned, so its tokens show nothing either.
    """
    detok = IncrementalDetokenizer(tokenizer, output.prompt_token_ids)
    sources = output.token_sources or ["target"] * len(output.token_ids)
    pieces = [(detok.add(tok), src) for tok, src in zip(output.token_ids, sources)]
    if pieces:
        text, src = pieces[-1]
        pieces[-1] = (text + detok.flush(), src)
    left = len(output.text)
    for i, (text, src) in enumerate(pieces):
        pieces[i] = (text[:left], src)
        left -= len(pieces[i][0])
    return pieces


def split_lines(pieces: list[tuple[str, str]]) -> list[list[Segment]]:
    """Cut token pieces at newlines: one list of (text, source) segments per output line."""
    lines: list[list[Segment]] = [[]]
    for text, src in pieces:
        parts = text.split("\n")
        for i, part in enumerate(parts):
            if i:
                lines.append([])
            if part or i == 0:
                lines[-1].append((part, src))
    return lines


def line_acceptance(line: list[Segment]) -> float | None:
    """Fraction of the line's tokens (segments with text) that came from a drafter."""
    toks = [src for text, src in line if text]
    if not toks:
        return None
    return sum(src in DRAFT_SOURCES for src in toks) / len(toks)


def _code_table(lines: list[list[Segment]]) -> str:
    rows = []
    for n, line in enumerate(lines, 1):
        acc = line_acceptance(line)
        gauge = (
            ""
            if acc is None
            else (
                f'<div class="track" title="{acc:.0%} of tokens drafted">'
                f'<div class="bar" style="width:{acc * 100:.0f}%"></div></div>'
            )
        )
        spans = "".join(
            f'<span class="tok s-{src}" style="background:{COLORS.get(src, "#fff")}">{html.escape(text)}</span>'
            for text, src in line
            if text
        )
        rows.append(f'<tr><td class="ln">{n}</td><td class="acc">{gauge}</td><td class="src">{spans}</td></tr>')
    return '<table class="code">' + "".join(rows) + "</table>"


def _timeline_svg(steps: list[dict]) -> str:
    """One bar per step: outline = proposed + 1 (what the target verified), fill = committed."""
    if not steps:
        return '<p class="empty">no steps recorded</p>'
    top = max(max(s.get("proposed", 0) + 1, s.get("committed", 0)) for s in steps)
    width, height = max(len(steps), 1), 100.0
    bars = []
    for i, s in enumerate(steps):
        h_ver = height * (s.get("proposed", 0) + 1) / top
        h_com = height * s.get("committed", 0) / top
        color = COLORS.get(s.get("source", "none"), "#ccc")
        tip = (
            f"step {i + 1}: {s.get('source')} proposed {s.get('proposed')} accepted {s.get('accepted')} "
            f"committed {s.get('committed')} in {1000 * s.get('time', 0):.1f} ms"
        )
        bars.append(
            f"<g><title>{html.escape(tip)}</title>"
            f'<rect x="{i}" y="{height - h_ver:.2f}" width="0.9" height="{h_ver:.2f}" fill="#f2f2f2" '
            f'stroke="#bbb" stroke-width="0.02"/>'
            f'<rect x="{i}" y="{height - h_com:.2f}" width="0.9" height="{h_com:.2f}" fill="{color}" '
            f'stroke="#666" stroke-width="0.02"/></g>'
        )
    return (
        f'<svg class="timeline" viewBox="0 0 {width} {height}" preserveAspectRatio="none" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="step timeline">' + "".join(bars) + "</svg>"
        f'<p class="legend">{len(steps)} steps; bar height = tokens committed (fill) of tokens '
        f"verified (outline, proposed + 1), max {top}</p>"
    )


def _stats_table(summary: dict) -> str:
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items())
    return f'<table class="stats">{rows}</table>'


def _legend() -> str:
    return (
        '<p class="legend">'
        + "".join(f'<span class="sw" style="background:{COLORS[s]}"></span>{html.escape(LEGEND[s])}' for s in LEGEND)
        + "</p>"
    )


def page(title: str, lines: list[list[Segment]], summary: dict, steps: list[dict] | None) -> str:
    """Assemble the page from output lines, a summary dict and (optionally) the step timeline."""
    timeline = f"<h2>Step timeline</h2>{_timeline_svg(steps)}" if steps is not None else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
        f'<section id="summary"><h2>Summary</h2>{_stats_table(summary)}</section>'
        f'<section id="timeline">{timeline}</section>'
        f'<section id="output"><h2>Output</h2>{_legend()}{_code_table(lines)}</section>'
        "</body></html>\n"
    )


def summarize(output: RequestOutput) -> dict:
    """The headline numbers of one request, for the summary table."""
    s = output.stats
    d = {
        "finish reason": output.finish_reason,
        "output tokens": s.output_tokens,
        "steps": s.steps,
        "tokens per step": f"{s.tokens_per_step:.2f}",
        "acceptance rate": f"{s.acceptance_rate:.1%}",
        "proposed / accepted / rejected": f"{s.proposed} / {s.accepted} / {s.rejected}",
        "output tokens/s": f"{s.tokens_per_second:.2f}",
        "time to first token": "-" if s.time_to_first_token is None else f"{s.time_to_first_token:.3f} s",
        "total time": f"{s.total_time:.3f} s",
    }
    for name, src in s.by_source.items():
        if src.steps:
            d[f"{name}: steps / proposed / accepted"] = f"{src.steps} / {src.proposed} / {src.accepted}"
    return d


def render_html(tokenizer, output: RequestOutput, title: str, extra: dict | None = None) -> str:
    """The report page for one engine request (token sources and step timeline from the engine);
    `extra` rows join the summary (the benchmark's comparison with plain decoding)."""
    summary = summarize(output) | (extra or {})
    return page(title, split_lines(token_segments(tokenizer, output)), summary, output.steps)


def diff_lines(prediction: str, text: str) -> list[list[Segment]]:
    """Colour whole output lines when token sources are unknown (a server response): a line kept
    from the prediction counts as "prediction", an inserted or changed line as "target"."""
    old, new = prediction.splitlines(), text.splitlines()
    src = ["target"] * len(new)
    for block in difflib.SequenceMatcher(None, old, new, autojunk=False).get_matching_blocks():
        src[block.b : block.b + block.size] = ["prediction"] * block.size
    return [[(line, s)] for line, s in zip(new, src)] or [[]]


def render_diff_html(prediction: str, text: str, title: str, summary: dict) -> str:
    """The report page for an edit seen only through the API: per-line diff vs the prediction."""
    return page(title, diff_lines(prediction, text), summary, None)


def write_html(path: str | Path, tokenizer, output: RequestOutput, title: str, extra: dict | None = None) -> Path:
    """Render and write the report; returns the path written (used by generate, bench)."""
    path = Path(path)  # its folder was checked before the run: a typo makes no folders
    write_atomic(path, render_html(tokenizer, output, title, extra))  # whole or not at all: a full disk kept no report
    return path
