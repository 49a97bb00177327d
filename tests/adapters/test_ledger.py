"""The patch-ledger mechanism both adapters share (adapters/_ledger.py): idempotent entries,
rollback on a failed apply, undo of every applied entry last first; and every entry of
both adapters' ledgers applied and undone in its real framework (vLLM here, TGI in its
own interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accel_plugin.adapters._ledger import Ledger, Patch, ProbedPatch

ROOT = Path(__file__).resolve().parents[2]
TGI_PYTHON = Path(os.environ.get("ACCEL_TGI_PYTHON", "~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python")).expanduser()
LEDGER_TEXT = dict(target="t", why="w", undo="u", upstream="up")


class Recording(Patch):
    def __init__(self, name, log, fail=False):
        super().__init__(name, **LEDGER_TEXT)
        self.log, self.fail = log, fail

    def _apply(self):
        if self.fail:
            raise RuntimeError(f"{self.name} failed")
        self.log.append(f"apply {self.name}")

    def _revert(self):
        self.log.append(f"revert {self.name}")


def test_apply_and_revert_are_idempotent_and_undo_all_goes_last_first():
    log = []
    a, b = Recording("a", log), Recording("b", log)
    ledger = Ledger(a, b)
    ledger.apply((a, b))
    ledger.apply((a, b))
    a.revert(), a.apply()
    assert ledger.applied() == [a, b] and log == ["apply a", "apply b", "revert a", "apply a"]
    ledger.undo_all()
    ledger.undo_all()
    assert ledger.applied() == [] and log[4:] == ["revert b", "revert a"]


def test_a_failed_apply_undoes_what_that_call_applied():
    log = []
    a, b, c = Recording("a", log), Recording("b", log), Recording("c", log, fail=True)
    ledger = Ledger(a, b, c)
    a.apply()
    with pytest.raises(RuntimeError, match="c failed"):
        ledger.apply((a, b, c))
    assert ledger.applied() == [a] and log == ["apply a", "apply b", "revert b"]
    with pytest.raises(ValueError, match="not an entry"):
        ledger.apply((Recording("stranger", log),))


def test_a_probed_entry_reads_its_state_and_may_have_no_undo():
    state = {"on": False}
    switch = ProbedPatch("switch", probe=lambda: state["on"], apply=lambda: state.update(on=True),
                         revert=lambda: state.update(on=False), **LEDGER_TEXT)
    name = ProbedPatch("name", probe=lambda: True, **LEDGER_TEXT)  # the framework cannot remove it
    ledger = Ledger(name, switch)
    state["on"] = True  # applied by the adapter directly: the ledger sees it
    assert ledger.applied() == [name, switch]
    ledger.undo_all()
    assert ledger.applied() == [name] and not state["on"]
    switch.apply()
    assert state["on"]
    with pytest.raises(RuntimeError, match="applied by its adapter only"):
        ProbedPatch("x", probe=lambda: False, **LEDGER_TEXT).apply()


# --- every entry of both adapters, applied and undone ---------------------------------------------

#: Runs in a fresh interpreter with the framework installed. For every entry of ``LEDGER``
#: (iterated, never listed), one at a time: read the target, apply, check it changed,
#: revert, check the target holds the identical objects again. An entry
#: the script cannot read (no ``state()`` and no reader for its kind) fails the test.
EXERCISE = textwrap.dedent("""
    import json, sys
    def same(a, b):
        if isinstance(a, tuple) and isinstance(b, tuple):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a is b or (isinstance(a, (str, int, float, frozenset, type(None))) and a == b)
    PREPARE = None
    READERS = {}
    exec(sys.argv[1])
    from importlib import import_module
    ledger = import_module(sys.argv[2]).LEDGER
    def read(entry):
        reader = READERS.get(type(entry).__name__)
        return reader(entry) if reader else entry.state()
    if PREPARE:
        PREPARE()
    out = {}
    for entry in ledger:  # one at a time (some stack only in some orders, e.g. TGI's 2 and 3)
        before = read(entry)
        entry.apply()
        out[entry.name] = {"applied": entry.applied, "changed": not same(read(entry), before),
                           "undoable": entry.undoable}
        entry.revert()
        out[entry.name].update(restored=same(read(entry), before), reverted=not entry.applied)
        ledger.undo_all()  # what the entry's apply stacked on (e.g. vLLM's metrics directory)
    print("LEDGER " + json.dumps(out))
""")

VLLM_PREPARE = """
from accel_plugin.adapters.vllm import _patches
def PREPARE():
    _patches.set_env_choice("ACCEL_PAGED", "paged")  # what the CPU_ATTN override points at
