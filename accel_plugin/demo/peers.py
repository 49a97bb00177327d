"""vLLM's own speculators that `accel demo` runs beside the domain proposer ("peers").

Each peer is a vLLM ``speculative_config`` used as is (the harness passes it to
``LLM(speculative_config=...)``):

- ``ngram``: vLLM's n-gram prompt lookup, always available;
- ``suffix``: vLLM's suffix decoding (method ``suffix``), which needs the
  ``arctic_inference`` package importable in the demo's workers. A build kept
  outside the venv is found through ``ACCEL_DEMO_SUFFIX_PATH`` (folders, separated
  by ``os.pathsep``, put before ``PYTHONPATH`` in every worker). Run with its
  per-request prompt trees only (``suffix_decoding_max_cached_requests: 0``): the
  demo runs every prompt in its warm-up and again in each paired round, and suffix
  decoding's global tree (vLLM's default, 10000 past responses) would replay the
  very answers it saw the round before (3.6-4.2x on every set in the 2026-12-02
  demo, the untuned "general" set included): a speed no user sees on prompts that
  are new. Over the request's own context it is n-gram's job done with a suffix
  tree, the same information ours and the n-gram peer get.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["PEERS", "PEER_MODULES", "parse_peers", "peer_configs", "worker_has_module", "worker_pythonpath"]

PEERS: dict[str, dict] = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 5, "prompt_lookup_min": 2},
    "suffix": {"method": "suffix", "num_speculative_tokens": 5, "suffix_decoding_max_cached_requests": 0},
}
#: the package a peer needs in the worker's environment
PEER_MODULES = {"suffix": "arctic_inference"}
SUFFIX_PATH_ENV = "ACCEL_DEMO_SUFFIX_PATH"


def parse_peers(text: str) -> tuple[str, ...]:
    """``"ngram,suffix"`` -> ``("ngram", "suffix")``; ``""`` -> none. Raises
    ``ValueError`` naming the valid peers for an unknown name."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(map(repr, unknown))}: valid peers are {', '.join(PEERS)}")
    return names


def worker_pythonpath(environ: dict | None = None) -> str:
    """``PYTHONPATH`` of a demo worker: the folders of ``ACCEL_DEMO_SUFFIX_PATH``, then the caller's."""
    environ = os.environ if environ is None else environ
    parts = [p for p in environ.get(SUFFIX_PATH_ENV, "").split(os.pathsep) if p]
    parts += [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(parts)


def worker_has_module(module: str, environ: dict | None = None) -> bool:
    """Whether ``module`` is importable in a worker (this interpreter, the worker's PYTHONPATH)."""
    env = {**(os.environ if environ is None else environ), "PYTHONPATH": worker_pythonpath(environ)}
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120,
                          check=False).returncode == 0


def peer_configs(names: tuple[str, ...], has_module=worker_has_module) -> tuple[dict[str, dict], dict[str, str]]:
    """(peer name -> speculative_config, for those that can run; peer name -> why not, for the others)."""
    run, skipped = {}, {}
    for name in names:
        module = PEER_MODULES.get(name)
        if module and not has_module(module):
            skipped[name] = (f"{module} is not importable in the worker's environment (install it, or point "
                             f"{SUFFIX_PATH_ENV} at a folder holding it)")
        else:
            run[name] = dict(PEERS[name])
    return run, skipped
