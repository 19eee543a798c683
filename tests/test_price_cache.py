"""The price cache: calibrated prices are reused for the same setup and measured again when
the model file, the threads or the CPU change; a backend nobody can identify is never cached."""

from __future__ import annotations

import json
import os

import pytest

from specserve.engine import prices
from specserve.engine.governor import CostModel


class FakeGGUFBackend:
    """What prices.backend_key reads from a llama.cpp backend."""

    name = "llama.cpp"

    def __init__(self, path, threads=2, exact=False, kernels="flash_attn=False"):
        self.path, self.threads, self.batch_invariant, self.kernels = path, threads, exact, kernels
        self.max_context, self.max_sequences, self.cache_tokens = 8192, 2, 16384


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(prices, "cpu_key", lambda: {"cpu": "Fake EPYC", "flags": ["avx2", "avx512f"], "cores": 2})
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights v1")
    return model


def calibrations(backend, draft=None):
    """Prices for this setup through the cache, and how many calibrations that took (0 or 1)."""
    calls = []

    def calibrate():
        calls.append(1)
        return CostModel(((1, 1.0), (8, 6.6), (128, 44.9 + len(calls))), 0.25, True)

    return prices.measured(backend, draft, True, calibrate), len(calls)


def test_reused_for_the_same_setup(home, capsys):
    first, n1 = calibrations(FakeGGUFBackend(home))
    measuring = capsys.readouterr().err  # a fresh machine waits up to half a minute: it is told why
    again, n2 = calibrations(FakeGGUFBackend(home))
    assert (n1, n2) == (1, 0) and again == first
    assert len(list(prices.cache_dir().glob("*.json"))) == 1
    assert "measuring speculation prices" in measuring and str(prices.cache_dir()) in measuring
    assert capsys.readouterr().err == ""  # read from the cache: nothing to say


