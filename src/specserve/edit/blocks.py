"""SEARCH/REPLACE blocks (aider's edit format): an answer that quotes lines of the file exactly and
says what replaces them, applied here to the original file.

    <<<<<<< SEARCH
    def area(radius):
    =======
    def circle_area(radius):
    >>>>>>> REPLACE

`specserve edit` can ask for blocks when the model's whole-file answer is refused (docs/server.md):
the file written is then the original with the blocks applied, complete by construction, so a
small model that shortens or elides a long file cannot lose its lines. The file is still judged
like any answer (`judge_answer`) before it is written.

The rule is never to guess. A block is applied where its SEARCH lines match the file exactly, line
for line; only when they match nowhere, where they match once with trailing whitespace ignored and
a uniform indentation shift (the model copied the lines one level out, say), re-indenting the
REPLACE lines by the same shift. A block that matches nowhere, matches more than once, has
nothing to search for, or has two divider lines (a Markdown heading's `=======` underline among
its lines: which one divides is a guess) refuses the whole answer (`BlockError`): half an edit is
not an edit.
Blocks apply in order, each to the file as the ones before it left it. Text outside the blocks
(fences, a file name, prose) is ignored.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_SEARCH = re.compile(r"^\s*<{5,9} ?SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9} ?REPLACE\s*$")


class BlockError(ValueError):
    """The answer's blocks cannot be applied without guessing; the message says why, in one line."""


@dataclass(frozen=True)
class Block:
    """One SEARCH/REPLACE block: the lines to find and the lines that replace them (no line ends)."""

    search: tuple[str, ...]
    replace: tuple[str, ...]


@dataclass(frozen=True)
class Applied:
    """The file with an answer's blocks applied, how many there were, and how many matched only
    with whitespace tolerated."""

    code: str
    blocks: int
    tolerant: int


def parse_blocks(answer: str) -> list[Block]:
    """The SEARCH/REPLACE blocks of `answer`, in order. Raises BlockError when it has none, or one
    is left open (a SEARCH without its divider or its REPLACE marker)."""
    blocks, state, search, replace = [], "", [], []
    for line in answer.splitlines():
        if state == "" and _SEARCH.match(line):
            state, search, replace = "search", [], []
        elif state == "search" and _DIVIDER.match(line):
            state = "replace"
        elif state == "replace" and _REPLACE.match(line):
            blocks.append(Block(tuple(search), tuple(replace)))
            state = ""
        elif state == "replace" and _DIVIDER.match(line):  # a heading's underline, say: which one divides?
            raise BlockError(
                f"block {len(blocks) + 1} has more than one divider line (=======): which divides is a guess"
            )
        elif state == "search":
            search.append(line)
        elif state == "replace":
            replace.append(line)
    if state:
        raise BlockError(f"block {len(blocks) + 1} is not closed (no {'divider' if state == 'search' else 'REPLACE'})")
    if not blocks:
        raise BlockError("the answer has no SEARCH/REPLACE block")
    return blocks


def apply_blocks(original: str, answer: str) -> Applied:
    """`original` with the blocks of `answer` applied in order (the module docstring's rules).
    Keeps the file's line ends ("\\r\\n" or "\\n") and whether it ends with one."""
    newline = "\r\n" if "\r\n" in original else "\n"
    lines = original.split(newline)
    blocks = parse_blocks(answer)
    tolerant = 0
    for n, block in enumerate(blocks, 1):
        if not any(s.strip() for s in block.search):
            raise BlockError(f"block {n} has nothing to search for")
        lines, shifted = _apply_one(lines, block, n)
        tolerant += shifted
    return Applied(newline.join(lines), len(blocks), tolerant)


def _apply_one(lines: list[str], block: Block, n: int) -> tuple[list[str], bool]:
    """`lines` with one block applied, and whether it took the whitespace-tolerant match."""
    size = len(block.search)
    exact = [i for i in range(len(lines) - size + 1) if tuple(lines[i : i + size]) == block.search]
    if len(exact) == 1:
        i = exact[0]
        return lines[:i] + list(block.replace) + lines[i + size :], False
    if len(exact) > 1:
        raise BlockError(f"block {n} matches {len(exact)} places in the file: {_first(block)!r}")
    loose = [(i, shift) for i in range(len(lines) - size + 1) if (shift := _shift(lines[i : i + size], block.search))]
    if not loose:
        raise BlockError(f"block {n} matches nothing in the file: {_first(block)!r}")
    if len(loose) > 1:
        raise BlockError(f"block {n} matches {len(loose)} places in the file: {_first(block)!r}")
    i, (theirs, ours) = loose[0]
    return lines[:i] + _reindent(block.replace, theirs, ours, n) + lines[i + size :], True


def _shift(window: list[str], search: tuple[str, ...]) -> tuple[str, str] | None:
    """(the search's common indentation, the window's) when the two are the same lines but for
    trailing whitespace and that one indentation shift, blank lines matching blank lines; else None."""
    theirs, ours = _indent(search), _indent(window)
    for got, want in zip(window, search):
        if not got.strip() and not want.strip():
            continue
        if got.rstrip()[len(ours) :] != want.rstrip()[len(theirs) :] or not got.strip() or not want.strip():
            return None
    return theirs, ours


def _indent(lines) -> str:
    """The leading whitespace that every non-blank line of `lines` starts with."""
    leads = [ln[: len(ln) - len(ln.lstrip())] for ln in lines if ln.strip()]
    return os.path.commonprefix(leads) if leads else ""


def _reindent(replace: tuple[str, ...], theirs: str, ours: str, n: int) -> list[str]:
    """REPLACE lines moved from the search's indentation (`theirs`) to the file's (`ours`). A line
    indented less than the search cannot be moved without guessing: BlockError."""
    out = []
    for line in replace:
        if not line.strip():
            out.append("")
        elif line.startswith(theirs):
            out.append(ours + line[len(theirs) :].rstrip())
        else:
            raise BlockError(f"block {n} matched only re-indented, and its replacement is indented less: {line!r}")
    return out


def _first(block: Block) -> str:
    """The block's first non-blank SEARCH line, stripped, for a one-line refusal."""
    line = next(s for s in block.search if s.strip()).strip()
    return line if len(line) <= 60 else line[:57] + "..."
