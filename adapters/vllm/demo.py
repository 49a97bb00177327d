"""The vLLM side of `accel demo`: engines side by side, timed generation interleaved.

vLLM is imported here, inside the adapter, never by the core. Each configuration
(plain decoding, speculation with one draft YAML, ...) gets an engine of its own,
in a worker process of its own::

    python -m accel_plugin.adapters.vllm.demo '{"target": ..., "warmup": ..., ...}'

The worker starts vLLM in single-process mode (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
set by :func:`run_side_by_side`), so the domain proposer lives in the worker and
its per-domain counters are read directly. It runs the untimed warm-up, prints
``READY {json}``, then answers one JSON command per stdin line (a timed
``generate``) with ``RESULT {json}``; an empty line or ``{"quit": true}`` ends it
with ``DONE {json}`` (final counters).

:func:`run_side_by_side` starts the workers one after another (each waits idle
once ready) and then sends every timed entry to every engine in turn, repeat after
repeat, rotating which engine goes first. Only one engine runs at a time, so the
engines never compete for the CPU, and a slow spell of a shared machine tends to
hit the engines of one round alike instead of whichever happened to run then.
Every repeat's time is returned (``seconds_all``, in round order), so that the
caller can compare the configurations round by round (``accel demo`` takes the
median of those paired ratios).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from accel_plugin.demo.peers import worker_pythonpath

PROPOSER = "accel_plugin.adapters.vllm.DomainDraftProposer"
_COUNTERS = ("steps", "drafted", "accepted")


def spec_config(num_speculative_tokens: int = 5) -> dict:
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": num_speculative_tokens}


def _method(llm: Any) -> str | None:
    """The speculative method vLLM really runs (from its own config; ``None``: none)."""
    spec = getattr(llm.llm_engine.vllm_config, "speculative_config", None)
    return getattr(spec, "method", None) if spec is not None else None


def _spec_counters(llm: Any) -> dict:
    from ._compat import SPEC_DECODE_METRIC_PREFIX

    out: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith(SPEC_DECODE_METRIC_PREFIX):
            key = metric.name.removeprefix(SPEC_DECODE_METRIC_PREFIX)
            out[key] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


def _attention_backends(worker: Any) -> list[str]:
    """Runs in the worker (``collective_rpc``): the backend of every attention layer."""
    from ._compat import attention_backend_names

    return attention_backend_names(worker.vllm_config)


def _emit(kind: str, payload: dict) -> None:
    print(f"{kind} {json.dumps(payload)}", flush=True)


def _compilation(llm) -> str | None:
    """vLLM's compilation mode of this engine, read back (``NONE`` where eager)."""
    mode = getattr(getattr(llm.llm_engine.vllm_config, "compilation_config", None), "mode", None)
    return None if mode is None else getattr(mode, "name", str(mode))


