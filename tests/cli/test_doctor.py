"""`accel doctor` as a user runs it: the installed console script, in a subprocess."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ACCEL = shutil.which("accel", path=str(Path(sys.executable).parent)) or "accel"


def run_doctor(*args, env_overrides=None, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env.update(env_overrides or {})
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([ACCEL, "doctor", *args], env=env, capture_output=True, text=True, timeout=120)


def test_doctor_reports_machine_backends_and_env():
    proc = run_doctor()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for needle in ("Software", "python", "torch", "triton", "vllm", "text_generation_server",
                   "Device", "triton kernels", "ACCEL_FLASH", "ACCEL_PAGED",
                   "ACCEL_ATTENTION_BACKEND", "ACCEL_PLUGINS", "Selection"):
        assert needle in out, f"{needle!r} missing from:\n{out}"
    assert "text_generation_server   not installed" in out


def test_doctor_json_with_backend_set():
    proc = run_doctor("--json", env_overrides={"ACCEL_ATTENTION_BACKEND": "paged"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["selection"]["backend"] == "ACCEL_PAGED"
    assert report["env"]["ACCEL_ATTENTION_BACKEND"] == {"raw": "paged", "value": "paged"}
    assert report["kernels"]["mode"] in ("compiled", "interpreter", "torch")
    assert {b["name"] for b in report["backends"]} >= {"ACCEL_FLASH", "ACCEL_PAGED"}


def test_doctor_fails_on_bad_env_and_names_valid_values():
    proc = run_doctor(env_overrides={"ACCEL_ATTENTION_BACKEND": "bogus"})
    assert proc.returncode == 1
    assert "ACCEL_ATTENTION_BACKEND='bogus' is not valid; valid values: flash, paged, auto" in proc.stdout


def test_doctor_fails_on_allowlist_naming_missing_plugin():
    proc = run_doctor(env_overrides={"ACCEL_PLUGINS": "nope"})
    assert proc.returncode == 1
    assert "not installed: nope" in proc.stdout


def test_doctor_lists_third_party_backend(third_party_plugin):
    proc = run_doctor(pythonpath=third_party_plugin)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "third_party" in proc.stdout
    assert "THIRD_PARTY_ATTN" in proc.stdout
    assert "refused: device 'cpu' not supported (supported: cuda)" in proc.stdout


@pytest.mark.parametrize("interpret,expected", [("1", "interpreter"), ("0", "torch")])
def test_doctor_kernel_mode_follows_triton_interpret(interpret, expected):
    proc = run_doctor("--json", env_overrides={"TRITON_INTERPRET": interpret})
    report = json.loads(proc.stdout)
    assert report["kernels"]["mode"] == expected, report["kernels"]
    if expected == "torch":  # the CPU path is named by what it is
        assert report["kernels"]["reason"].endswith("native C++ CPU kernel (paged decode, OpenMP) + torch CPU path "
                                                   "(SDPA, batched) for prefill"), report["kernels"]


def test_doctor_lists_the_domain_proposer():
    report = json.loads(run_doctor("--json").stdout)
    (proposer,) = [p for p in report["proposers"] if p["name"] == "ACCEL_DOMAIN_DRAFT"]
    assert proposer["supported"] and proposer["frameworks"] == ["vllm", "tgi"]


def test_doctor_checks_the_draft_config(tmp_path):
    missing = run_doctor(env_overrides={"ACCEL_DRAFT_CONFIG": str(tmp_path / "nope.yaml")})
    assert missing.returncode == 1
    assert "ACCEL_DRAFT_CONFIG" in missing.stdout and "nope.yaml" in missing.stdout
    demo = Path(__file__).resolve().parents[2] / "demo_models" / "drafts.yaml"
    ok = run_doctor(env_overrides={"ACCEL_DRAFT_CONFIG": str(demo)})
    assert ok.returncode == 0, ok.stdout
    assert "domains support, code, default" in ok.stdout


def test_doctor_reports_the_metrics_settings():
    proc = run_doctor("--json", env_overrides={"ACCEL_METRICS_LOG_INTERVAL": "2"})
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)["env"]
    assert env["ACCEL_METRICS"] == {"raw": None, "value": True}
    assert env["ACCEL_METRICS_LOG_INTERVAL"] == {"raw": "2", "value": 2.0}
    assert env["ACCEL_METRICS_DIR"] == {"raw": None, "value": None}
    proc = run_doctor(env_overrides={"ACCEL_METRICS": "maybe"})
    assert proc.returncode == 1
    assert "ACCEL_METRICS='maybe' is not valid; valid values: 1/0, true/false, yes/no, on/off" in proc.stdout


@pytest.mark.parametrize("setting", ["flash", "paged", "auto"])
def test_doctor_fails_when_the_requested_backend_is_refused_here(monkeypatch, capsys, setting):
    """On a GPU below capability 8.0 every accel backend is refused: a framework adapter
    would stop start-up, so the doctor exits 1 and says why (in-process, device stubbed)."""
    from accel_plugin.cli import doctor, main

    monkeypatch.setattr(doctor, "_device_info", lambda: {
        "device": "cuda", "detail": "stub GPU (capability 7.0)", "cuda_capability": [7, 0]})
    for name in [k for k in os.environ if k.startswith("ACCEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ACCEL_ATTENTION_BACKEND", setting)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    errors = out[out.index("\nErrors\n"):]
    assert f"ACCEL_ATTENTION_BACKEND={setting} refused: " in errors and "capability" in errors, out
    assert "unset ACCEL_ATTENTION_BACKEND to keep the framework's own attention backend" in errors
    monkeypatch.delenv("ACCEL_ATTENTION_BACKEND")
    assert main(["doctor"]) == 0, capsys.readouterr().out
