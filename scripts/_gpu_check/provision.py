"""gpu-check's set-up: refuse without a CUDA GPU, install only the missing test tools
(``pip install --no-deps``, offline from a wheel folder when given) and this checkout."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: (distribution, pip requirement, minimum version, only below this python): what
#: tests/kernels needs besides torch and triton, dependencies included (installed --no-deps).
REQUIREMENTS = (
    ("pluggy", "pluggy>=1.6", (1, 6), None),
    ("pytest", "pytest>=8", (8,), None),
    ("iniconfig", "iniconfig>=2", (2,), None),
    ("packaging", "packaging>=24", (24,), None),
    ("Pygments", "Pygments>=2.15", (2, 15), None),
    ("exceptiongroup", "exceptiongroup>=1", (1,), (3, 11)),
    ("tomli", "tomli>=2", (2,), (3, 11)),
    ("pytest-timeout", "pytest-timeout>=2", (2,), None),
    ("hypothesis", "hypothesis>=6", (6,), None),
    ("sortedcontainers", "sortedcontainers>=2.1", (2, 1), None),
    ("setuptools", "setuptools>=70.1", (70, 1), None),  # builds the editable install of accel-plugin
)
IMPORT_CHECK = "import pytest, pytest_timeout, hypothesis, pluggy"

def version_tuple(text: str) -> tuple[int, ...]:
    """(9, 2, 0) for "9.2.0", (1, 0) for "1.0rc1": the leading release numbers."""
    parts = []
    for piece in text.split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def installed_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def missing_requirements(version_of=installed_version, python=sys.version_info[:2]) -> list[str]:
    """The pip requirements of REQUIREMENTS that are absent here or older than their minimum."""
    missing = []
    for dist, requirement, minimum, python_below in REQUIREMENTS:
        if python_below and tuple(python) >= python_below:
            continue
        version = version_of(dist)
        if version is None or version_tuple(version) < minimum:
            missing.append(requirement)
    return missing


def externally_managed() -> bool:
    """PEP 668: a distribution's python that pip refuses to install into without a flag."""
    if sys.prefix != sys.base_prefix:  # a virtual environment
        return False
    return (Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").exists()


def pip_install_command(args: list[str], wheels: str | None, break_system: bool) -> list[str]:
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check"]
    if wheels:
        command += ["--no-index", "--find-links", wheels]
    else:  # fail fast where nothing outside can be reached
        command += ["--retries", "0", "--timeout", "20"]
    if break_system:
        command.append("--break-system-packages")
    return command + args


def download_wheels(folder: str, python_version: str) -> int:
    """Pure-python wheels of every requirement, for ``--wheels`` on a machine without network."""
    specs = [requirement for _, requirement, _, _ in REQUIREMENTS]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", "any",
               "--implementation", "py", "--abi", "none", "--python-version", python_version, "-d", folder, *specs]
    print("+", shlex.join(command), flush=True)
    return subprocess.run(command).returncode


def cuda_refusal() -> str | None:
    """Why this machine cannot run the check, or None when torch sees a CUDA GPU."""
    try:
        import torch
    except ImportError as exc:
        return (f"gpu-check needs torch with CUDA; {sys.executable} cannot import torch ({exc}). "
                "Run it with the python that has torch: make gpu-check GPU_PYTHON=/path/to/python")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (f"gpu-check needs a CUDA GPU: torch.cuda.is_available() is False (torch {torch.__version__}, "
                f"{build}). Nothing was installed or run.")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"gpu-check needs triton next to torch; it cannot be imported ({exc}). Nothing was installed or run."
    return None


def accel_plugin_from_here() -> bool:
    """True when ``accel_plugin.kernels`` imports, from this checkout, as the tests will see it."""
    code = "import accel_plugin.kernels as k; print(k.__file__)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    return result.returncode == 0 and Path(result.stdout.strip()).resolve() == REPO / "kernels" / "__init__.py"


def install(wheels: str | None) -> list[str]:
    """Install what is missing; returns what was done, for the report. Raises on failure."""
    notes = []
    break_system = externally_managed()
    missing = missing_requirements()
    if missing:
        command = pip_install_command(missing, wheels, break_system)
        print("+", shlex.join(command), flush=True)
        subprocess.run(command, check=True)
        notes.append(f"installed (--no-deps): {', '.join(missing)}" + (f" from {wheels}" if wheels else ""))
    else:
        notes.append("test tools: all present, nothing installed")
    check = subprocess.run([sys.executable, "-c", IMPORT_CHECK], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"the test tools do not import after installing: {check.stderr.strip()[-500:]}")
    if accel_plugin_from_here():
        notes.append("accel-plugin: accel_plugin.kernels already imports from this checkout")
    else:
        command = pip_install_command(["--no-build-isolation", "-e", str(REPO)], wheels, break_system)
        print("+", shlex.join(command), flush=True)
        subprocess.run(command, check=True)
        if not accel_plugin_from_here():
            raise RuntimeError("accel_plugin.kernels still does not import from this checkout after pip install -e")
        notes.append("accel-plugin: installed from this checkout (pip install --no-deps --no-build-isolation -e .)")
    if break_system:
        notes.append("this python is externally managed (PEP 668): pip ran with --break-system-packages")
    return notes
