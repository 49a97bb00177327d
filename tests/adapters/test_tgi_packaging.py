"""How the TGI activation file gets into an environment (the wheel, ``install-hook``), and what its
line does: a trigger that imports nothing until TGI is imported."""

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
    "print(int(any(m == 'accel_plugin' or m.startswith('accel_plugin.') for m in sys.modules)), "
    "int('pluggy' in sys.modules), "
    "sum(type(f).__name__ == 'ImportTrigger' and f.owner == 'accel-plugin-tgi' for f in sys.meta_path), "
    "sum(type(f).__name__ == 'PostImportFinder' and f.owner == 'accel-plugin-tgi' for f in sys.meta_path), "
    "int('torch' in sys.modules))"
)
#: accel_plugin or pluggy imported, triggers waiting, post-import hooks, torch imported
NOTHING = ["0", "0", "0", "0", "0"]
WAITING = ["0", "0", "1", "0", "0"]


def _env(**values):
    env = {k: v for k, v in os.environ.items() if k not in ("ACCEL_ATTENTION_BACKEND", "ACCEL_DRAFT_CONFIG")}
    env.update({k: v for k, v in values.items() if v is not None})
    return env


def _probe_site_dir(site_dir: Path, before: str = "", after: str = "", pythonpath: Path | None = None,
                    **env) -> list[str]:
    """Start Python with ``site_dir`` processed as a site-packages folder (its .pth files run), run
    ``before``, import the fake TGI under ``pythonpath`` as asked by ``after``, then probe."""
    code = f"import site; site.addsitedir({str(site_dir)!r})\n{before}\n{after}\n" + PROBE
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    proc = subprocess.run([sys.executable, "-c", code], env=_env(**env), check=False, capture_output=True, text=True,
                          cwd="/")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def _fake_tgi(root: Path) -> Path:
    """The smallest ``text_generation_server`` the trigger and the hook can meet: the package,
    and an empty attention package (a bad ACCEL_ATTENTION_BACKEND is refused when it is imported)."""
    for rel in ("__init__.py", "layers/__init__.py", "layers/attention/__init__.py"):
        path = root / "text_generation_server" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root


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


def test_the_pth_line_imports_nothing_and_waits_only_when_a_variable_is_set(tmp_path):
    (tmp_path / _startup.PTH_NAME).write_text(_startup.PTH_LINE)
    assert _probe_site_dir(tmp_path) == NOTHING
    assert _probe_site_dir(tmp_path, ACCEL_ATTENTION_BACKEND=" ") == NOTHING
    # A variable set: a trigger waits, and neither accel_plugin, pluggy nor torch is imported.
    assert _probe_site_dir(tmp_path, ACCEL_ATTENTION_BACKEND="flash") == WAITING
    assert _probe_site_dir(tmp_path, ACCEL_DRAFT_CONFIG="/srv/drafts.yaml") == WAITING
    # A bad value is only refused when TGI imports its attention: other programs start normally.
    assert _probe_site_dir(tmp_path, ACCEL_ATTENTION_BACKEND="bogus") == WAITING
    # Other imports, with the trigger in front of every one of them, leave it waiting.
    assert _probe_site_dir(tmp_path, after="import json, email.mime.text", ACCEL_ATTENTION_BACKEND="flash") == WAITING
    # Once per process: a venv's site-packages is processed twice by CPython 3.11's site.
    twice = f"site.addsitedir({str(tmp_path)!r}); exec(open({str(tmp_path / _startup.PTH_NAME)!r}).read())"
    assert _probe_site_dir(tmp_path, before=twice, ACCEL_ATTENTION_BACKEND="flash") == WAITING