"""

#: TGI's entries read by kind (adapters/tgi/_patch_kinds.py), in TGI's own interpreter
TGI_PREPARE = """
import sys
from accel_plugin.adapters.tgi import _patches as tgi
def PREPARE():
    import_module(tgi.ATTENTION_PACKAGE)
    import_module(tgi.SPECULATION_MODULE)
def rebound(entry):
    names = sorted(entry._replacements())
    return tuple((m, n, id(mod.__dict__.get(n))) for m, mod in sorted(sys.modules.items())
                 if m == "text_generation_server" or m.startswith("text_generation_server.")
                 for n in names if hasattr(mod, "__dict__") and n in mod.__dict__)
def methods(entry):
    owner = getattr(sys.modules[entry.module], entry.owner)
    return tuple(owner.__dict__[name] for name in sorted(entry._wrappers()))
READERS = {"ImportHook": lambda entry: tuple(sys.meta_path), "RebindGlobals": rebound, "WrapMethods": methods}
"""


def _exercise(python: str, prepare: str, module: str, env: dict[str, str] | None = None) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    environ.update(env or {})
    proc = subprocess.run([python, "-c", EXERCISE, prepare, module], env=environ, capture_output=True,
                          text=True, timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("LEDGER "))[len("LEDGER "):])


def _working_tree(tmp_path: Path) -> str:
    """A PYTHONPATH entry importing this checkout as ``accel_plugin`` (with the package-dir
    mapping of pyproject.toml), for an interpreter with an installed copy of the package."""
    package = tmp_path / "accel_plugin"
    package.mkdir()
    for entry in (ROOT / "accel_plugin").iterdir():
        (package / entry.name).symlink_to(entry)
    for name in ("adapters", "kernels"):
        (package / name).symlink_to(ROOT / name)
    return str(tmp_path)


def _check(outcome: dict, module: str) -> None:
    assert outcome, f"{module}.LEDGER is empty"
    for name, entry in outcome.items():
        assert entry["applied"] and entry["changed"], f"{module} entry {name!r} not applied: {entry}"
        if entry["undoable"]:
            assert entry["reverted"] and entry["restored"], f"{module} entry {name!r} not undone: {entry}"
        else:  # documented in its undo text: the framework offers no way back
            assert not entry["reverted"] and not entry["restored"], entry


def test_every_entry_of_both_adapters_is_applied_and_undone(tmp_path):
    """Both adapters' ledgers, every entry: apply changes the target, revert puts the identical
    objects back (vLLM's backend names, which vLLM cannot remove, stay, as their entry says)."""
    pytest.importorskip("vllm", reason="needs vLLM (the vLLM adapter's ledger patches it)")
    vllm_outcome = _exercise(sys.executable, VLLM_PREPARE, "accel_plugin.adapters.vllm._patches")
    _check(vllm_outcome, "vLLM")
    assert [name for name, entry in vllm_outcome.items() if not entry["undoable"]] == ["backend names"]
    if not TGI_PYTHON.exists():
        pytest.skip(f"TGI's half needs a TGI environment: {TGI_PYTHON} not found (set ACCEL_TGI_PYTHON; "
                    f"see docs/tgi.md); the vLLM half passed")
    tgi_outcome = _exercise(str(TGI_PYTHON), TGI_PREPARE, "accel_plugin.adapters.tgi._patches",
                            env={"PYTHONPATH": _working_tree(tmp_path), "ATTENTION": "paged", "PREFIX_CACHING": "0"})
    _check(tgi_outcome, "TGI")


def test_both_adapters_keep_their_ledgers_in_this_mechanism():
    from accel_plugin.adapters.tgi import _patches as tgi_patches

    assert isinstance(tgi_patches.LEDGER, Ledger)
    assert [p.name for p in tgi_patches.LEDGER] == [
        "import hook", "attention functions", "Seqlen.max_k workaround", "draft-model speculation"]
    vllm_patches = pytest.importorskip("accel_plugin.adapters.vllm._patches", reason="needs vLLM")
    assert isinstance(vllm_patches.LEDGER, Ledger)
    assert [p.name for p in vllm_patches.LEDGER] == [
        "backend names", "selector", "CPU backend override", "CPU sampler fix", "metrics directory",
        "metrics collector", "metrics directory cleanup", "Ray worker environment", "no-draft sampling",
        "target native copies"]
    for patch in (*tgi_patches.LEDGER, *vllm_patches.LEDGER):
        assert patch.target and patch.why and patch.undo and patch.upstream
