"""The docs name every hook and every environment variable, and only paths and names that exist."""

import inspect
import re
from pathlib import Path

from accel_plugin import envs
from accel_plugin.plugins import hookspecs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


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


_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_REPO_PATH = re.compile(r"(?<![\w/.])((?:accel_plugin|kernels|adapters|benchmarks|scripts|tests|integration|demo_models)"
                        r"/[\w/.-]*\w)")
_DOTTED = re.compile(r"(?<![\w.])(accel_plugin(?:\.\w+)+)")
_FOLDERS = {"accel_plugin": "accel_plugin", "kernels": "kernels", "adapters": "adapters"}


def test_every_repo_path_in_the_docs_exists():
    gone = sorted({f"{doc.name}: {m}" for doc in _DOCS for m in _REPO_PATH.findall(doc.read_text())
                   if not (ROOT / m).exists()})
    assert not gone, "docs name paths that do not exist:\n" + "\n".join(gone)


def _dotted_exists(name: str) -> bool:
    """``accel_plugin.a.b.c``: a module path, then at most attributes defined in the last module."""
    parts = name.split(".")[1:]
    if parts and parts[0] in ("kernels", "adapters"):
        folder, parts = ROOT / parts[0], parts[1:]
    else:
        folder = ROOT / "accel_plugin"
    module = folder / "__init__.py"
    while parts and ((folder / parts[0]).is_dir() or (folder / f"{parts[0]}.py").exists()):
        if (folder / parts[0]).is_dir():
            folder = folder / parts[0]
            module = folder / "__init__.py"
        else:
            module = folder / f"{parts[0]}.py"
        parts = parts[1:]
        if module.name != "__init__.py":
            break
    if not parts:
        return True
    text = module.read_text() if module.exists() else ""
    return bool(re.search(rf"^\s*(?:def|class|async def)\s+{parts[0]}\b|^\s*{parts[0]}\s*[:=]|import .*\b{parts[0]}\b"
                          rf"|[\"']{parts[0]}[\"']\s*:",  # a lazy export: {{name: module}} for __getattr__
                          text, re.MULTILINE))


def test_every_dotted_name_in_the_docs_exists():
    gone = sorted({f"{doc.name}: {m}" for doc in _DOCS for m in _DOTTED.findall(doc.read_text())
                   if not _dotted_exists(m)})
    assert not gone, "docs name modules or attributes that do not exist:\n" + "\n".join(gone)


def _env_docs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("env_docs", ROOT / "scripts" / "env_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_env_table_is_generated_from_envs():
    """docs/configuration.md's table is envs.ENV_VARS, row for row: `python scripts/env_docs.py`."""
    env_docs = _env_docs()
    page = (DOCS / "configuration.md").read_text()
    assert env_docs.update(page, envs.ENV_VARS) == page, (
        "docs/configuration.md's environment-variable table differs from accel_plugin/envs.py's ENV_VARS: "
        "run `python scripts/env_docs.py`")
    table = page.split(env_docs.BEGIN)[1].split(env_docs.END)[0]
    assert [line.split("`")[1] for line in table.strip().splitlines()[2:]] == [v.name for v in envs.ENV_VARS]
    # a change to the table (here: a row gone) is what the comparison above catches
    assert env_docs.update(page, envs.ENV_VARS[1:]) != page
