"""Benchmark: what accel's live metrics cost per decode step, measured side by side.

    .venv/bin/python -m benchmarks.metrics_overhead                  # both parts
    .venv/bin/python -m benchmarks.metrics_overhead --only record    # the recording alone, no vLLM
    .venv/bin/python -m benchmarks.metrics_overhead --only vllm --batch 16 --max-tokens 32 --rounds 3
    .venv/bin/python -m benchmarks.metrics_overhead --only vllm --kernels interpreter   # slow: seconds per step

1. ``record``: the host-side work one step adds, for batches of 1 to 256 sequences:
   the KV recording as the vLLM builder does it (``tolist`` of the host ``seq_lens``,
   ``paged_usage``, the writes into the metric files) and the proposer recording
   (``stats()`` of a real controller with three domains, the writes). Median over
   many calls; no device is involved, so the numbers hold for a GPU server too.
2. ``vllm``: one vLLM engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
   ``ACCEL_ATTENTION_BACKEND=paged``, a tiny local model, ``ignore_eos``; on CPU the
   kernels' torch reference unless ``--kernels interpreter``); rounds of
   the same batch alternate between metrics on and metrics off (the recorders
   replaced by no-ops), so both see the same engine, caches and machine state.
   Printed: time per decode step (generate time / max_tokens, median over rounds),
   and the time spent inside the recorders per step, timed on the "on" rounds.
3. ``multiprocess``: vLLM's default mode, the worker in its own process (a fresh
   Python process runs it): the decode step time, and the recording time the worker
   reports itself (``accel_metrics_record_seconds_total``, read from the metric
   files) per recorded step.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

BATCHES = (1, 8, 64, 256)


def _median_us(fn, calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1e6 * statistics.median(samples)


class _Common:
    """The two fields KVRecorder reads of vLLM's CommonAttentionMetadata."""

    def __init__(self, seq_lens):
        self.seq_lens, self.num_reqs = seq_lens, len(seq_lens)


class _Proposer:
    def __init__(self, controller):
        self.controller, self.num_steps, self.propose_seconds = controller, 0, 0.0

    def stats(self, *, by_bucket=True):
        return self.controller.stats(by_bucket=by_bucket)

    def counters(self):
        return self.controller.counters()


