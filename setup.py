"""Only the build step pyproject.toml cannot declare: ship TGI's activation file.

The wheel carries ``accel_plugin_tgi.pth`` at its root, so pip puts it into
site-packages, where Python runs its one line at start-up (it does nothing unless
ACCEL_ATTENTION_BACKEND or ACCEL_DRAFT_CONFIG is set, and then only puts a
standard-library trigger on sys.meta_path that waits for TGI's import; see
adapters/tgi/_startup.py and docs/tgi.md).
Editable installs do not get it: ``python -m accel_plugin.adapters.tgi install-hook``.
Everything else is in pyproject.toml.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


def _startup():
    """adapters/tgi/_startup.py, loaded without importing the package (its deps are not here)."""
    path = Path(__file__).resolve().parent / "adapters" / "tgi" / "_startup.py"
    spec = importlib.util.spec_from_file_location("_accel_tgi_startup", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithPth(build_py):
    """build_py, plus the .pth file at the root of build_lib (so at the wheel's root)."""

    def run(self):
        super().run()
        if not self.editable_mode:
            startup = _startup()
            target = Path(self.build_lib) / startup.PTH_NAME
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(startup.PTH_LINE, encoding="utf-8")

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs.append(str(Path(self.build_lib) / _startup().PTH_NAME))
        return outputs


setup(cmdclass={"build_py": BuildPyWithPth})