def test_importing_tgi_fires_the_trigger_once_into_the_import_hook(tmp_path):
    (tmp_path / _startup.PTH_NAME).write_text(_startup.PTH_LINE)
    fake = _fake_tgi(tmp_path / "fake")
    after = ("import text_generation_server.layers\n"
             "from accel_plugin.adapters.tgi import _patches\n"
             "assert _patches.IMPORT_HOOK.applied and _patches.IMPORT_HOOK.present\n"
             "import text_generation_server as t\n"
             "assert type(t.__spec__.loader).__name__ != '_CallbackLoader'  # the hook put TGI's loader back\n")
    # accel_plugin (with pluggy) is imported now, the trigger is gone, the hook is first on sys.meta_path
    assert _probe_site_dir(tmp_path, after=after, pythonpath=fake, ACCEL_DRAFT_CONFIG="/srv/x.yaml") == [
        "1", "1", "0", "1", "0"]
    unset = _probe_site_dir(tmp_path, after="import text_generation_server.layers", pythonpath=fake)
    assert unset == NOTHING  # no variable: TGI imports alone


def test_a_bad_value_is_refused_when_tgi_imports_its_attention_through_the_trigger(tmp_path):
    (tmp_path / _startup.PTH_NAME).write_text(_startup.PTH_LINE)
    fake = _fake_tgi(tmp_path / "fake")
    code = f"import site; site.addsitedir({str(tmp_path)!r}); import text_generation_server.layers.attention"
    proc = subprocess.run([sys.executable, "-c", code], env=_env(ACCEL_ATTENTION_BACKEND="bogus", PYTHONPATH=str(fake)),
                          check=False, capture_output=True, text=True, cwd="/")
    assert proc.returncode != 0 and "EnvVarError" in proc.stderr and "flash, paged, auto" in proc.stderr


def test_the_trigger_fires_and_leaves_when_tgi_was_imported_past_it(tmp_path):
    """TGI imported without the trigger seeing it (another finder in front): the next import fires it."""
    (tmp_path / _startup.PTH_NAME).write_text(_startup.PTH_LINE)
    fake = _fake_tgi(tmp_path / "fake")
    before = ("import sys\n"
              "trigger = sys.meta_path.pop(0)\n"
              "import text_generation_server\n"
              "sys.meta_path.insert(0, trigger)\n")
    assert _probe_site_dir(tmp_path, before=before, after="import colorsys", pythonpath=fake,
                           ACCEL_ATTENTION_BACKEND="flash") == ["1", "1", "0", "1", "0"]


def test_a_removed_accel_plugin_leaves_the_stale_line_harmless(tmp_path):
    """A .pth file written by install-hook outlives an uninstalled accel-plugin: TGI imports alone."""
    (tmp_path / _startup.PTH_NAME).write_text(_startup.PTH_LINE)
    fake = _fake_tgi(tmp_path / "fake")
    hide = ("import sys\n"
            "class Hide:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'accel_plugin':\n"
            "            raise ModuleNotFoundError('No module named accel_plugin', name='accel_plugin')\n"
            "sys.meta_path.insert(1, Hide())\n")
    code = (f"import site; site.addsitedir({str(tmp_path)!r})\n{hide}import text_generation_server.layers\n"
            "print(len([f for f in sys.meta_path if getattr(f, 'owner', None) == 'accel-plugin-tgi']))")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(ACCEL_ATTENTION_BACKEND="flash", PYTHONPATH=str(fake)),
                          check=False, capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0 and proc.stdout.split() == ["0"] and proc.stderr == "", proc.stderr


def test_uninstall_removes_a_trigger_that_never_fired(monkeypatch):
    from accel_plugin.adapters import tgi
    from accel_plugin.adapters.tgi import _hook, _names

    assert _startup.TRIGGER_OWNER == _names.HOOK_OWNER  # _startup cannot import _names (setup.py loads it alone)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    exec(_startup.TRIGGER_SOURCE, {"__name__": "trigger_test"})  # noqa: S102  (what the .pth line runs)
    trigger = sys.meta_path[0]
    assert _hook.find_trigger(_names.HOOK_OWNER) is trigger and tgi.status()["hook_in_process"]
    assert trigger.find_spec("json", None) is None  # anything but TGI: not its business
    tgi.uninstall()
    assert _hook.find_trigger(_names.HOOK_OWNER) is None and trigger not in sys.meta_path


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