def bench_record(calls: int = 2000) -> list[dict]:
    import torch

    from accel_plugin.speculative.draft_config.schema import ControllerConfig
    from accel_plugin.observability.metrics_files import MetricsSink
    from accel_plugin.observability.metrics_recorders import LiveMetrics
    from accel_plugin.speculative.controller import DomainController

    rows = []
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as directory:
        live = LiveMetrics(("model", "0"), MetricsSink(directory), log=lambda line: None)
        kv = live.kv("full", 16)
        drafts = {"support": "a", "code": "b", "default": "c"}
        controller = DomainController(ControllerConfig(), drafts, dict.fromkeys(drafts, 4))
        for domain in drafts:
            for _ in range(32):
                controller.observe(domain, 4, rng.randrange(5))
        proposer, spec = _Proposer(controller), live.proposer()
        for batch in BATCHES:
            seq_lens = torch.tensor([rng.randrange(100, 2000) for _ in range(batch)], dtype=torch.int32)
            # one step's lengths per call, made beforehand: every value changes each step
            steps = iter([_Common(seq_lens + i) for i in range(calls)])

            def record_kv(steps=steps):
                # what adapters/vllm/metrics.py's KVRecorder.record does per step
                common = next(steps)
                kv.record(common.seq_lens[: common.num_reqs].tolist())

            def record_spec():
                proposer.num_steps += 1
                proposer.propose_seconds += 1e-3
                spec.record(proposer)

            rows.append({"batch": batch, "kv_us": _median_us(record_kv, calls),
                         "spec_us": _median_us(record_spec, calls // 4)})
    return rows


def _engine(args):
    """(LLM, prompts, sampling params): a tiny local model on ACCEL_PAGED, ``args.batch`` prompts."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["ACCEL_ATTENTION_BACKEND"] = "paged"
    os.environ["ACCEL_METRICS_LOG_INTERVAL"] = "0"
    if args.kernels == "interpreter":
        os.environ["TRITON_INTERPRET"] = "1"
    elif args.kernels == "reference":
        os.environ.pop("TRITON_INTERPRET", None)
    from vllm import LLM, SamplingParams  # after the variables above: vLLM reads them when imported

    from accel_plugin.testing.tiny_models import build_tiny_model

    model = build_tiny_model(args.model, args.cache)
    llm = LLM(model=str(model), dtype="float32", block_size=16, enforce_eager=True, max_model_len=512,
              max_num_seqs=args.batch, seed=0)
    rng = random.Random(1)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 380) for _ in range(rng.randrange(8, 120))]}
               for _ in range(args.batch)]
    return llm, prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)


def bench_vllm(args) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm, prompts, params = _engine(args)
    from accel_plugin.adapters.vllm import metrics as vllm_metrics

    real_record = vllm_metrics.KVRecorder.record
    inside: list[float] = []

    def timed_record(self, common):
        start = time.perf_counter()
        real_record(self, common)
        inside.append(time.perf_counter() - start)

    def generate(mode: str) -> float:
        vllm_metrics.KVRecorder.record = timed_record if mode == "on" else (lambda self, common: None)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return (time.perf_counter() - start) / args.max_tokens

    generate("on")  # warm-up
    inside.clear()
    step = {"on": [], "off": []}
    for r in range(args.rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            step[mode].append(generate(mode))
    vllm_metrics.KVRecorder.record = real_record
    from accel_plugin.kernels import runtime_mode_reason

    return {
        "step_ms_on": 1e3 * statistics.median(step["on"]), "step_ms_off": 1e3 * statistics.median(step["off"]),
        "record_us": 1e6 * statistics.median(inside), "record_us_mean": 1e6 * statistics.fmean(inside),
        "calls": len(inside), "kernels": runtime_mode_reason(),
    }


def bench_vllm_multiprocess(args) -> dict:
    """vLLM's default mode (the worker in its own process): the worker's own account of
    its recording time (``accel_metrics_record_seconds_total``) per recorded step."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    llm, prompts, params = _engine(args)
    from accel_plugin import envs
    from accel_plugin.observability.metrics_files import read_metrics

    directory = envs.metrics_dir()  # set by the plugin's register() in this process

    def totals() -> tuple[float, float]:
        values = read_metrics(directory)
        pick = {name: value for (name, _), value in values.items()}
        return pick.get("accel_metrics_record_seconds_total", 0.0), pick.get("accel_kv_steps_total", 0.0)

    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    seconds_0, steps_0 = totals()
    start = time.perf_counter()
    for _ in range(args.rounds):
        llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    seconds_1, steps_1 = totals()
    steps = steps_1 - steps_0
    return {"step_ms": 1e3 * wall / (args.rounds * args.max_tokens),
            "record_us": 1e6 * (seconds_1 - seconds_0) / max(steps, 1), "steps": steps}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("record", "vllm", "multiprocess"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="gqa-d32")
    parser.add_argument("--kernels", choices=("reference", "interpreter", "as-set"), default="reference",
                        help="on CPU: the kernels' pure-torch reference (default; steps of milliseconds), the "
                             "Triton interpreter (seconds per step), or as TRITON_INTERPRET says (on a GPU: compiled)")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "accel-bench-models"))
    args = parser.parse_args(argv)
    if args.only in (None, "record"):
        print("recording cost per step (host only, median)")
        print(f"{'batch':>6} {'KV us/step':>11} {'proposer us/step':>17}")
        for row in bench_record():
            print(f"{row['batch']:>6} {row['kv_us']:>11.1f} {row['spec_us']:>17.1f}")
    if args.only in (None, "vllm"):
        r = bench_vllm(args)
        share = 100 * r["record_us"] / (1e3 * r["step_ms_on"])
        print(f"\nvLLM decode step, batch {args.batch}, {args.max_tokens} tokens, {args.rounds} rounds each "
              f"(kernels: {r['kernels']})")
        print(f"{'metrics':>8} {'ms/step':>9}")
        print(f"{'on':>8} {r['step_ms_on']:>9.2f}")
        print(f"{'off':>8} {r['step_ms_off']:>9.2f}")
        print(f"inside the KV recorder: {r['record_us']:.1f} us per step (median; mean {r['record_us_mean']:.1f}; "
              f"{r['calls']} steps timed) = {share:.3f}% of a step; on/off difference "
              f"{100 * (r['step_ms_on'] / r['step_ms_off'] - 1):+.2f}% (the machine's noise at this step time)")
    if args.only is None:  # a fresh process: one vLLM engine per process
        import subprocess
        import sys

        subprocess.run([sys.executable, "-m", "benchmarks.metrics_overhead", "--only", "multiprocess",
                        *(argv if argv is not None else sys.argv[1:])], check=True)
    if args.only == "multiprocess":
        r = bench_vllm_multiprocess(args)
        print(f"\nvLLM multiprocess (its default): decode step {r['step_ms']:.2f} ms; recording in the worker "
              f"{r['record_us']:.1f} us per step (accel_metrics_record_seconds_total / accel_kv_steps_total, "
              f"{r['steps']:.0f} steps) = {100 * r['record_us'] / (1e3 * r['step_ms']):.3f}% of a step")


if __name__ == "__main__":
    main()
