"""The distribution as pip sees it: one wheel, one top-level package."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("accel_plugin-*.whl")
    return path


def test_wheel_has_only_the_accel_plugin_package_and_the_tgi_hook(wheel):
    """One package, plus the TGI adapter's .pth line (inert unless ACCEL_* is set)."""
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"accel_plugin", "accel_plugin_tgi.pth"}, f"unexpected top-level entries: {sorted(top)}"
    for module in ("accel_plugin/kernels/__init__.py", "accel_plugin/adapters/vllm/__init__.py",
                   "accel_plugin/adapters/tgi/__init__.py", "accel_plugin/kernels/limits.py",
                   "accel_plugin/plugins/hookspecs.py", "accel_plugin/cli/doctor.py",
                   # the native CPU kernels, built on first use
                   "accel_plugin/kernels/csrc/cpu_attention.cpp", "accel_plugin/kernels/csrc/cpu_linear.cpp"):
        assert module in names


def test_wheel_metadata_entry_points_and_dependencies(wheel):
    zf = zipfile.ZipFile(wheel)
    info = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zf.read(info).decode()
    assert "[vllm.general_plugins]\naccel_plugin = accel_plugin.adapters.vllm:register" in entry_points
    assert "[console_scripts]\naccel = accel_plugin.cli:main" in entry_points
    metadata = zf.read(info.replace("entry_points.txt", "METADATA")).decode()
    requires = [l.split(":", 1)[1].strip() for l in metadata.splitlines() if l.startswith("Requires-Dist:")]
    runtime = sorted(r.split(">")[0].split("=")[0].split(";")[0].strip().lower() for r in requires if "extra ==" not in r)
    assert runtime == ["google-re2", "ninja", "numpy", "packaging", "pluggy", "pydantic", "pyyaml", "safetensors", "torch", "triton"]
    # the compatibility matrix's records ship (accel doctor --self-test reads them)
    assert "accel_plugin/diagnostics/compat_results.json" in zf.namelist()


def test_import_is_cheap_and_framework_free():
    code = (
        "import sys, accel_plugin, accel_plugin.plugins.manager, accel_plugin.plugins.selection, accel_plugin.plugins.registry\n"
        "import accel_plugin.adapters.vllm\n"
        "bad = [m for m in ('vllm', 'triton', 'text_generation_server') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr


def test_editable_install_maps_the_folders():
    import accel_plugin.adapters
    import accel_plugin.kernels

    assert Path(accel_plugin.kernels.__file__).parent == ROOT / "kernels"
    assert Path(accel_plugin.adapters.__file__).parent == ROOT / "adapters"