class _Engine:
    """One vLLM engine in this process and what the demo reads from it."""

    def __init__(self, target: str | Path, *, spec: dict | None = None, max_tokens: int = 64,
                 dtype: str = "float32", max_model_len: int = 512, ignore_eos: bool = True,
                 max_num_seqs: int = 16, kv_cache_mib: int = 128, compile: bool = False):
        import torch
        from vllm import LLM, SamplingParams

        # denormal floats make CPU matmuls/exp many times slower, data-dependently; the
        # demo's timings must not hinge on them (flushing changes values below ~1e-38 only)
        torch.set_flush_denormal(True)
        self.spec = spec
        t0 = time.perf_counter()
        self.llm = LLM(
            model=str(target),
            dtype=dtype,
            # eager unless asked: a compiled engine (vLLM's CPU default) spends minutes tracing
            enforce_eager=not compile,
            max_model_len=max_model_len,
            kv_cache_memory_bytes=kv_cache_mib * 2**20,
            max_num_seqs=max_num_seqs,
            seed=0,
            disable_log_stats=False,
            **({"speculative_config": spec} if spec else {}),
        )
        self.startup_s = time.perf_counter() - t0
        self.params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)

    def facts(self) -> dict:
        """What this engine really runs, read back from vLLM: the attention backend of
        every layer, the parameters of the checkpoint vLLM loaded (counted in its
        files: vLLM's CPU build repacks linear weights out of ``parameters()``), and with our
        proposer what the target's matrices multiply by (``DomainDraftProposer.packing``)."""
        from accel_plugin.speculative.draft_format import checkpoint_parameters

        from .proposer import live_proposers

        custom = bool(self.spec) and self.spec.get("method") == "custom_class"
        return {"attention_backends": sorted({n for names in self.llm.collective_rpc(_attention_backends)
                                              for n in names}),
                "method": _method(self.llm),
                "compilation": _compilation(self.llm),
                "target_products": [p.packing for p in live_proposers()] if custom else None,
                "parameters": checkpoint_parameters(self.llm.llm_engine.model_config.model)}

    def stats(self) -> dict | None:
        """The domain proposer's per-domain counters (``None`` without it)."""
        if not self.spec or self.spec.get("method") != "custom_class":
            return None
        from .proposer import collect_stats

        return collect_stats()

    def step_stats(self) -> dict | None:
        """The domain proposer's per-bucket step model (``DomainProposer.step_stats``),
        where the proposer has it; ``None`` otherwise."""
        if not self.spec or self.spec.get("method") != "custom_class":
            return None
        from .proposer import live_proposers

        out: dict[str, dict] = {}
        for proposer in live_proposers():
            read = getattr(proposer.core, "step_stats", None)
            if read is not None:
                out.update({str(bucket): dict(v) for bucket, v in (read() or {}).items()})
        return out or None

    def _clock(self) -> tuple[int, float]:
        from .proposer import live_proposers

        custom = bool(self.spec) and self.spec.get("method") == "custom_class"
        cores = [p.core for p in live_proposers()] if custom else []
        return sum(c.num_steps for c in cores), sum(c.propose_seconds for c in cores)

    def generate(self, prompts: list[str]) -> list:
        return self.llm.generate(prompts, self.params, use_tqdm=False)

    def timed(self, name: str, prompts: list[str], one_at_a_time: bool = False) -> dict:
        """One timed ``generate`` (``one_at_a_time``: one per prompt, batch 1): tokens,
        seconds, greedy ids, and what the proposer did meanwhile (its steps, time, and
        per-domain counter deltas)."""
        before, (steps0, propose0) = self.stats() or {}, self._clock()
        t0 = time.perf_counter()
        outputs = [o for p in prompts for o in self.generate([p])] if one_at_a_time else self.generate(prompts)
        seconds = time.perf_counter() - t0
        steps1, propose1 = self._clock()
        after = self.stats()
        delta = {d: {key: s[key] - before.get(d, {}).get(key, 0) for key in _COUNTERS}
                 for d, s in (after or {}).items()}
        return {
            "name": name,
            "seconds": seconds,
            "generated": sum(len(o.outputs[0].token_ids) for o in outputs),
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "propose_steps": steps1 - steps0,
            "propose_seconds": propose1 - propose0,
            "delta": delta,
            "stats": after,
            "step_stats": self.step_stats(),
        }


def serve(args: dict, stdin=None) -> int:
    """The worker: engine, warm-up, ``READY``; then a ``RESULT`` per command line."""
    stdin = stdin if stdin is not None else sys.stdin
    engine = _Engine(args["target"], spec=args.get("spec"), max_tokens=args.get("max_tokens", 64),
                     dtype=args.get("dtype", "float32"), max_model_len=args.get("max_model_len", 512),
                     ignore_eos=args.get("ignore_eos", True), max_num_seqs=args.get("max_num_seqs", 16),
                     kv_cache_mib=args.get("kv_cache_mib", 128), compile=args.get("compile", False))
    t0 = time.perf_counter()
    for prompts in args.get("warmup", []):
        engine.generate(prompts)
    _emit("READY", {"startup_s": engine.startup_s, "warmup_s": time.perf_counter() - t0,
                    "after_warmup": engine.stats(), **engine.facts()})
    for line in stdin:
        command = json.loads(line) if line.strip() else {"quit": True}
        if command.get("quit"):
            break
        _emit("RESULT", engine.timed(command["name"], command["prompts"], bool(command.get("one_at_a_time"))))
    _emit("DONE", {"final": engine.stats(), "spec": _spec_counters(engine.llm) if engine.spec else {}})
    return 0


