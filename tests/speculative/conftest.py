"""Fixtures of the speculative tests: tiny models (built once per session), the target
and its tokenizer loaded with transformers, and configs."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
import torch


def load_verifier():
    """verifier.py as a module (the tests' greedy target, vLLM-style ``serve``)."""
    if "accel_tests_verifier" in sys.modules:
        return sys.modules["accel_tests_verifier"]
    spec = importlib.util.spec_from_file_location("accel_tests_verifier", Path(__file__).with_name("verifier.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def verifier():
    return load_verifier()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Factory: ``tiny_models("draft-d32", seed=7)`` -> model dir (cached per session)."""
    from accel_plugin.testing.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("spec-models")

    def build(name: str, **overrides):
        return build_tiny_model(name, root, **overrides)

    return build


@pytest.fixture(scope="session")
def target_dir(tiny_models):
    return tiny_models("gqa-d32")


@pytest.fixture(scope="session")
def draft_dir(tiny_models):
    return tiny_models("draft-d32")


@pytest.fixture
def make_config(tmp_path):
    """``make_config(yaml_text)`` -> validated DraftConfig written under tmp_path."""
    from accel_plugin.speculative.draft_config import load_draft_config

    def make(text: str):
        path = tmp_path / "drafts.yaml"
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return load_draft_config(path)

    return make


@pytest.fixture(scope="module")
def target(target_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(target_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_dir)
