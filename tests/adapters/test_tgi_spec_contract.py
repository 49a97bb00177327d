"""Contract tests of the TGI adapter's draft-model speculation against a fake TGI.

The fake ``text_generation_server`` is the attention contract test's tree
(test_tgi_contract.py: module names, attention package, IPEX-layout KV cache) plus
``utils/speculate.py`` and a ``models/flash_causal_lm.py`` whose ``FlashCausalLM``
keeps TGI v3.3.7's contract with the adapter:

* the model has ``model_id`` (a local directory), ``tokenizer``, ``config``, ``dtype``,
  ``device``, ``world_size``, ``batch_type`` (``FlashCausalLMBatch``) and
  ``model.lm_head.speculator`` (``None`` unless Medusa/MLP heads);
* ``generate_token(batch) -> (generations, next_batch | None, timings)``; a batch has
  ``requests[i].id``, ``prompt_lengths``, ``all_input_ids_tensor`` (``[B, max_length]``),
  ``cache_lengths_tensor``, ``input_ids`` (last sampled token), ``speculative_ids``,
  ``prefilling``, ``filter(ids)`` and ``concatenate(batches)`` (ids kept only when
  every batch has them); after a step row ``i`` knows ``cache_lengths_tensor[i] + 1``
  tokens; a decode step verifies ``speculative_ids`` by exact prefix match against
  the greedy target (a real tiny Llama through transformers), and a stopped request's
  ``Generation`` carries ``generated_text`` and tokens cut at the stop. Like TGI's
  n-gram, it proposes ids of its own (zeros) whenever ``get_speculate() > 0``.

integration/test_tgi_speculative.py runs the real TGI.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from accel_plugin.adapters import tgi
from accel_plugin.adapters.tgi import _compat, _loguru, _patches, _startup, _tgi, _wrappers, speculative

from accel_plugin import envs
from accel_plugin.speculative.draft_config import DraftConfigError

_spec = importlib.util.spec_from_file_location("_tgi_attention_contract", Path(__file__).with_name("test_tgi_contract.py"))
_attention_contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_attention_contract)

PKG = "text_generation_server"
FLASH = f"{PKG}.models.flash_causal_lm"
LLAMA = f"{PKG}.models.custom_modeling.flash_llama_modeling"

FAKE_SPECULATION = {
    "utils/speculate.py": """
        SPECULATE = None

        def get_speculate():
            return SPECULATE

        def set_speculate(speculate):
            global SPECULATE
            SPECULATE = speculate
    """,
    "models/flash_causal_lm.py": """
        import time
        from types import SimpleNamespace

        import torch
        from text_generation_server.layers.attention import Seqlen
        from text_generation_server.utils.speculate import get_speculate

        PREFILL_SLEEP = 0.0  # seconds a prefill takes on top of its work (the clock test)

        class Generation:
            def __init__(self, request_id, token_ids, generated_text):
                self.request_id, self.generated_text = request_id, generated_text
                self.tokens = SimpleNamespace(token_ids=token_ids)

        class FlashCausalLMBatch:
            def __init__(self, requests, max_new_tokens, prompts, width):
                self.requests, self.max_new_tokens = list(requests), list(max_new_tokens)
                self.stopping_criterias = [SimpleNamespace(max_new_tokens=n) for n in max_new_tokens]
                self.prompt_lengths = [len(p) for p in prompts]
                self.all_input_ids_tensor = torch.zeros(len(prompts), width, dtype=torch.int64)
                for i, p in enumerate(prompts):
                    self.all_input_ids_tensor[i, : len(p)] = torch.tensor(p)
                self.cache_lengths_tensor = torch.zeros(len(prompts), dtype=torch.int32)
                self.input_ids = torch.zeros(len(prompts), dtype=torch.int64)
                self.generated = [0] * len(prompts)
                self.speculative_ids, self.prefilling = None, True

            @classmethod
            def from_prompts(cls, ids, prompts, max_new_tokens):
                width = max(len(p) + n for p, n in zip(prompts, max_new_tokens)) + (get_speculate() or 0)
                return cls([SimpleNamespace(id=i) for i in ids], max_new_tokens, prompts, width)

            def __len__(self):
                return len(self.requests)

            def _rows(self, rows):
                out = FlashCausalLMBatch.__new__(FlashCausalLMBatch)
                for name in ("requests", "max_new_tokens", "stopping_criterias", "prompt_lengths", "generated"):
                    setattr(out, name, [getattr(self, name)[i] for i in rows])
                for name in ("all_input_ids_tensor", "cache_lengths_tensor", "input_ids"):
                    setattr(out, name, getattr(self, name)[rows])
                out.speculative_ids = None if self.speculative_ids is None else self.speculative_ids[rows]
                out.prefilling = self.prefilling
                return out

            def filter(self, request_ids):
                return self._rows([i for i, r in enumerate(self.requests) if r.id in set(request_ids)])

            @classmethod
            def concatenate(cls, batches):
                out = FlashCausalLMBatch.__new__(FlashCausalLMBatch)
                for name in ("requests", "max_new_tokens", "stopping_criterias", "prompt_lengths", "generated"):
                    setattr(out, name, [x for b in batches for x in getattr(b, name)])
                # as TGI: room for each batch's speculative width *now* (0 without ids)
                width = max(p + n + (0 if b.speculative_ids is None else b.speculative_ids.shape[1])
                            for b in batches for p, n in zip(b.prompt_lengths, b.max_new_tokens))
                out.all_input_ids_tensor = torch.cat([torch.nn.functional.pad(b.all_input_ids_tensor[:, :width],
                    (0, width - min(width, b.all_input_ids_tensor.shape[1]))) for b in batches])
                out.cache_lengths_tensor = torch.cat([b.cache_lengths_tensor for b in batches])
                out.input_ids = torch.cat([b.input_ids for b in batches])
                keep = get_speculate() > 0 and all(b.speculative_ids is not None for b in batches)
                out.speculative_ids = torch.cat([b.speculative_ids for b in batches]) if keep else None
                out.prefilling = False
                return out

        class FlashCausalLM:
            def __init__(self, model_id, dtype=torch.float32, world_size=1, speculator=None):
                from transformers import AutoModelForCausalLM, AutoTokenizer

                self.model_id, self.dtype, self.device, self.world_size = model_id, dtype, torch.device("cpu"), world_size
                self.tokenizer = AutoTokenizer.from_pretrained(model_id)
                self.hf = AutoModelForCausalLM.from_pretrained(model_id, torch_dtype=dtype).eval()
                self.config = self.hf.config
                self.model = SimpleNamespace(lm_head=SimpleNamespace(speculator=speculator))
                self.verified_widths = []

            @property
            def batch_type(self):
                return FlashCausalLMBatch

            def _choices(self, ids):
                with torch.no_grad():
                    return self.hf(torch.tensor([ids])).logits[0].argmax(-1).tolist()

            def generate_token(self, batch):
                prefill, spec = batch.prefilling, batch.speculative_ids
                if prefill and PREFILL_SLEEP:
                    time.sleep(PREFILL_SLEEP)
                self.verified_widths.append(None if spec is None else spec.shape[1])
                generations, done = [], True
                for i, request in enumerate(batch.requests):
                    n = batch.prompt_lengths[i] if prefill else int(batch.cache_lengths_tensor[i]) + 1
                    drafts = [] if spec is None else spec[i].tolist()
                    choices = self._choices(batch.all_input_ids_tensor[i, :n].tolist() + drafts)[n - 1:]
                    new = [choices[0]]
                    for j, draft in enumerate(drafts):
                        if draft != choices[j]:
                            break
                        new.append(choices[j + 1])
                    left = batch.max_new_tokens[i] - batch.generated[i]
                    batch.all_input_ids_tensor[i, n : n + len(new)] = torch.tensor(new)
                    batch.cache_lengths_tensor[i] = n + len(new) - 1
                    batch.input_ids[i] = new[-1]
                    batch.generated[i] += min(left, len(new))
                    stop = len(new) >= left
                    generations.append(Generation(request.id, new[:left], "done" if stop else None))
                    done = done and stop
                batch.prefilling = False
                s = get_speculate() or 0
                batch.speculative_ids = torch.zeros(len(batch), s, dtype=torch.int64) if s else None  # "n-gram"
                return generations, None if done else batch, (0, 0)
    """,
}

TEXTS = ["Customer: my refund ticket #123 is late", "def foo(a, b):", "The model is", "Where is my delivery? order 55",
         "my phone is broken again", "A small prompt answer"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from accel_plugin.testing.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("spec-models")
    return {"target": build_tiny_model("gqa-d64", root), "poor": build_tiny_model("draft-d32", root, seed=7)}


@pytest.fixture
def write_config(tmp_path, models):
    def write(k_max=3, controller="{adaptive: true, min_samples: 4, probe_interval: 8}", default=None):
        path = tmp_path / "drafts.yaml"
        path.write_text(textwrap.dedent(f"""
            # a comment line first, so that num_speculative_tokens is on line 3
            num_speculative_tokens: {k_max}
            domains:
              support:
                draft: {models['target']}
                match: {{keywords: [refund, delivery, order]}}
              broken:
                draft: {models['target']}
                match: {{keywords: [broken]}}
            default:
              draft: {default or models['poor']}
            controller: {controller}
        """).lstrip("\n"))
        return path

    return write


@pytest.fixture
def fake_tgi(tmp_path, monkeypatch):
    """``fake_tgi(draft_config=None, backend=None)``: a fresh fake TGI first on sys.path, the
    variables set, the hook installed; uninstalled afterwards."""

    def make(draft_config=None, backend=None, attention="flashdecoding-ipex"):
        monkeypatch.setattr(_compat, "TGI_VERSION", "2.0.5.dev0")  # the fake has no metadata
        monkeypatch.setenv("ATTENTION", attention)
        for name, value in ((envs.ACCEL_DRAFT_CONFIG, draft_config), (envs.ACCEL_ATTENTION_BACKEND, backend)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(value))
        root = tmp_path / "fake"
        _attention_contract.write_fake_tgi(root, FAKE_SPECULATION)
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        _attention_contract._forget_tgi()
        tgi.install_import_hook()
        return importlib.import_module(FLASH)

    yield make
    tgi.uninstall()
    _attention_contract._forget_tgi()


def set_speculate(n):
    importlib.import_module(f"{PKG}.utils.speculate").set_speculate(n)


def serve(model, texts, *, speculate, max_new_tokens=12, join=False):
    """Greedy ids per prompt, as TGI's router drives the model: prefill, decode, filter the
    stopped, and (``join``) a second batch prefilled alone and concatenated after two steps."""
    flash = sys.modules[FLASH]
    set_speculate(speculate)
    ids = [model.tokenizer(t)["input_ids"] for t in texts]
    news = [max_new_tokens - (i % 3) * 3 for i in range(len(texts))]  # requests stop at different steps
    out, half, steps = {i: [] for i in range(len(texts))}, len(texts) // 2 if join else len(texts), 0

    def run(batch):
        generations, batch, _ = model.generate_token(batch)
        for g in generations:
            out[g.request_id] += g.tokens.token_ids
        stopped = {g.request_id for g in generations if g.generated_text is not None}
        if batch is not None and stopped:
            keep = [r.id for r in batch.requests if r.id not in stopped]
            batch = batch.filter(keep) if keep else None
        return batch

    batch = run(flash.FlashCausalLMBatch.from_prompts(range(half), ids[:half], news[:half]))
    while batch is not None:
        if join and steps == 2:
            late = run(flash.FlashCausalLMBatch.from_prompts(range(half, len(texts)), ids[half:], news[half:]))
            batch = flash.FlashCausalLMBatch.concatenate([batch, late]) if late is not None else batch
        batch = run(batch)
        steps += 1
    return [out[i] for i in range(len(texts))]


def build(flash, speculate=3, **kwargs):
    set_speculate(speculate)
    model_id = kwargs.pop("model_id")
    return flash.FlashCausalLM(model_id=str(model_id), **kwargs)


# ------------------------------------------------------------------ activation


def test_draft_config_alone_wraps_flash_causal_lm_and_uninstall_restores_it(fake_tgi, write_config):
    flash = fake_tgi(draft_config=write_config())
    assert _patches.DRAFT_SPECULATION.applied and not _patches.ATTENTION_FUNCTIONS.applied
    assert flash.FlashCausalLM.generate_token.__accel_wrapped__ is not None
    assert sorted(_patches.DRAFT_SPECULATION.wrapped()) == ["FlashCausalLM.__init__", "FlashCausalLM.generate_token"]
    assert tgi.status()["speculation_patched"] and tgi.status()["draft_config_env"]
    originals = {a: flash.FlashCausalLM.__dict__[a].__accel_wrapped__ for a in ("__init__", "generate_token")}
    tgi.activate_speculation()  # idempotent
    assert flash.FlashCausalLM.__dict__["__init__"].__accel_wrapped__ is originals["__init__"]
    tgi.uninstall()
    assert all(flash.FlashCausalLM.__dict__[a] is f for a, f in originals.items())
    assert not any(p.applied for p in _patches.LEDGER)


def test_nothing_is_patched_without_the_variable(fake_tgi, models):
    flash = fake_tgi()
    assert not hasattr(flash.FlashCausalLM.generate_token, "__accel_wrapped__")
    assert speculative.of(build(flash, model_id=models["target"])) is None


def test_every_ledger_entry_is_documented_applied_and_undone(fake_tgi, write_config, models):
    flash = fake_tgi(draft_config=write_config(), backend="flash")
    build(flash, model_id=models["target"])  # our attention: no Seqlen.max_k workaround
    assert [p.name for p in _patches.applied()] == ["import hook", "attention functions", "draft-model speculation"]
    tgi.uninstall()
    flash = fake_tgi(draft_config=write_config())
    build(flash, model_id=models["target"])  # TGI's attention: the workaround too
    assert [p.name for p in _patches.applied()] == ["import hook", "Seqlen.max_k workaround", "draft-model speculation"]
    for patch in _patches.LEDGER:
        assert patch.target and patch.why and patch.undo and patch.upstream
        assert f"The {patch.name}" in _patches.__doc__
    tgi.uninstall()
    assert not any(p.applied for p in _patches.LEDGER) and speculative.live() == []


def test_the_pth_line_installs_the_hook_for_the_draft_config_alone(tmp_path):
    (tmp_path / _startup.PTH_NAME).write_text(_startup.PTH_LINE)
    code = (f"import site, sys; site.addsitedir({str(tmp_path)!r}); "
            "print(sum(getattr(f, 'owner', None) == 'accel-plugin-tgi' for f in sys.meta_path), int('torch' in sys.modules))")

    def probe(**env):
        base = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
        proc = subprocess.run([sys.executable, "-c", code], env={**base, **env}, check=False, capture_output=True,
                              text=True, cwd="/")
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert probe() == ["0", "0"]
    assert probe(ACCEL_DRAFT_CONFIG="/srv/drafts.yaml") == ["1", "0"]


# ------------------------------------------------------------------ start-up checks


def test_draft_config_without_speculate_is_refused_naming_the_flag(fake_tgi, write_config, models):
    flash = fake_tgi(draft_config=write_config())
    with pytest.raises(_tgi.SpeculationConfigError, match="--speculate 3.*or unset ACCEL_DRAFT_CONFIG"):
        build(flash, speculate=0, model_id=models["target"])


def test_k_max_above_speculate_is_refused_naming_both(fake_tgi, write_config, models):
    path = write_config(k_max=4)
    flash = fake_tgi(draft_config=path)
    with pytest.raises(DraftConfigError) as info:
        build(flash, speculate=2, model_id=models["target"])
    assert f"{path}:2: num_speculative_tokens: 4 exceeds TGI's --speculate 2" in str(info.value)
    assert "lower num_speculative_tokens to 2 or start TGI with --speculate 4" in str(info.value)


@pytest.mark.parametrize("kwargs, match", [
    ({"world_size": 2}, "one shard only"),
    ({"speculator": object()}, "Medusa or MLP speculator"),
])
def test_unsupported_targets_are_refused(fake_tgi, write_config, models, kwargs, match):
    flash = fake_tgi(draft_config=write_config())
    with pytest.raises(_tgi.SpeculationConfigError, match=match):
        build(flash, model_id=models["target"], **kwargs)


def test_a_draft_with_another_vocabulary_is_refused(fake_tgi, write_config, tmp_path, models):
    from accel_plugin.testing.tiny_models import build_tiny_model

    other = build_tiny_model("draft-d32", tmp_path / "other", vocab_size=512)
    flash = fake_tgi(draft_config=write_config(default=other))
    with pytest.raises(DraftConfigError, match="default.draft"):
        build(flash, model_id=models["target"])


# ------------------------------------------------------------------ the max_k workaround


def test_seqlen_max_k_workaround_wraps_tgi_attention_and_gives_way_to_ours(fake_tgi, write_config, models):
    flash = fake_tgi(draft_config=write_config())
    ipex = importlib.import_module(f"{PKG}.layers.attention.ipex")
    llama = importlib.import_module(LLAMA)
    build(flash, model_id=models["target"])
    assert llama.paged_attention.__accel_max_k__ and llama.paged_attention.__wrapped__ is ipex.paged_attention
    tgi.activate("flash")  # our attention never reads max_k: the workaround goes
    assert not _patches.SEQLEN_MAX_K.applied and llama.paged_attention.__module__.endswith("tgi.attention")
    tgi.uninstall()
    assert llama.paged_attention is ipex.paged_attention


def test_the_workaround_raises_max_k_to_max_s():
    seen = []
    wrapper = _wrappers.with_full_max_k(lambda q, c, m, s, b, seqlen, max_s, **kw: seen.append((seqlen.max_k, kw)))
    seqlen = type("Seqlen", (), {"max_k": 8})()
    wrapper(None, None, None, 1.0, None, seqlen, 11, kv_scales="scales")
    wrapper(None, None, None, 1.0, None, seqlen, 9, kv_scales="scales")  # never lowered
    assert seen == [(11, {"kv_scales": "scales"}), (11, {"kv_scales": "scales"})]


# ------------------------------------------------------------------ decoding


@pytest.mark.parametrize("join", [False, True])
def test_lossless_and_counters_agree_with_what_tgi_accepted(fake_tgi, write_config, models, join):
    flash = fake_tgi(draft_config=write_config())
    model = build(flash, model_id=models["target"])
    plain = serve(model, TEXTS, speculate=0, join=join)
    assert model.verified_widths == [None] * len(model.verified_widths)
    spec = speculative.of(model)
    assert spec.proposer_name == "ACCEL_DOMAIN_DRAFT"
    assert serve(model, TEXTS, speculate=3, join=join) == plain
    stats, counters = tgi.speculation_stats(model), spec.counters
    support = stats["support"]
    assert support["alpha"] == 1.0 and support["accepted"] == support["drafted"] > 0  # identical draft
    assert counters.accepted == sum(s["accepted"] for s in stats.values())
    # what TGI verified, minus the ids of requests that stopped before their next step
    assert 0 < counters.verified_tokens <= counters.draft_tokens + counters.pad_tokens
    widths = [w for w in model.verified_widths if w is not None]
    assert widths and max(widths) <= 3
    assert counters.prefills == (2 if join else 1)


def test_the_first_step_after_a_prefill_is_plain(fake_tgi, write_config, models):
    flash = fake_tgi(draft_config=write_config(controller="{adaptive: false}"))
    model = build(flash, model_id=models["target"])
    serve(model, ["The model is"], speculate=3)  # the default domain: a poor draft, fixed k
    # the prefill, then its first decode (TGI's own "n-gram" ids dropped), then width k
    assert model.verified_widths[:3] == [None, None, 3]


def test_a_request_id_used_again_is_a_new_request(fake_tgi, write_config, models):
    flash = fake_tgi(draft_config=write_config(controller="{adaptive: false}"))
    model = build(flash, model_id=models["target"])
    serve(model, ["The model is a small prompt answer and more"], speculate=3, max_new_tokens=20)
    del model.verified_widths[:]
    serve(model, ["my refund"], speculate=3)  # request id 0 again, a shorter context
    assert model.verified_widths[:3] == [None, None, 3]
    assert tgi.speculation_stats(model)["support"]["drafted"] > 0


def test_steps_without_drafts_are_plain(fake_tgi, write_config, models):
    flash = fake_tgi(draft_config=write_config(default="null"))
    model = build(flash, model_id=models["target"])
    serve(model, ["The model is", "A small prompt answer"], speculate=3)  # no draft for unmatched prompts
    assert model.verified_widths == [None] * len(model.verified_widths)
    assert speculative.of(model).counters.verify_steps == 0


def test_the_proposer_clock_stops_while_a_prefill_runs(fake_tgi, write_config, models):
    flash = fake_tgi(draft_config=write_config())
    model = build(flash, model_id=models["target"])
    flash.PREFILL_SLEEP = 0.3
    clock = speculative.of(model).clock
    wall, start = time.perf_counter(), clock()
    serve(model, TEXTS[:2], speculate=3, max_new_tokens=4)
    assert time.perf_counter() - wall - (clock() - start) >= 0.3


def test_a_failing_draft_switches_its_domain_off_and_serving_continues(fake_tgi, write_config, models, caplog):
    flash = fake_tgi(draft_config=write_config())
    model = build(flash, model_id=models["target"])
    plain = serve(model, TEXTS, speculate=0)
    engine = speculative.of(model).core.engine
    real = engine.draft
    calls = {"n": 0}

    def draft(path, jobs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault: draft forward failed")
        return real(path, jobs)

    engine.draft = draft
    assert serve(model, TEXTS, speculate=3) == plain
    stats = tgi.speculation_stats(model)
    failed = [d for d, s in stats.items() if s["state"] == "failed"]
    assert failed and all("injected fault" in stats[d]["error"] for d in failed)


def test_any_other_failure_switches_speculation_off_for_the_model(fake_tgi, write_config, models):
    flash = fake_tgi(draft_config=write_config())
    model = build(flash, model_id=models["target"])
    plain = serve(model, TEXTS, speculate=0)
    spec = speculative.of(model)
    spec.core.propose = lambda *a, **kw: 1 / 0
    assert serve(model, TEXTS, speculate=3) == plain
    assert spec.error.startswith("ZeroDivisionError")
    assert all(w is None for w in model.verified_widths)


def test_the_proposer_logs_through_tgi_logger(fake_tgi, write_config, models):
    from loguru import logger

    lines = []
    sink = logger.add(lines.append, level="INFO", format="{name} | {message}")
    try:
        flash = fake_tgi(draft_config=write_config())
        model = build(flash, model_id=models["target"])
        logging.getLogger(_loguru.LOGGER_NAME).info("speculation: %s", "summary")
    finally:
        logger.remove(sink)
    text = "".join(lines)
    assert "accel-plugin: draft-model speculation (ACCEL_DOMAIN_DRAFT) replaces TGI's n-gram proposals" in text
    assert "text_generation_server.accel_plugin | speculation: summary" in text
    assert speculative.of(model).num_speculative_tokens == 3
