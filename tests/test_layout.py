"""The tree as a newcomer reads it (issue 21): folders that say what they own, small
one-concern modules, no import cycle, no import up into a package ``__init__``, and
docs/index.md's "where things live" naming exactly the folders there are."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: repo folder -> installed package name (pyproject.toml's package-dir mapping)
PACKAGES = {"accel_plugin": "accel_plugin", "kernels": "accel_plugin.kernels", "adapters": "accel_plugin.adapters"}
#: folders whose modules are held to the size limit
SIZED = ("accel_plugin", "adapters", "kernels", "benchmarks", "scripts")
MAX_LINES = 400
MAX_ROOT_MODULES = 6


def _py_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> tuple[str, bool]:
    """(dotted installed name, is a package __init__) of a file under a PACKAGES folder."""
    rel = path.relative_to(ROOT)
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _all_modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for folder in PACKAGES:
        for path in _py_files(folder):
            name, is_pkg = _module_name(path)
            out[name] = (path, is_pkg)
    return out


MODULES = _all_modules()


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """(absolute module, imported names, line) of every import in a module, at any depth
    (function-local imports too: a cycle through them is a cycle all the same)."""
    path, is_pkg = MODULES[name]
    package = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, [a.name for a in node.names], node.lineno))
    return out


def _edges(name: str) -> set[str]:
    """Our modules that ``name`` imports (a ``from pkg import sub`` counts as ``pkg.sub``)."""
    out = set()
    for module, names, _ in _imports(name):
        for target in [f"{module}.{n}" for n in names] + [module]:
            if target in MODULES and target != name:
                out.add(target)
                break
    return out


def test_the_core_root_holds_few_modules():
    root = sorted(p.name for p in (ROOT / "accel_plugin").glob("*.py") if p.name != "__init__.py")
    assert len(root) <= MAX_ROOT_MODULES, f"accel_plugin/ root modules: {root}; put new ones in a folder"


#: folders of Python files that are not packages: scripts run as files, and vLLM's
#: worker extension, put on a worker's path by the load benchmark
NOT_PACKAGES = ("scripts", "benchmarks/_load_extension")


@pytest.mark.parametrize("folder", sorted({str(p.parent.relative_to(ROOT)) for f in SIZED for p in _py_files(f)}
                                          - set(NOT_PACKAGES)))
def test_every_folder_says_what_it_owns(folder):
    init = ROOT / folder / "__init__.py"
    assert init.exists(), f"{folder}/ has no __init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and doc.strip(), f"{folder}/__init__.py needs a docstring saying what the folder owns"


def test_no_module_over_the_size_limit():
    big = {str(p.relative_to(ROOT)): n for f in SIZED for p in _py_files(f)
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them by concern): {big}"


def test_every_module_starts_with_a_docstring():
    missing = [str(p.relative_to(ROOT)) for f in SIZED for p in _py_files(f)
               if p.stat().st_size and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring: {missing}"


def test_no_import_cycle():
    graph = {name: _edges(name) for name in MODULES}
    cycles = []
    for start in graph:
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(" -> ".join((*path, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles))[:20])


def test_no_import_up_into_a_package_init():
    """A module never takes a name defined in an enclosing package's __init__: that is an
    import from a lower layer up (the __init__ may import its submodules, not the reverse)."""
    defined = {}
    for name, (path, is_pkg) in MODULES.items():
        if is_pkg:
            tree = ast.parse(path.read_text())
            defined[name] = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
                t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    upward = []
    for name, (path, is_pkg) in MODULES.items():
        if path.name == "__main__.py":  # ``python -m package`` runs the package: above it, not below
            continue
        for module, names, line in _imports(name):
            if module in defined and (name.startswith(module + ".") and name != module):
                bad = [n for n in names if n in defined[module] and f"{module}.{n}" not in MODULES
                       and not n.startswith("__")]  # package metadata (__version__)
                if bad:
                    upward.append(f"{path.relative_to(ROOT)}:{line} imports {bad} from {module}/__init__.py")
    assert not upward, "\n".join(upward)


def test_the_core_imports_no_adapter_and_no_framework():
    bad = []
    for name, (path, _) in MODULES.items():
        if name.startswith(("accel_plugin.adapters", "accel_plugin.kernels")):
            continue
        for module, _, line in _imports(name):
            if module.startswith(("accel_plugin.adapters", "vllm", "text_generation_server")):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_kernels_import_only_torch_and_triton():
    allowed = ("torch", "triton", "numpy", "accel_plugin.kernels", "__future__")
    bad = []
    for name, (path, _) in MODULES.items():
        if not name.startswith("accel_plugin.kernels"):
            continue
        for module, _, line in _imports(name):
            top = module.split(".")[0]
            if not module.startswith(allowed) and top not in _STDLIB:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


_STDLIB = set(__import__("sys").stdlib_module_names)


def _where_things_live() -> set[str]:
    text = (ROOT / "docs" / "index.md").read_text()
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`((?:accel_plugin|kernels|adapters|benchmarks|scripts|tests|integration)(?:/[\w.]+)*/?)`",
                          section))


def test_where_things_live_names_every_package_folder():
    named = {p.rstrip("/") for p in _where_things_live()}
    folders = {str(p.parent.relative_to(ROOT)) for f in PACKAGES for p in _py_files(f) if p.name == "__init__.py"}
    missing = sorted(folders - named)
    assert not missing, f"docs/index.md 'Where things live' does not name: {missing}"


def test_where_things_live_names_only_what_exists():
    gone = sorted(p for p in _where_things_live() if not (ROOT / p.rstrip("/")).exists())
    assert not gone, f"docs/index.md 'Where things live' names paths that do not exist: {gone}"


def test_tests_mirror_the_core_folders():
    core = {p.parent.relative_to(ROOT / "accel_plugin") for p in _py_files("accel_plugin")
            if p.name == "__init__.py" and p.parent != ROOT / "accel_plugin"}
    missing = sorted(str(c) for c in core if not (ROOT / "tests" / c).is_dir() and str(c) != "testing")
    assert not missing, f"tests/ has no folder for accel_plugin/{missing}"
