"""How the TGI activation file gets into an environment: the wheel, ``install-hook``, the line itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from accel_plugin.adapters.tgi import _startup

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import sys\n"
    "print(int('accel_plugin.adapters.tgi._startup' in sys.modules), "
    "sum(getattr(f, 'owner', None) == 'accel-plugin-tgi' for f in sys.meta_path), "
    "int('torch' in sys.modules))"
)


def _env(**values):
    env = {k: v for k, v in os.environ.items() if k not in ("ACCEL_ATTENTION_BACKEND", "ACCEL_DRAFT_CONFIG")}
    env.update({k: v for k, v in values.items() if v is not None})
    return env


def _probe_site_dir(site_dir: Path, **env) -> list[str]:
    """Start Python with ``site_dir`` processed as a site-packages folder (its .pth files run)."""
    code = f"import site; site.addsitedir({str(site_dir)!r})\n" + PROBE
    proc = subprocess.run([sys.executable, "-c", code], env=_env(**env), check=False, capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.slow
def test_the_wheel_installs_the_pth_file_into_site_packages(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("accel_plugin-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert _startup.PTH_NAME in names  # at the root: pip puts it into site-packages
    assert "accel_plugin/adapters/tgi/__init__.py" in names and "accel_plugin/adapters/tgi/_startup.py" in names
    assert zipfile.ZipFile(wheel).read(_startup.PTH_NAME).decode() == _startup.PTH_LINE
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    assert _startup.PTH_NAME in zipfile.ZipFile(wheel).read(record).decode()  # so pip uninstall removes it


def test_the_pth_line_installs_the_hook_only_when_the_variable_is_set(tmp_path):
    (tmp_path / _startup.PTH_NAME).write_text(_startup.PTH_LINE)
    assert _probe_site_dir(tmp_path) == ["0", "0", "0"]
    assert _probe_site_dir(tmp_path, ACCEL_ATTENTION_BACKEND=" ") == ["0", "0", "0"]
    assert _probe_site_dir(tmp_path, ACCEL_ATTENTION_BACKEND="flash") == ["1", "1", "0"]  # and no torch import
    # A bad value is only refused when TGI imports its attention: other programs start normally.
    assert _probe_site_dir(tmp_path, ACCEL_ATTENTION_BACKEND="bogus") == ["1", "1", "0"]


def test_install_hook_command_writes_and_removes_the_file(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "accel_plugin.adapters.tgi", *args, "--site-dir", str(tmp_path)],
                              check=False, capture_output=True, text=True, env=_env(), cwd="/")

    proc = run("status", "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["hook_file_installed"] is False
    assert run("install-hook").returncode == 0
    assert (tmp_path / _startup.PTH_NAME).read_text() == _startup.PTH_LINE
    proc = run("status", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["hook_file_installed"] and report["supported_attention"] == [
        "paged", "flashdecoding-ipex"]
    assert run("uninstall-hook").returncode == 0 and not (tmp_path / _startup.PTH_NAME).exists()


def test_importing_the_adapter_is_cheap():
    code = (
        "import sys, accel_plugin.adapters.tgi, accel_plugin.adapters.tgi._startup, accel_plugin.adapters.tgi._patches\n"
        "bad = [m for m in ('torch', 'triton', 'text_generation_server', 'loguru') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr


def test_the_adapter_reports_to_the_doctor_through_its_hook_module(monkeypatch):
    """accel.tgi is one of accel-plugin's own entry points; without TGI it has no section."""
    from accel_plugin.adapters.tgi import hooks
    from accel_plugin.plugins.manager import get_plugin_manager, plugin_names

    assert "accel.tgi" in plugin_names(get_plugin_manager({}))
    monkeypatch.setattr(hooks, "_tgi_installed", lambda: False)
    assert hooks.accel_doctor_report(environ={}) is None
    monkeypatch.setattr(hooks, "_tgi_installed", lambda: True)
    section = hooks.accel_doctor_report(environ={"ATTENTION": "paged"})
    assert list(section) == ["tgi_adapter"] and section["tgi_adapter"]["attention_env_supported"] is True
