"""The patch-ledger mechanism both adapters share (adapters/_ledger.py): idempotent entries,
rollback on a failed apply, undo of every applied entry last first."""

from __future__ import annotations

import pytest

from accel_plugin.adapters._ledger import Ledger, Patch, ProbedPatch

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


def test_both_adapters_keep_their_ledgers_in_this_mechanism():
    from accel_plugin.adapters.tgi import _patches as tgi_patches

    assert isinstance(tgi_patches.LEDGER, Ledger)
    assert [p.name for p in tgi_patches.LEDGER] == [
        "import hook", "attention functions", "Seqlen.max_k workaround", "draft-model speculation"]
    vllm_patches = pytest.importorskip("accel_plugin.adapters.vllm._patches", reason="needs vLLM")
    assert isinstance(vllm_patches.LEDGER, Ledger)
    assert [p.name for p in vllm_patches.LEDGER] == [
        "backend names", "selector", "CPU backend override", "CPU sampler fix"]
    for patch in (*tgi_patches.LEDGER, *vllm_patches.LEDGER):
        assert patch.target and patch.why and patch.undo and patch.upstream
