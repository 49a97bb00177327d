"""Draft weights come from safetensors only; no pickle is ever unpickled freely."""

from __future__ import annotations

import ast
import os
import pickle
from pathlib import Path

import pytest
import torch

from accel_plugin.speculative.llama import LlamaDraftModel
from accel_plugin.speculative.llama_weights import DraftModelError

ROOT = Path(__file__).resolve().parents[2]


class _Payload:
    """Unpickling this runs ``os.system``: what a hostile pytorch_model.bin can do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile_pickle(path: Path, marker: Path) -> None:
    with path.open("wb") as f:
        pickle.dump({"model.embed_tokens.weight": _Payload(marker)}, f, protocol=2)


def test_draft_with_only_pytorch_model_bin_is_refused_unread(tmp_path):
    from accel_plugin.testing.tiny_models import build_tiny_model

    draft = build_tiny_model("draft-d32", tmp_path)
    for f in draft.glob("*.safetensors"):
        f.unlink()
    marker = tmp_path / "pwned"
    _hostile_pickle(draft / "pytorch_model.bin", marker)
    with pytest.raises(DraftModelError, match=r"no \*\.safetensors weights; found pytorch_model\.bin"):
        LlamaDraftModel(draft)
    assert not marker.exists()


def test_weights_only_load_refuses_a_pickled_object(tmp_path):
    marker = tmp_path / "pwned"
    _hostile_pickle(tmp_path / "state.pt", marker)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "state.pt", weights_only=True)
    assert not marker.exists()


def _calls(tree: ast.AST, name: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            dotted = ast.unparse(func)
            if dotted == name or dotted.endswith("." + name):
                yield node


@pytest.mark.parametrize("folder", ["accel_plugin", "adapters", "kernels"])
def test_every_torch_load_is_weights_only_and_nothing_unpickles(folder):
    offenders = []
    for file in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(file.read_text())
        for call in _calls(tree, "torch.load"):
            keywords = {k.arg: k.value for k in call.keywords}
            value = keywords.get("weights_only")
            if not (isinstance(value, ast.Constant) and value.value is True):
                offenders.append(f"{file.relative_to(ROOT)}:{call.lineno}: torch.load without weights_only=True")
        for name in ("pickle.load", "pickle.loads", "dill.load", "joblib.load"):
            offenders += [f"{file.relative_to(ROOT)}:{c.lineno}: {name}" for c in _calls(tree, name)]
    assert not offenders, offenders
