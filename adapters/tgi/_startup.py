"""What the ``.pth`` file runs at interpreter start-up: a trigger that waits for TGI.

The wheel puts :data:`PTH_NAME` into site-packages (setup.py copies it there; an
editable install does not, see docs/tgi.md: ``python -m accel_plugin.adapters.tgi
install-hook`` writes it). Python's ``site`` module executes its one line,
:data:`PTH_LINE`, in every interpreter of that environment, so the line does as
little as it can:

- while ``ACCEL_ATTENTION_BACKEND`` and ``ACCEL_DRAFT_CONFIG`` are unset or empty it
  changes nothing (their values are validated later, when TGI imports its attention
  package or builds a model; here only their presence is tested);
- when one is set, it runs :data:`TRIGGER_SOURCE`: a finder written with the standard
  library alone, put first on ``sys.meta_path``, that answers nothing for any module
  and imports nothing, until ``text_generation_server`` (or one of its submodules)
  is looked up, or is found already imported. Then it takes itself off
  ``sys.meta_path``, imports ``accel_plugin.adapters.tgi`` and calls
  :func:`accel_plugin.adapters.tgi.install_import_hook` (the post-import finder,
  entry 1 of the ledger in :mod:`._patches`), and finds the module's spec through the
  finders now on ``sys.meta_path`` (so TGI's first module passes through that hook
  too). A failure to import accel-plugin is printed, not raised, and TGI starts with
  its own attention; a removed accel-plugin (a stale file left by ``install-hook``) is
  ignored.

So ``python -c pass``, pip, vLLM's processes or any script of the environment
import nothing of accel_plugin (nor pluggy), with the variables set or not
(``python -m benchmarks.startup_overhead`` measures the cost; docs/tgi.md has the
table). :func:`accel_plugin.adapters.tgi.uninstall` removes a trigger that never fired.

setup.py reads :data:`PTH_NAME` and :data:`PTH_LINE` from this file without importing
the package, so this module uses the standard library only and imports nothing of
the package.
"""

from __future__ import annotations

__all__ = ["PTH_LINE", "PTH_NAME", "TRIGGER_CLASS", "TRIGGER_OWNER", "TRIGGER_SOURCE"]

#: The file name in site-packages. Sorted after setuptools' ``__editable__.*.pth``,
#: so that an editable accel-plugin is importable when the trigger fires.
PTH_NAME = "accel_plugin_tgi.pth"

#: The trigger's class name and ``owner`` (``owner`` is the adapter's ``HOOK_OWNER``):
#: how :func:`._hook.find_trigger` recognises it on ``sys.meta_path``.
TRIGGER_CLASS = "ImportTrigger"
TRIGGER_OWNER = "accel-plugin-tgi"

#: The trigger, executed by :data:`PTH_LINE` in a namespace of its own.
TRIGGER_SOURCE = f'''\
import sys


class {TRIGGER_CLASS}:
    """accel-plugin's TGI trigger ({PTH_NAME}): imports accel_plugin's TGI adapter when
    text_generation_server is imported, and takes itself off sys.meta_path."""

    owner = "{TRIGGER_OWNER}"

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] != "text_generation_server" and "text_generation_server" not in sys.modules:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None  # fired already (another thread)
        try:
            from accel_plugin.adapters.tgi import install_import_hook
            install_import_hook()
        except Exception as exc:
            if not (isinstance(exc, ModuleNotFoundError) and exc.name == "accel_plugin"):
                print(f"accel-plugin: TGI import hook not installed: {{exc!r}}", file=sys.stderr)
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(name, path, target)
            if spec is not None:
                return spec
        return None

    def __repr__(self):
        return "<{TRIGGER_CLASS}: text_generation_server for {TRIGGER_OWNER}>"


sys.meta_path.insert(0, {TRIGGER_CLASS}())
'''

#: The ``.pth`` line (``site`` executes lines that start with ``import``). Once per process:
#: in a venv, CPython 3.11's ``site`` processes site-packages twice (``venv()``, then
#: ``main()``), and the trigger is not needed where our hook or trigger is there already.
PTH_LINE = (
    'import os, sys; (os.environ.get("ACCEL_ATTENTION_BACKEND", "").strip() '
    'or os.environ.get("ACCEL_DRAFT_CONFIG", "").strip()) '
    f'and not any(getattr(f, "owner", None) == "{TRIGGER_OWNER}" for f in sys.meta_path) '
    f'and exec({TRIGGER_SOURCE!r}, {{"__name__": "accel_plugin_tgi_trigger"}})\n'
)
