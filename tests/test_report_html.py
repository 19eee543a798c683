"""The HTML token-source report: its structure, and a real render in headless Chromium (which CI installs)."""

from __future__ import annotations

import html as htmllib
import os
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser

import numpy as np
import pytest
from tiny import tiny_model, tiny_tokenizer

from specserve import SamplingParams
from specserve.bench.report_html import (
    COLORS,
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


def test_a_stop_string_is_not_shown():
    """The stop string's tokens are generated but its text is not returned: the report shows the
    text the user got, not the stop string after it."""
    from specserve.llm import LLM

    llm = LLM.from_models(tiny_model(), tiny_tokenizer())
    prompt = tiny_tokenizer().encode("Repeat: " + PREDICTION)
    full = llm.generate(prompt, SamplingParams(max_tokens=40), prediction=PREDICTION, speculation="none")
    stop = full.text[10:14]
    out = llm.generate(prompt, SamplingParams(max_tokens=40, stop=(stop,)), prediction=PREDICTION)
    assert out.finish_reason == "stop" and not out.text.endswith(stop) and stop not in out.text
    assert "".join(t for t, _ in token_segments(tiny_tokenizer(), out)) == out.text


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


def read_png(data: bytes) -> np.ndarray:
    """Decode a non-interlaced 8-bit RGB or RGBA PNG (what Chromium writes) into [H, W, 3] uint8."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data[pos + 8 : pos + 8 + length])
        elif kind == b"IDAT":
            idat.append(data[pos + 8 : pos + 8 + length])
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and not interlace, header
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1)
        if kind == 0:  # None
            cur = line
        elif kind == 1:  # Sub: a running sum per channel
            cur = (np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint32) & 255).astype(np.uint8).reshape(-1)
        elif kind == 2:  # Up
            cur = line + prev  # uint8 arithmetic wraps mod 256
        else:  # Average, Paeth: byte by byte (each depends on the one to its left)
            cur, up = bytearray(line.tobytes()), prev.tobytes()
            for x in range(stride):
                a = cur[x - bpp] if x >= bpp else 0
                b = up[x]
                if kind == 3:
                    cur[x] = (cur[x] + ((a + b) >> 1)) & 255
                else:
                    c = up[x - bpp] if x >= bpp else 0
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.frombuffer(bytes(cur), np.uint8)
        out[y] = prev = cur
    return out.reshape(height, width, bpp)[:, :, :3]


def colour_pixels(shot: np.ndarray, colour: str) -> int:
    """Pixels of the screenshot painted exactly `colour` ("#rrggbb")."""
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.uint8)
    return int((shot == rgb).all(axis=-1).sum())


def screenshot(chromium: str, path) -> np.ndarray:
    """Chromium's render of the page at `path`, [SHOT_HEIGHT, SHOT_WIDTH, 3]."""
    shot = path.with_suffix(".png")
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            f"--window-size={SHOT_WIDTH},{SHOT_HEIGHT}",
            path.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return read_png(shot.read_bytes())


SHOT_WIDTH, SHOT_HEIGHT = 1100, 900  # the whole page of the 60-token report fits, but for long lines
VISIBLE_CHARS = 100  # of a line: at 7.2 px a character after about 130 px of margin and columns
TOKEN_BACKGROUND = re.compile(r'(<span class="tok s-[a-z]+") style="background:#[0-9a-f]{6}"')


def render_check(shot: np.ndarray, bare: np.ndarray, output) -> list[str]:
    """What is wrong with Chromium's render `shot` of a report page. Token backgrounds are told
    apart from the legend's swatches and the timeline's bars (same colours) by `bare`, the render
    of the page with the token spans' backgrounds taken out."""
    wrong = []
    if shot.shape != (SHOT_HEIGHT, SHOT_WIDTH, 3) or len(np.unique(shot.reshape(-1, 3), axis=0)) < 20:
        wrong.append(f"a blank or cut render: {shot.shape}")
    visible = [visible_sources(line) for line in split_lines(token_segments(tiny_tokenizer(), output))]
    for src in sorted(set(output.token_sources) - {"target"}):
        chars = sum(line.count(src) for line in visible)
        painted = colour_pixels(shot, COLORS[src]) - colour_pixels(bare, COLORS[src])
        if painted < 30 * chars or not chars:  # a 12px monospace cell is about 7 x 17 pixels, some the glyph's
            wrong.append(f"{src}: {painted} pixels of {COLORS[src]} behind {chars} characters")
    return wrong


def visible_sources(line) -> list[str]:
    """The source of each of the first VISIBLE_CHARS characters of an output line (lines are not
    wrapped: the rest may lie right of the window)."""
    return [src for text, src in line for _ in text][:VISIBLE_CHARS]


def test_browser_render(output, tmp_path):
    """Headless Chromium renders the page: not blank, and every draft source's tokens painted in
    its colour. CI installs Debian's chromium (`make browser`); without it this test fails,
    unless SPECSERVE_NO_BROWSER=1 says to skip it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("SPECSERVE_NO_BROWSER") == "1":
            pytest.skip("SPECSERVE_NO_BROWSER=1: the browser render of the HTML report is not checked")
        pytest.fail(
            "chromium is not installed: `make browser` (as root) or `apt-get install chromium` "
            "installs it; SPECSERVE_NO_BROWSER=1 skips this test"
        )
    path = write_html(tmp_path / "report.html", tiny_tokenizer(), output, "specserve report")
    page = path.read_text(encoding="utf-8")
    (tmp_path / "bare.html").write_text(TOKEN_BACKGROUND.sub(r"\1", page), encoding="utf-8")
    (tmp_path / "broken.html").write_text(page.replace("<style>", "<style>span.tok{display:none}"), encoding="utf-8")
    shot, bare, broken = (screenshot(chromium, tmp_path / f"{name}.html") for name in ("report", "bare", "broken"))
    assert render_check(shot, bare, output) == []
    assert render_check(broken, bare, output)  # a page that hides its tokens: the check must see it
