"""`specserve bench --session`: a scripted multi-turn coding session, as a chat client or agent runs it.

Four turns over one sample controller; every turn is a chat request whose messages carry the whole
conversation so far (each earlier answer re-sent as the assistant's message), as clients do:

  1. question  the file in a fenced block + "what does <function> do?"
  2. edit      an edit instruction (scenarios.json), prediction = the file; the whole updated file back
  3. edit      a follow-up edit, prediction = the code of turn 2's answer
  4. question  a question about the result

The same session runs three times, greedy (temperature 0), each conversation built from its own answers:

  cache on    our engine with the automatic prefix cache (the default)
  cache off   our engine with `EngineLimits.prefix_caching=False` (`--no-prefix-cache`): every turn
              prefills its whole prompt
  peer        llama-cpp-python's high-level `Llama` on the same GGUF (llama.cpp backend only), plain
              greedy decoding (it takes no prediction); it keeps the KV of its previous prompt and
              output and evaluates only what follows the longest common prefix (never reset between turns)

Per turn: time to first token, turn time, prompt tokens, cached tokens (ours: `cached_tokens` as the
API reports it; the peer: the prefix `Llama.generate` keeps, read from its state before the call),
completion tokens; and the session's totals. `reusable_tokens` is what a cache could reuse: the
longest common prefix of the prompt with an earlier turn's prompt + output (where the chat template
re-renders an answer with other tokens than were generated, it ends there), less the last prompt
token (whose logits must be computed). A cache holds one token less when the prefix runs to the end
of the earlier output: the last output token is sampled and fed back only if a draft pass verified
it (ours, speculating, sometimes does; the peer never).
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from tqdm import tqdm

from ..config import SamplingParams
from ..engine.prefix_cache import common_prefix
from ..errors import InvalidRequestError
from . import pyplot
from .peers import peer_skip_reason, run_session_turn, session_llama
from .runner import _Clock, cell, load_scenarios, save_report

SYSTEM = (
    "You are a coding assistant. Answer questions about code briefly. When asked to change a file, reply "
    "with the complete updated file in one fenced code block and nothing else."
)
QUESTION_TOKENS = 192  # a question's answer is capped here too (min with --max-tokens): the edits carry the session
EDIT_TAIL = "Reply with the complete updated file in one ```{lang} code block, and nothing else."
RUNS = ("cache on", "cache off", "llama-cpp-python")


@dataclass(frozen=True)
class SessionScript:
    """One scripted session: a sample file, the function turn 1 asks about, two edit scenarios
    (names in scenarios.json) and the closing question."""

    name: str
    file: str
    lang: str
    function: str
    edits: tuple[str, str]
    question: str


SCRIPTS = {
    "users": SessionScript(
        "users",
        "users_controller.py",
        "python",
        "create_user",
        ("py-rename", "py-route"),
        "Which routes in the file now require an admin? List them briefly.",
    ),
    "orders": SessionScript(
        "orders",
        "orders_controller.ts",
        "typescript",
        "canAccess",
        ("ts-rename", "ts-route"),
        "Which routes in the file now answer 409, and when? List them briefly.",
    ),
}


@dataclass
class SessionOptions:
    script: str = "users"
    max_tokens: int = 6144  # per turn; questions at most QUESTION_TOKENS
    max_prompt_tokens: int | None = None  # cut the file so turn 1's prompt stays under this
    peer: bool = True

    def cap(self, kind: str) -> int:
        return min(self.max_tokens, QUESTION_TOKENS) if kind == "question" else self.max_tokens


@dataclass
class Turn:
    turn: int
    kind: str  # "question" | "edit"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    reusable_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    ttft: float | None = None
    latency: float = 0.0
    accepted_draft_tokens: int | None = None  # ours: draft tokens accepted (the prediction's, on edit turns)
    same_as_cache_on: bool | None = None  # output token ids equal to the cache-on run's for this turn
    text: str = ""
    token_ids: list[int] = field(default_factory=list)


@dataclass
class SessionRun:
    name: str  # one of RUNS
    engine: str  # "specserve" | "llama-cpp-python"
    prefix_cache: bool | None = None
    skipped: str | None = None
    turns: list[Turn] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(t.latency for t in self.turns)

    def totals(self) -> dict:
        return {
            "time": round(self.total, 4),
            "ttft": round(sum(t.ttft or 0.0 for t in self.turns), 4),
            "prompt_tokens": sum(t.prompt_tokens for t in self.turns),
            "cached_tokens": sum(t.cached_tokens for t in self.turns),
            "completion_tokens": sum(t.completion_tokens for t in self.turns),
        }


# --------------------------------------------------------------------------- the script


def script(name: str) -> SessionScript:
    if name not in SCRIPTS:
        raise InvalidRequestError(f"unknown session {name!r}; choose from {', '.join(SCRIPTS)}")
    return SCRIPTS[name]


def sample_file(s: SessionScript) -> str:
    return (resources.files("specserve.bench") / "samples" / s.file).read_text(encoding="utf-8")


def first_message(s: SessionScript, code: str) -> str:
    return f"Here is `{s.file}`:\n\n```{s.lang}\n{code}\n```\n\nWhat does `{s.function}` do? Answer in a few sentences."


def turn_plan(s: SessionScript) -> list[tuple[str, str | None]]:
    """(kind, user message; None: turn 1's, which holds the file) for the four turns."""
    _, scenarios = load_scenarios(s.edits)
    tail = EDIT_TAIL.format(lang=s.lang)
    edits = [("edit", f"{sc.instruction}\n\n{tail}") for sc in scenarios]
    return [("question", None), *edits, ("question", s.question)]


def fit_file(llm, s: SessionScript, code: str, limit: int | None) -> str:
    """The file cut at a line boundary so that turn 1's prompt stays within `limit` tokens."""
    if not limit:
        return code
    lines = code.splitlines(True)

    def prompt(n: int) -> list[int]:
        """Turn 1's prompt with the file's first n lines."""
        head = first_message(s, "".join(lines[:n]))
        return llm.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": head}])

    lo, hi = 0, len(lines)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(prompt(mid)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        raise InvalidRequestError(f"--max-prompt-tokens {limit} leaves no line of {s.file} in the first prompt")
    return "".join(lines[:lo])


_BLOCK = re.compile(r"```[^\n`]*\n(?P<body>.*?)(?:\n[ \t]*```|\Z)", re.S)


def code_of(answer: str) -> str:
    """The code of an edit answer: its first fenced block (an unclosed fence runs to the end, as a
    capped answer leaves it), else the whole answer; the next edit's prediction."""
    m = _BLOCK.search(answer)
    body = m.group("body") if m else answer
    return body if body.endswith("\n") else body + "\n"


# --------------------------------------------------------------------------- runs


def _answer_text(llm, ids: list[int]) -> str:
    """What a client re-sends as the assistant's message: the answer without its end token."""
    eos = llm.engine.eos_token_ids
    return llm.tokenizer.decode([t for t in ids if t not in eos], skip_special_tokens=True)


def _reusable(prompt: list[int], earlier: list[list[int]]) -> int:
    """Prompt tokens shared with an earlier turn's prompt + output (the last prompt token excluded)."""
    return max((common_prefix(e, prompt, len(prompt) - 1) for e in earlier), default=0)


def run_session(llm, opts: SessionOptions, run_name: str, code: str, on_turn=None) -> SessionRun:
    """One pass of the script: ours (on `llm`, whose prefix cache setting it records) or the peer.
    on_turn(run): called after each turn (the results are written then)."""
    s = script(opts.script)
    peer = None
    if run_name == RUNS[2]:
        run = SessionRun(run_name, "llama-cpp-python")
        peer = session_llama(llm)
        peer.reset()  # the session starts cold (the warm-up's prompt shares the template's start)
    else:
        run = SessionRun(run_name, "specserve", prefix_cache=llm.engine.core.prefix is not None)
        llm.engine.clear_prefix_cache()  # the session starts cold
    messages = [{"role": "system", "content": SYSTEM}]
    current = code
    earlier: list[list[int]] = []
    for k, (kind, user) in enumerate(turn_plan(s), start=1):
        messages.append({"role": "user", "content": first_message(s, code) if user is None else user})
        ids = llm.apply_chat_template(messages)
        cap = opts.cap(kind)
        if len(ids) + cap > llm.max_context:  # the last token written is never fed back: an exact fit runs
            raise InvalidRequestError(
                f"session turn {k}: the prompt ({len(ids)} tokens) + max_tokens {cap} do not fit the "
                f"context ({llm.max_context}); raise --max-context or lower --max-tokens / --max-prompt-tokens"
            )
        prediction = current if kind == "edit" else None
        turn = Turn(k, kind, prompt_tokens=len(ids), reusable_tokens=_reusable(ids, earlier))
        desc = f"  {run_name} turn {k}"
        with tqdm(total=cap, desc=desc, unit="tok", leave=False, file=sys.stderr, disable=None) as bar:
            clock = _Clock(bar)
            if peer is not None:
                out_ids, turn.cached_tokens = run_session_turn(peer, ids, cap, llm.engine.eos_token_ids, clock)
            else:
                params = SamplingParams(max_tokens=cap, temperature=0.0)
                gen = llm.stream(ids, params, prediction=prediction)
                for event in gen:
                    clock.emitted(len(event.token_ids))
                clock.stop()
                out = gen.output
                out_ids, turn.cached_tokens = list(out.token_ids), out.cached_tokens
                turn.accepted_draft_tokens = out.stats.accepted
        eos = llm.engine.eos_token_ids
        turn.completion_tokens = len(out_ids)
        turn.finish_reason = "stop" if out_ids and out_ids[-1] in eos else "length"
        turn.ttft, turn.latency = clock.first, clock.latency
        turn.token_ids = out_ids
        turn.text = _answer_text(llm, out_ids)
        run.turns.append(turn)
        earlier.append(ids + out_ids)
        messages.append({"role": "assistant", "content": turn.text})
        if kind == "edit":
            current = code_of(turn.text)
        if on_turn is not None:
            on_turn(run)
    return run


def compare_runs(runs: list[SessionRun]) -> None:
    """Mark each turn of the other runs with whether its output equals the cache-on run's."""
    ref = next((r for r in runs if r.name == RUNS[0] and not r.skipped), None)
    if ref is None:
        return
    for r in runs:
        if r is ref or r.skipped:
            continue
        diverged = False
        for t, rt in zip(r.turns, ref.turns):
            # after a difference the conversations differ: later turns are not comparable
            t.same_as_cache_on = None if diverged else t.token_ids == rt.token_ids
            diverged = diverged or not t.same_as_cache_on


def warm_up(llm, peer: bool) -> None:
    """Pay one-time costs (kernels, allocator) before anything is timed."""
    ids = llm.apply_chat_template([{"role": "user", "content": "Say hi."}])
    for _ in llm.stream(ids, SamplingParams(max_tokens=4, temperature=0.0)):
        pass
    llm.engine.clear_prefix_cache()
    if peer:
        with tqdm(disable=True) as bar:
            run_session_turn(session_llama(llm), ids, 4, llm.engine.eos_token_ids, _Clock(bar))


# --------------------------------------------------------------------------- outputs


def _same(v: bool | None) -> str:
    return "–" if v is None else ("yes" if v else "DIFFERS")


def markdown(runs: list[SessionRun], env: dict) -> str:
    s = script(env["session"])
    head = (
        f"# specserve bench --session\n\n`{s.file}` ({env['file_lines']} lines), target `{env['model']}`, "
        f"draft `{env['draft_model']}` on the **{env['backend']}** backend ({env['dtype']}"
        + (", exact: batch-invariant kernels" if env.get("batch_invariant") else "")
        + f", {env['device']}, {env['threads']} threads); CPU {env.get('cpu', '?')}; max_tokens {env['max_tokens']} "
        f"(questions {min(env['max_tokens'], QUESTION_TOKENS)}), greedy; {env['date']}\n\n"
        "Turns: 1 question on the file, 2 edit (prediction = the file), 3 follow-up edit (prediction = turn 2's "
        "code), 4 question; each re-sends the whole conversation.\n\n"
        "| run | turn | kind | prompt tok | cached tok | reusable tok | out tok | finish | TTFT s | turn s "
        "| same as cache on |\n|---|---:|---|---:|---:|---:|---:|---|---:|---:|---|\n"
    )
    rows = []
    for r in runs:
        if r.skipped:
            rows.append(f"| {r.name} | | skipped: {r.skipped} |||||||||\n")
            continue
        for t in r.turns:
            rows.append(
                f"| {r.name} | {t.turn} | {t.kind} | {t.prompt_tokens} | {t.cached_tokens} | {t.reusable_tokens} | "
                f"{t.completion_tokens} | {t.finish_reason} | {cell(t.ttft)} | {t.latency:.2f} | "
                f"{_same(t.same_as_cache_on)} |\n"
            )
    rows.append("\n| run | session s | sum of TTFT s | prompt tok | cached tok | out tok | vs cache on |\n")
    rows.append("|---|---:|---:|---:|---:|---:|---:|\n")
    ref = next((r for r in runs if r.name == RUNS[0] and not r.skipped), None)
    for r in runs:
        if r.skipped:
            continue
        tot = r.totals()
        ratio = f"{r.total / ref.total:.2f}x" if ref is not None and ref.total > 0 else "–"
        rows.append(
            f"| {r.name} | {tot['time']:.2f} | {tot['ttft']:.2f} | {tot['prompt_tokens']} | "
            f"{tot['cached_tokens']} | {tot['completion_tokens']} | {ratio} |\n"
        )
    return head + "".join(rows)


def write_chart(runs: list[SessionRun], path: Path) -> Path:
    """Per-turn grouped bars for the runs: time to first token (top, log scale) and turn time (bottom)."""
    plt = pyplot()
    done = [r for r in runs if not r.skipped]
    turns = max((len(r.turns) for r in done), default=0)
    fig, axes = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    width = 0.8 / max(len(done), 1)
    for j, r in enumerate(done):
        xs = [t.turn + (j - (len(done) - 1) / 2) * width for t in r.turns]
        hatch = "//" if r.engine != "specserve" else None
        axes[0].bar(xs, [max(t.ttft or 0.0, 1e-3) for t in r.turns], width, label=r.name, hatch=hatch)
        axes[1].bar(xs, [t.latency for t in r.turns], width, label=f"{r.name} ({r.total:.1f} s)", hatch=hatch)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("time to first token (s, log)")
    axes[1].set_ylabel("turn time (s)")
    kinds = {t.turn: t.kind for r in done for t in r.turns}
    axes[1].set_xticks(range(1, turns + 1), [f"turn {k}\n{kinds.get(k, '')}" for k in range(1, turns + 1)])
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8, title="session total")
    axes[0].set_title("specserve bench --session (hatched: peer)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_results(runs: list[SessionRun], env: dict, out: Path, chart: bool = True) -> dict[str, Path]:
    """session.json (each run with its totals), session.md and (with `chart`) session.png in `out`."""
    draw = (lambda p: write_chart(runs, p)) if chart else None
    return save_report(
        out, "session", env, "runs", runs, markdown(runs, env), draw, lambda r: asdict(r) | {"totals": r.totals()}
    )


def bench_session(make_llm, opts: SessionOptions, out: Path, environment) -> tuple[list[SessionRun], dict, dict]:
    """The three runs, in order: cache on, cache off, the peer. make_llm(prefix_caching) loads our
    LLM; the cache-on one is closed before the cache-off one loads (one of our models in memory at a
    time), which then names the peer's GGUF. The results are written after each turn.
    environment(llm) -> the environment dict. Returns (runs, env, paths)."""
    s = script(opts.script)
    llm = make_llm(True)
    code = fit_file(llm, s, sample_file(s), opts.max_prompt_tokens)
    reason = peer_skip_reason(llm, "llama.cpp") if opts.peer else "not asked for (--peers none)"
    env = environment(llm) | {
        "session": s.name,
        "file": s.file,
        "file_lines": len(code.splitlines()),
        "trimmed_lines": len(sample_file(s).splitlines()) - len(code.splitlines()),
        "speculation": str(llm.speculation.method),
        "question_tokens": opts.cap("question"),
    }
    runs: list[SessionRun] = []
    paths: dict[str, Path] = {}

    def one(name: str) -> None:
        def partial(run: SessionRun) -> None:  # a long session interrupted later still leaves its turns
            paths.update(_checkpoint(runs + [run], env, out, chart=False))  # a chart costs ~1 s: once, at the end

        runs.append(run_session(llm, opts, name, code, partial))

    warm_up(llm, False)
    one(RUNS[0])
    _close(llm)
    del llm
    llm = make_llm(False)
    warm_up(llm, reason is None)
    one(RUNS[1])
    if reason is None:
        one(RUNS[2])
    else:
        runs.append(SessionRun(RUNS[2], "llama-cpp-python", skipped=reason))
    _close(llm)
    paths.update(_checkpoint(runs, env, out))
    return runs, env, paths


def _checkpoint(runs: list[SessionRun], env: dict, out: Path, chart: bool = True) -> dict[str, Path]:
    """Write the runs (and turns) done so far."""
    compare_runs(runs)
    return write_results(runs, env, out, chart)


def _close(llm) -> None:
    """Free the model and its KV cells now (the next load must not hold two models at once)."""
    llm.engine.clear_prefix_cache()
    for backend in (llm.draft_backend, llm.target_backend):
        if backend is not None and hasattr(backend, "close") and backend.name == "llama.cpp":
            backend.close()