def test_a_changed_model_file_is_measured_again(home):
    calibrations(FakeGGUFBackend(home))
    home.write_bytes(b"weights v2, longer")  # size (and mtime) change
    assert calibrations(FakeGGUFBackend(home))[1] == 1
    st = home.stat()
    os.utime(home, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same size, newer file
    assert calibrations(FakeGGUFBackend(home))[1] == 1
    assert calibrations(FakeGGUFBackend(home))[1] == 0


def test_threads_exact_kernels_and_draft_change_the_key(home):
    calibrations(FakeGGUFBackend(home, threads=2))
    assert calibrations(FakeGGUFBackend(home, threads=1))[1] == 1
    assert calibrations(FakeGGUFBackend(home, threads=2, exact=True))[1] == 1
    assert calibrations(FakeGGUFBackend(home, threads=2, kernels="flash_attn=True"))[1] == 1  # another build/setting
    assert calibrations(FakeGGUFBackend(home, threads=2), FakeGGUFBackend(home))[1] == 1
    assert calibrations(FakeGGUFBackend(home, threads=2))[1] == 0


def test_sequence_ids_share_the_cells_and_the_prices(home):
    """A unified cache of the same cells prices a pass the same with more sequence ids (a prefix
    cache's); more cells, or a longer context, are another setup."""
    calibrations(FakeGGUFBackend(home))
    more_ids = FakeGGUFBackend(home)
    more_ids.max_sequences = 4
    assert calibrations(more_ids)[1] == 0
    more_cells = FakeGGUFBackend(home)
    more_cells.cache_tokens = 32768
    assert calibrations(more_cells)[1] == 1
    longer = FakeGGUFBackend(home)
    longer.max_context = 16384
    assert calibrations(longer)[1] == 1


def test_another_cpu_is_measured_again(home, monkeypatch):
    calibrations(FakeGGUFBackend(home))
    monkeypatch.setattr(prices, "cpu_key", lambda: {"cpu": "Fake EPYC", "flags": ["avx2"], "cores": 2})
    assert calibrations(FakeGGUFBackend(home))[1] == 1
    monkeypatch.setattr(prices, "cpu_key", lambda: {"cpu": "Fake EPYC", "flags": ["avx2"], "cores": 4})
    assert calibrations(FakeGGUFBackend(home))[1] == 1


def test_unidentifiable_backends_are_never_cached(home):
    class InMemory:
        name = "transformers"
        model = object()

    assert prices.cache_key(InMemory()) is None
    assert calibrations(InMemory())[1] == 1 and calibrations(InMemory())[1] == 1
    assert calibrations(FakeGGUFBackend(home / "missing.gguf"))[1] == 1
    assert not prices.cache_dir().exists()


def test_a_corrupt_cache_file_is_measured_again(home):
    calibrations(FakeGGUFBackend(home))
    (path,) = prices.cache_dir().glob("*.json")
    path.write_text("{not json")
    assert calibrations(FakeGGUFBackend(home))[1] == 1
    assert calibrations(FakeGGUFBackend(home))[1] == 0


@pytest.mark.parametrize(
    "curve, other",
    [
        ([[1, 1.0]], {}),  # one point: IndexError on every step
        ([], {}),
        ([[1, 0.0], [2, 0.0]], {}),  # free passes: ZeroDivisionError
        ([[1, 1.0], [1, 1.0]], {}),  # the same count twice: ZeroDivisionError
        ([[1, 1.0], [8, 6.0], [4, 3.0]], {}),
        ([[1, 1.0], [8, 6.0], [16, 5.0]], {}),  # a longer pass cheaper: calibrate never writes it
        ([[1, 1.0], [2, float("inf")]], {}),
        ([[1, 1.0], [2, 1.5]], {"draft": -1.0}),
        ([[1, 1.0], [2, 1.5]], {"agreement": 3.0}),
        ([[1, 1.0], [2, 1.5]], {"copy": float("nan")}),
    ],
)
def test_a_price_file_of_the_wrong_shape_is_measured_again(home, curve, other):
    """Valid JSON with an unusable curve used to be trusted: every request then failed with an
    engine error, and the file was never measured again."""
    calibrations(FakeGGUFBackend(home))
    (path,) = prices.cache_dir().glob("*.json")
    good = {"curve": curve, "draft": 0.0, "batched": True, "agreement": None, "copy": 0.001}
    path.write_text(json.dumps(good | other))
    assert calibrations(FakeGGUFBackend(home))[1] == 1
    assert calibrations(FakeGGUFBackend(home))[1] == 0  # the file was replaced by a good one


def test_the_engine_reads_its_prices_from_the_cache(home, monkeypatch):
    """EngineCore.prices() goes through the cache: a cached setup is never calibrated."""
    from specserve.engine.core import EngineCore

    cached = CostModel(((1, 1.0), (2, 1.5), (128, 40.0)), 0.0, True)
    monkeypatch.setattr(prices, "cache_key", lambda *a, **k: "fixed")
    prices.save("fixed", cached)
    monkeypatch.setattr(CostModel, "calibrate", classmethod(lambda cls, *a, **k: pytest.fail("calibrated")))
    core = EngineCore.__new__(EngineCore)
    core.lock, core._prices, core.draft = __import__("threading").RLock(), None, None
    core._relocates, core.host, core.prefix, core._copies = False, None, None, None  # no cells to copy out

    class Target:
        batches_sequences = True

    core.target = Target()
    monkeypatch.setattr(
        "specserve.engine.core.SequenceRunner", lambda backend: type("R", (), {"close": lambda s: None})()
    )
    assert core.prices() == cached


def test_the_draft_models_agreement_is_kept_and_the_reference_text_is_in_the_key(home, monkeypatch):
    measured = CostModel(((1, 1.0), (8, 6.6)), 0.4, True, 0.83, copy=0.0021)
    assert prices.measured(FakeGGUFBackend(home), FakeGGUFBackend(home), True, lambda: measured) == measured
    again = prices.measured(FakeGGUFBackend(home), FakeGGUFBackend(home), True, lambda: pytest.fail("measured"))
    assert again.agreement == 0.83 and again.copy == 0.0021  # the price of a copy is kept too
    key = prices.cache_key(FakeGGUFBackend(home), FakeGGUFBackend(home))
    monkeypatch.setattr(prices, "AGREEMENT_TEXT", "another passage")
    assert prices.cache_key(FakeGGUFBackend(home), FakeGGUFBackend(home)) != key
    assert prices.cache_key(FakeGGUFBackend(home)) == prices.cache_key(FakeGGUFBackend(home))  # no draft: no text


def test_the_folder_keeps_the_most_recently_used_setups(home, monkeypatch):
    """A key nobody reads again (an upgraded model file, a test's temporary model) does not stay
    for ever: past KEEP_FILES files the least recently used go, and reading a file counts as use."""
    monkeypatch.setattr(prices, "KEEP_FILES", 3)
    model = CostModel(((1, 1.0), (8, 6.6)), 0.0, True)
    for i, key in enumerate("abcd"):
        prices.save(key, model)
        os.utime(prices.cache_dir() / f"{key}.json", ns=(i * 10**9, i * 10**9))  # saved a second apart
        if key == "b":
            assert prices.load("a") == model  # "a" read after "b" was saved: used more lately than "b"
    assert sorted(p.stem for p in prices.cache_dir().glob("*.json")) == ["a", "c", "d"]


def test_a_link_planted_at_the_temp_name_is_not_followed(home):
    """Prices were written through `<key>.json.tmp<pid>`, a name anyone could guess, opened
    without O_EXCL: a symbolic link planted there made the write land in the file it pointed
    at. The temp file is now created exclusively under a random name, then renamed."""
    backend = FakeGGUFBackend(home)
    key = prices.cache_key(backend, None, True)
    folder = prices.cache_dir()
    folder.mkdir(parents=True)
    victim = home.parent / "victim.txt"
    victim.write_text("keep me")
    (folder / f"{key}.json.tmp{os.getpid()}").symlink_to(victim)
    first, n = calibrations(backend)
    assert n == 1 and victim.read_text() == "keep me"
    assert calibrations(backend) == (first, 0)  # written where it belongs
    assert [p.name for p in folder.iterdir() if not p.is_symlink()] == [f"{key}.json"]  # no temp file left


def test_a_failed_price_write_leaves_no_temp_file(home, monkeypatch):
    """A write that fails after its temp file is made (the rename refused) removes the temp
    file: none piles up in the folder."""
    backend = FakeGGUFBackend(home)

    def refused(*args, **kwargs):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refused)
    assert calibrations(backend)[1] == 1
    assert list(prices.cache_dir().iterdir()) == []
