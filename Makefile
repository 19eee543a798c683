# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Each creates the local virtualenv (.venv) it needs; models come from the offline packs.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Packs pulled by the tests live in the repo, so one CI run pulls SmolLM2 only once.
TEST_HOME := $(CURDIR)/.cache/specserve

.PHONY: venv browser test test-ray test-all lint demo bench-quick bench-load clean

venv: $(STAMP)

$(STAMP): pyproject.toml scripts/install_llama_cpp.sh scripts/llama_cpp_switch.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU wheel on this disk; any other torch release would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	# llama.cpp, compiled here once per machine with the flags our exactness needs (about 5 min).
	scripts/install_llama_cpp.sh $(BIN)/python
	# test: pytest and what the tests import (the bench extra included); dev: ruff; clients: agent SDKs.
	$(BIN)/pip install --quiet -e '.[test,dev,clients]'
	$(BIN)/pip check
	touch $(STAMP)

# Debian's chromium, for the HTML report's render test (tests/test_report_html.py fails without it):
# installed when missing and we are root (CI; about 50 s), otherwise say how.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium (the HTML report's render test)" >&2; mkdir -p .cache; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium; } >.cache/apt-chromium.log 2>&1 || { cat .cache/apt-chromium.log >&2; exit 1; }; \
	else echo "chromium is missing: install it (apt-get install chromium) or the HTML report's render test fails" >&2; fi

# Test files run on TEST_WORKERS processes (pytest-xdist), each file whole on one worker: the
# tests run torch on one thread, so two workers use both cores of a 2-core machine, and a file's
# module fixtures (servers, loaded models) start once.
# --durations=15 lists the slowest tests at the end, to see where the minutes go.
TEST_WORKERS ?= 2
# Only the pytest plugins the suite uses. Every installed one (langsmith's, from the clients
# extra; schemathesis' and hypothesis', which the suite imports as libraries) would otherwise be
# loaded in each worker, and pytest would rewrite the asserts of their ~500 modules there: about
# 10 s per worker with PYTHONDONTWRITEBYTECODE set, as it is on CI machines.
PYTEST = SPECSERVE_HOME=$(TEST_HOME) PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -p xdist.plugin

test: venv browser
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadfile --durations=15

test-ray: venv  # the Ray Serve replica tests (CI runs them; installs specserve[ray])
	$(BIN)/pip install --quiet -e '.[test,ray]'
	$(PYTEST) -q -m ray

lint: venv  # ruff's rules and its formatter, configured in pyproject.toml
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test-all: venv  # also the slow tests, on the Qwen packs in your own cache (pulled there once, 1.6 GB)
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -p xdist.plugin -q -m 'not ray'

demo: venv
	$(BIN)/specserve bench --demo --out bench-out/demo

bench-quick: venv
	SPECSERVE_HOME=$(TEST_HOME) $(BIN)/specserve bench --quick --out bench-out/quick

bench-load: venv  # many requests at once (SmolLM2, 1/4/16 concurrent, in-process and through the server)
	SPECSERVE_HOME=$(TEST_HOME) $(BIN)/specserve bench --quick --concurrency 1,4,16 --modes plain,prediction \
		--load-via both --max-prompt-tokens 256 --load-max-tokens 128 --out bench-out/load

clean:
	rm -rf $(VENV) .cache bench-out
