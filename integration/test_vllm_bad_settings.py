"""A wrong accel setting stops a real vLLM's start-up, as vLLM's own bad settings do.

vLLM calls the plugin's ``register()`` (entry point ``vllm.general_plugins``) without
catching what it raises, so ``LLM(...)`` fails with accel-plugin's message naming the
variable, the value and the valid values, instead of serving with vLLM's own
attention while the user believes accel's runs. Every wrong setting and failure
mode of ``register()`` is a row of tests/adapters/test_vllm_register_contract.py;
this is the one real start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPTS = Path(__file__).parent / "scripts"


def test_a_backend_typo_stops_llm_start_up_naming_the_valid_values(tiny_model_dir):
    env = {**os.environ, "ACCEL_ATTENTION_BACKEND": "flsh", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cmd = [sys.executable, str(SCRIPTS / "vllm_generate.py"), str(tiny_model_dir("gqa-d32")),
           "--prompts-json", json.dumps(["The model is"]), "--max-tokens", "2", "--dtype", "float32",
           "--engine-kwargs-json", "{}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-3000:]
    assert ("AccelStartupError: accel-plugin: ACCEL_ATTENTION_BACKEND='flsh' is not valid; "
            "valid values: flash, paged, auto (or unset)") in log, log[-3000:]
    assert "RESULT " not in log
