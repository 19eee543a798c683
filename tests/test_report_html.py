"""The HTML token-source report: structure always; a real browser render when Chromium is installed."""

from __future__ import annotations

import html as htmllib
import re
import shutil
import subprocess
import warnings
from html.parser import HTMLParser

import pytest
from tiny import tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.bench.report_html import (
    diff_lines,
    line_acceptance,
    render_diff_html,
    render_html,
    split_lines,
    token_segments,
    write_html,
)

PREDICTION = "def add(a, b):\n    return a + b\n\n\nclass UserController:\n    def get_user(self, user_id):\n"


@pytest.fixture(scope="module")
def output():
    """A real engine output mixing sources: prediction + n-gram + draft model (auto)."""
    from specserve.llm import LLM

    llm = LLM.from_models(tiny_model(), tiny_tokenizer(), tiny_model(seed=1))
    prompt = llm.apply_chat_template([{"role": "user", "content": "Repeat: " + PREDICTION}])
    out = llm.generate(prompt, SamplingParams(max_tokens=60), prediction=PREDICTION, speculation="auto")
    assert len(set(out.token_sources)) >= 2  # the page has more than one colour to show
    return out


class Structure(HTMLParser):
    """Counts the elements the report promises and checks tags are balanced."""

    VOID = {"meta", "br", "rect"}

    def __init__(self):
        super().__init__()
        self.stack, self.count, self.classes = [], {}, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.count[tag] = self.count.get(tag, 0) + 1
        self.classes.append((tag, a.get("class", "")))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.count[tag] = self.count.get(tag, 0) + 1
        self.classes.append((tag, dict(attrs).get("class", "")))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()


def parse(page: str) -> Structure:
    p = Structure()
    p.feed(page)
    p.close()
    assert p.stack == []
    return p


def test_segments_rebuild_the_text(output):
    pieces = token_segments(tiny_tokenizer(), output)
    assert len(pieces) == len(output.token_ids)
    assert "".join(t for t, _ in pieces) == output.text
    assert [s for _, s in pieces] == output.token_sources


def test_page_structure(output):
    page = render_html(tiny_tokenizer(), output, "tiny <report>")
    assert page.startswith("<!doctype html>") and "<title>tiny &lt;report&gt;</title>" in page
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    p = parse(page)
    lines = split_lines(token_segments(tiny_tokenizer(), output))
    code_rows = page.count('<tr><td class="ln">')
    assert code_rows == len(lines) == output.text.count("\n") + 1
    tokens = [c for t, c in p.classes if t == "span" and c.startswith("tok ")]
    assert len(tokens) == sum(1 for line in lines for text, _ in line if text)
    for src in set(output.token_sources):
        assert f"s-{src}" in page
    assert p.count["rect"] == 2 * len(output.steps)  # verified + committed bar per step
    assert f"{output.stats.steps} steps" in page
    rows = re.findall(r'<td class="src">(.*?)</td></tr>', page)  # the output, one table row per line
    assert "\n".join(htmllib.unescape(re.sub(r"<[^>]+>", "", r)) for r in rows) == output.text


def test_line_acceptance():
    assert line_acceptance([("a", "prediction"), ("b", "target")]) == 0.5
    assert line_acceptance([("", "target")]) is None
    assert line_acceptance([("x", "draft"), ("y", "ngram")]) == 1.0


def test_diff_report_for_edit():
    new = PREDICTION.replace("def add(a, b):", "def add(a: int, b: int) -> int:") + "    pass\n"
    lines = diff_lines(PREDICTION, new)
    assert [src for ((_, src),) in lines][:3] == ["target", "prediction", "prediction"]
    assert lines[-1] == [("    pass", "target")]
    page = render_diff_html(PREDICTION, new, "edit", {"accepted prediction tokens": 12})
    parse(page)
    assert "s-prediction" in page and "s-target" in page and "timeline" in page


def test_browser_screenshot(output, tmp_path):
    """Render in headless Chromium when it is installed; without it, say so (a warning, not a skip)."""
    path = write_html(tmp_path / "report.html", tiny_tokenizer(), output, "specserve report")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        warnings.warn("chromium not installed: the browser render of the HTML report was not checked")
        return
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1100,900", path.as_uri()],
                   check=True, capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