class _Worker:
    """A worker process seen from the coordinator: send a command, wait for its line."""

    def __init__(self, name: str, args: dict, env: dict, timeout_s: float):
        self.name, self.timeout_s = name, timeout_s
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._tail: collections.deque[str] = collections.deque(maxlen=60)
        self._lines: queue.Queue[str | None] = queue.Queue()
        cmd = [sys.executable, "-m", "accel_plugin.adapters.vllm.demo", json.dumps(args)]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, kind: str) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise RuntimeError(f"{self.name}: vLLM worker gave no {kind} within {self.timeout_s:.0f} s\n"
                                   + self.output_tail()) from None
            if line is None:
                self.proc.wait()
                raise RuntimeError(f"{self.name}: vLLM worker exited (code {self.proc.returncode}) "
                                   f"before {kind}:\n" + self.output_tail())
            if line.startswith(kind + " "):
                return json.loads(line[len(kind) + 1:])
            self._tail.append(line)

    def send(self, command: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the worker is gone (BrokenPipeError): say why, with its output
            self.proc.wait()
            raise RuntimeError(f"{self.name}: vLLM worker exited (code {self.proc.returncode}):\n"
                               + self.output_tail()) from None

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def output_tail(self) -> str:
        return ("".join(self._tail) + self.stderr_text())[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _best(results: list[dict]) -> dict:
    """Repeats of one timed entry -> one: the fastest run's time and outputs; the
    proposer's steps, time and counters summed over every repeat; the proposer's
    state after the last."""
    best = min(results, key=lambda r: r["seconds"])
    delta: dict[str, dict[str, int]] = {}
    for r in results:
        for domain, d in r["delta"].items():
            acc = delta.setdefault(domain, dict.fromkeys(_COUNTERS, 0))
            for key in _COUNTERS:
                acc[key] += d[key]
    return {**best, "seconds_all": [r["seconds"] for r in results], "delta": delta,
            # greedy decoding is deterministic: every repeat must give the same tokens
            "repeats_identical": all(r["token_ids"] == best["token_ids"] for r in results),
            "propose_steps": sum(r["propose_steps"] for r in results),
            "propose_seconds": sum(r["propose_seconds"] for r in results),
            "stats": results[-1]["stats"], "step_stats": results[-1].get("step_stats")}


def run_side_by_side(target: str | Path, configs: dict[str, str | Path | dict | None], *,
                     warmup: list[list[str]] | dict[str, list[list[str]]],
                     timed: list[dict], repeats: int = 1, untimed: list[dict] = (), attention_backend: str = "",
                     num_speculative_tokens: int = 5, timeout_s: float = 600, progress=None,
                     **engine_args: Any) -> dict[str, dict]:
    """One engine per entry of ``configs`` (name -> draft YAML for the domain
    proposer, a vLLM ``speculative_config`` dict used as is, e.g. ``{"method":
    "ngram", ...}``, or ``None`` for no speculation), each warmed up with ``warmup`` (one list of prompt batches for all,
    or one per configuration name); then every ``timed`` entry (``{"name": str,
    "prompts": [...]}``, optionally ``"configs": [names]`` to run it on those engines
    only) on every engine in turn, ``repeats`` times; then every ``untimed`` entry (same
    form) once, its prompts one at a time (batch 1), for the counters it leaves (e.g.
    acceptance over a whole prompt set). ``attention_backend`` is
    ``ACCEL_ATTENTION_BACKEND`` for every engine; ``""`` leaves it unset: vLLM's own
    default backend.

    Returns per configuration: ``method`` (vLLM's own, read back), ``startup_s``, ``warmup_s``, ``after_warmup`` and
    ``final`` proposer counters, vLLM's ``spec`` counters, ``warnings`` (the
    plugin's, from the worker's stderr) and ``runs``: per timed entry the fastest
    repeat (seconds, generated tokens, greedy ids) with ``seconds_all``, and the
    proposer's counters summed over the repeats (``delta``, ``propose_steps``,
    ``propose_seconds``), and ``untimed``: per untimed entry run on it, its result
    (``delta``, ``token_ids``, ...). ``progress(message)`` is called as work proceeds. Raises
    ``RuntimeError`` with a worker's output tail when one fails.
    """
    base_env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "ACCEL_ATTENTION_BACKEND": attention_backend,
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                # the read-back of the attention backend ships a function to the worker
                "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "PYTHONPATH": worker_pythonpath()}
    if not attention_backend:
        base_env.pop("ACCEL_ATTENTION_BACKEND")
    base_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    base_env.pop("ACCEL_DRAFT_CONFIG", None)
    # the Triton interpreter would take many minutes: on CPU the demo times the kernels'
    # pure-torch reference (the accel backend warns once that it does)
    base_env.pop("TRITON_INTERPRET", None)
    progress = progress or (lambda message: None)
    workers: dict[str, _Worker] = {}
    results: dict[str, dict] = {}
    try:
        for name, draft_config in configs.items():
            batches = warmup.get(name, []) if isinstance(warmup, dict) else warmup
            env, args = dict(base_env), {"target": str(target), "warmup": batches, **engine_args}
            if isinstance(draft_config, dict):
                args["spec"] = dict(draft_config)
            elif draft_config is not None:
                env["ACCEL_DRAFT_CONFIG"] = str(draft_config)
                args["spec"] = spec_config(num_speculative_tokens)
            t0 = time.perf_counter()
            # one at a time: a starting engine would slow the others' warm-up
            workers[name] = _Worker(name, args, env, timeout_s)
            results[name] = {**workers[name].expect("READY"), "runs": []}
            progress(f"{name}: engine started and warmed up in {time.perf_counter() - t0:.0f} s")
        names = list(configs)
        per_entry: dict[str, list[list[dict]]] = {name: [[] for _ in timed] for name in names}
        for rep in range(max(1, repeats)):
            order = names[rep % len(names):] + names[:rep % len(names)]
            t0 = time.perf_counter()
            for i, entry in enumerate(timed):
                for name in order:
                    if name not in entry.get("configs", names):
                        continue
                    workers[name].send({"name": entry["name"], "prompts": entry["prompts"]})
                    per_entry[name][i].append(workers[name].expect("RESULT"))
            progress(f"timed round {rep + 1}/{max(1, repeats)}: {time.perf_counter() - t0:.0f} s")
        for entry in untimed:
            t0 = time.perf_counter()
            for name in [n for n in names if n in entry.get("configs", names)]:
                workers[name].send({"name": entry["name"], "prompts": entry["prompts"], "one_at_a_time": True})
                results[name].setdefault("untimed", []).append(workers[name].expect("RESULT"))
            progress(f"untimed {entry['name']}: {len(entry['prompts'])} prompts one at a time, "
                     f"{time.perf_counter() - t0:.0f} s")
        for name, worker in workers.items():
            worker.send({"quit": True})
            done = worker.expect("DONE")
            worker.proc.wait(timeout=timeout_s)
            results[name].update(done)
            results[name]["runs"] = [_best(r) for r in per_entry[name] if r]
            results[name]["warnings"] = sorted({line.strip() for line in worker.stderr_text().splitlines()
                                                if "accel_plugin" in line and "Warning" in line})
    finally:
        for worker in workers.values():
            worker.close()
    return results


def main(argv: list[str] | None = None) -> int:
    return serve(json.loads((argv if argv is not None else sys.argv[1:])[0]))


if __name__ == "__main__":
    sys.exit(main())
