"""Benchmarks and their reports.

runner.py       refactor scenarios x speculation modes x peers on the same weights
load.py         `bench --concurrency`: many requests at once, in-process and through the server
session.py      `bench --session`: a scripted multi-turn coding session, as an agent runs it
peers.py        llama-cpp-python and transformers generate() on the same weights
replay.py       what the prediction drafter would accept, without a model
replay_check.py a bench report's prediction runs replayed: projected beside measured speedups
curves.py       cost curves: the defaults replay assumes, and their text form
report_html.py  the token-source HTML report
samples/        the scenario files
"""

from __future__ import annotations

import importlib.util

from ..errors import SpecServeError

BENCH_EXTRA = "pip install 'specserve[bench]'"  # matplotlib (charts) and httpx (--load-via server)


def require(*modules: str) -> None:
    """Refuse at once, naming the install command, when a module of the `bench` extra is missing:
    before a benchmark runs for minutes, not when it writes its chart."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise SpecServeError(
            f"specserve bench needs {' and '.join(missing)}, which a server install leaves out; "
            f"install them with: {BENCH_EXTRA}"
        )


def pyplot():
    """matplotlib.pyplot drawing to files only (the Agg backend), or the error of `require`."""
    require("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
