"""Draft checkpoints that borrow weights from their target, and pruned heads.

A draft for a real target is mostly the target's own tensors: its embedding table
(``vocab x hidden``, 113 MB in float32 for SmolLM2-135M) and, often, its first
layers unchanged. Storing those again in every draft would make drafts large to
ship for no information. So a draft directory may declare, in its ``config.json``::

    "accel_draft": {
      "format": 1,
      "from_target": {"model.embed_tokens.weight": "model.embed_tokens.weight",
                      "model.layers.0.": "model.layers.0."},
      "head_vocab": "accel.head_vocab",
      "target": {"vocab_size": 49152, "hidden_size": 576, "embed_fingerprint": "9f2c..."}
    }

- ``from_target``: draft tensor name (or prefix, ending in ``.``) -> the target's
  tensor name (or prefix) it is read from when the draft is loaded; those tensors
  are not in the draft's safetensors files.
- ``head_vocab``: the name of an int64 tensor ``[V']`` in the draft's safetensors:
  the token ids the draft can propose. Its LM head keeps only those rows (a
  vocabulary-pruned head: the head of a small draft over a 49k vocabulary costs
  more than its layers), and its argmax is mapped back through the tensor.
- ``target``: what the draft was made for; ``embed_fingerprint`` is a hash of the
  target's embedding table (as bfloat16, so float32 and bfloat16 copies of one
  model agree). Loading against another target fails with a clear message instead
  of drafting garbage.

Such a draft is an ordinary Llama checkpoint once assembled (:func:`load_tensors`),
which is how both the draft engine and ``accel tune-draft`` read it. Nothing here
imports a serving framework or transformers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = [
    "DRAFT_KEY",
    "checkpoint_parameters",
    "DraftFormatError",
    "DraftSpec",
    "embed_fingerprint",
    "load_tensors",
    "read_spec",
    "save_draft",
]

#: the key of config.json that marks a draft of this format
DRAFT_KEY = "accel_draft"
FORMAT_VERSION = 1
_EMBED = "model.embed_tokens.weight"


class DraftFormatError(ValueError):
    """A draft checkpoint that cannot be assembled (names the file, key and fix)."""


@dataclass(frozen=True)
class DraftSpec:
    """The ``accel_draft`` section of a draft's config.json."""

    from_target: dict[str, str] = field(default_factory=dict)
    head_vocab: str | None = None
    target: dict = field(default_factory=dict)

    @property
    def needs_target(self) -> bool:
        return bool(self.from_target)

    def to_json(self) -> dict:
        out: dict = {"format": FORMAT_VERSION, "from_target": dict(self.from_target)}
        if self.head_vocab:
            out["head_vocab"] = self.head_vocab
        if self.target:
            out["target"] = dict(self.target)
        return out


def read_spec(config: dict, where: str | Path = "config.json") -> DraftSpec | None:
    """The draft spec of a parsed config.json (``None`` for a plain checkpoint)."""
    raw = config.get(DRAFT_KEY)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise DraftFormatError(f"{where}: {DRAFT_KEY} must be a mapping; got {type(raw).__name__}")
    version = raw.get("format")
    if version != FORMAT_VERSION:
        raise DraftFormatError(
            f"{where}: {DRAFT_KEY}.format is {version!r}; this accel-plugin reads format {FORMAT_VERSION} "
            "(upgrade accel-plugin, or re-create the draft with `accel tune-draft`)"
        )
    unknown = set(raw) - {"format", "from_target", "head_vocab", "target"}
    if unknown:
        raise DraftFormatError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} in {DRAFT_KEY}; "
            "valid keys: format, from_target, head_vocab, target"
        )
    mapping = raw.get("from_target") or {}
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise DraftFormatError(f"{where}: {DRAFT_KEY}.from_target must map draft tensor names to target tensor names")
    for key, value in mapping.items():
        if key.endswith(".") != value.endswith("."):
            raise DraftFormatError(
                f"{where}: {DRAFT_KEY}.from_target maps {key!r} to {value!r}: a prefix (ending in '.') "
                "must map to a prefix, a full name to a full name"
            )
    head = raw.get("head_vocab")
    if head is not None and not isinstance(head, str):
        raise DraftFormatError(f"{where}: {DRAFT_KEY}.head_vocab must be a tensor name; got {head!r}")
    target = raw.get("target") or {}
    if not isinstance(target, dict):
        raise DraftFormatError(f"{where}: {DRAFT_KEY}.target must be a mapping")
    return DraftSpec(dict(mapping), head, dict(target))


