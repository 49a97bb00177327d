"""The docs name every hook and every environment variable."""

import inspect
from pathlib import Path

from accel_plugin import envs
from accel_plugin.plugins import hookspecs

DOCS = Path(__file__).resolve().parents[1] / "docs"


def hook_names():
    return [name for name, obj in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("accel_")]


def test_every_hook_is_documented():
    text = (DOCS / "hooks.md").read_text()
    names = hook_names()
    assert len(names) >= 4
    missing = [n for n in names if f"### `{n}(" not in text]
    assert not missing, f"hooks missing from docs/hooks.md: {missing}"


def test_every_hook_has_a_docstring_and_prefix():
    for name, obj in inspect.getmembers(hookspecs, inspect.isfunction):
        if hasattr(obj, "accel_plugin_spec"):
            assert name.startswith("accel_") and obj.__doc__, name


def test_every_env_var_is_documented():
    text = (DOCS / "configuration.md").read_text()
    missing = [v.name for v in envs.ENV_VARS if f"`{v.name}`" not in text]
    assert not missing, f"env vars missing from docs/configuration.md: {missing}"