def _safetensors_files(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("*.safetensors"))


def _target_index(target_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of the target that holds it."""
    from safetensors import safe_open

    index: dict[str, Path] = {}
    for f in _safetensors_files(target_dir):
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                index[name] = f
    return index


def _read(files: dict[str, Path], names: Iterable[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for f, wanted in by_file.items():
        with safe_open(str(f), framework="pt") as handle:
            for name in wanted:
                # a copy: safe_open maps the file, and a file rewritten in place under a
                # mapping kills the process (SIGBUS) at the next read
                out[name] = handle.get_tensor(name).clone()
    return out


def checkpoint_parameters(model_dir: str | Path) -> int:
    """Parameters stored in a model directory's safetensors files (shapes only, nothing
    loaded): the size of a served model, which frameworks may repack out of sight
    (vLLM's CPU build keeps linear weights as oneDNN handles, not parameters)."""
    from safetensors import safe_open

    total = 0
    for f in _safetensors_files(Path(model_dir)):
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                count = 1
                for dim in handle.get_slice(name).get_shape():
                    count *= dim
                total += count
    return total


def embed_fingerprint(embedding: torch.Tensor) -> str:
    """A short hash of an embedding table, the same for its float32 and bfloat16 copies."""
    data = embedding.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def load_tensors(draft_dir: str | Path, target_dir: str | Path | None = None) -> tuple[dict[str, torch.Tensor], DraftSpec | None]:
    """Every tensor of the draft at ``draft_dir``, borrowed ones read from ``target_dir``.

    Returns ``(tensors, spec)``; ``spec`` is ``None`` for a plain checkpoint (then
    ``target_dir`` is not needed). The tensors own their memory (no file mapping), so
    the files may be deleted or rewritten once this returns. Raises
    :class:`DraftFormatError`.
    """
    from safetensors.torch import load

    draft_dir = Path(draft_dir)
    config_file = draft_dir / "config.json"
    config = json.loads(config_file.read_text())
    spec = read_spec(config, config_file)
    tensors: dict[str, torch.Tensor] = {}
    for f in _safetensors_files(draft_dir):
        # read into memory, not mapped (load_file maps): a draft's files replaced in
        # place while the server runs must not take the process down with SIGBUS
        tensors.update(load(f.read_bytes()))
    if spec is None or not spec.needs_target:
        return tensors, spec
    if target_dir is None:
        raise DraftFormatError(
            f"{draft_dir}: this draft reads {len(spec.from_target)} tensor group(s) from its target model "
            f"({DRAFT_KEY}.from_target in config.json), but no target model directory was given"
        )
    target_dir = Path(target_dir)
    index = _target_index(target_dir)
    wanted: dict[str, str] = {}  # draft name -> target name
    for d_key, t_key in spec.from_target.items():
        if d_key.endswith("."):
            found = {d_key + name[len(t_key):]: name for name in index if name.startswith(t_key)}
            if not found:
                raise DraftFormatError(
                    f"{draft_dir}: {DRAFT_KEY}.from_target wants tensors {t_key}* from the target {target_dir}, "
                    "which has none: is this the target the draft was made for?"
                )
            wanted.update(found)
        else:
            if t_key not in index:
                raise DraftFormatError(
                    f"{draft_dir}: {DRAFT_KEY}.from_target wants {t_key!r} from the target {target_dir}, "
                    "which has no such tensor: is this the target the draft was made for?"
                )
            wanted[d_key] = t_key
    borrowed = _read(index, set(wanted.values()))
    for d_name, t_name in wanted.items():
        tensors[d_name] = borrowed[t_name]
    expected = spec.target.get("embed_fingerprint")
    embed = tensors.get(_EMBED)
    if expected and embed is not None:
        got = embed_fingerprint(embed)
        if got != expected:
            raise DraftFormatError(
                f"{draft_dir}: this draft was made for another target model (embedding fingerprint {expected}, "
                f"the target {target_dir} has {got}); use the target it was tuned for, or tune a draft for this "
                "target with `accel tune-draft`"
            )
    return tensors, spec


def save_draft(out_dir: str | Path, config: dict, tensors: dict[str, torch.Tensor], spec: DraftSpec) -> Path:
    """Write ``config.json`` (with ``spec``) and ``model.safetensors`` (``tensors``:
    only what the draft does not borrow) to ``out_dir``."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in config.items() if k != DRAFT_KEY}
    config[DRAFT_KEY] = spec.to_json()
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    return out_dir
