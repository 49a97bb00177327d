"""scripts/gpu_check.py (`make gpu-check`, its steps in scripts/_gpu_check/) without a GPU: the refusal, what it would install,
the test runs it parses and the report it writes."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")

SAMPLE_TESTS = '''
import pytest

def test_ok():
    pass

def test_bad():
    assert 1 == 2, "one is not two"

def test_skip():
    pytest.skip("needs a CUDA GPU")
'''


@pytest.fixture(scope="module")
def gpu_check():
    """scripts/gpu_check.py as a module; its steps (scripts/_gpu_check/) are its attributes
    ``provision``, ``runs``, ``report``. Its folder is on sys.path, as when python runs it."""
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SCRIPT.parent))
        for name in [n for n in sys.modules if n == "gpu_check" or n.split(".")[0] == "_gpu_check"]:
            del sys.modules[name]


@no_cuda
def test_refuses_without_cuda_and_installs_nothing(gpu_check, monkeypatch, tmp_path, capsys):
    def forbidden(*args, **kwargs):
        raise AssertionError(f"started a process without CUDA: {args}")

    monkeypatch.setattr(gpu_check.subprocess, "run", forbidden)
    monkeypatch.setattr(gpu_check.subprocess, "Popen", forbidden)
    report = tmp_path / "report.md"
    assert gpu_check.main(["--report", str(report), "--wheels", str(tmp_path)]) == gpu_check.REFUSED
    assert "gpu-check needs a CUDA GPU" in capsys.readouterr().err
    assert not report.exists()


@no_cuda
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_target_refuses_without_cuda(tmp_path):
    result = subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}",
                             f"GPU_REPORT={tmp_path / 'report.md'}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "gpu-check needs a CUDA GPU" in result.stderr and "Nothing was installed or run" in result.stderr
    assert not (tmp_path / "report.md").exists()


def test_installs_only_what_is_missing(gpu_check):
    present = {dist: "99.0" for dist, _, _, _ in gpu_check.provision.REQUIREMENTS}
    assert gpu_check.provision.missing_requirements(present.get, (3, 11)) == []
    older = dict(present, pytest="7.4.4", hypothesis=None)
    assert gpu_check.provision.missing_requirements(older.get, (3, 11)) == ["pytest>=8", "hypothesis>=6"]
    nothing = gpu_check.provision.missing_requirements(lambda dist: None, (3, 10))
    assert "tomli>=2" in nothing and "tomli>=2" not in gpu_check.provision.missing_requirements(lambda dist: None, (3, 12))


def test_pip_installs_without_dependencies_and_offline_from_wheels(gpu_check):
    offline = gpu_check.provision.pip_install_command(["pytest>=8"], "wheels", False)
    assert offline[1:4] == ["-m", "pip", "install"] and "--no-deps" in offline
    assert offline[offline.index("--find-links") + 1] == "wheels" and "--no-index" in offline
    online = gpu_check.provision.pip_install_command(["pytest>=8"], None, True)
    assert "--no-index" not in online and "--break-system-packages" in online and online[-1] == "pytest>=8"


def test_every_kernel_test_file_runs_in_one_group(gpu_check):
    files = [path for _, paths in gpu_check.runs.test_groups() for path in paths]
    expected = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "kernels").glob("test_*.py"))
    assert sorted(files) == expected and len(set(files)) == len(files)


def test_report_lists_every_result_and_the_benchmark(gpu_check, monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check.runs, "WORK", tmp_path)
    (tmp_path / "test_sample.py").write_text(SAMPLE_TESTS)
    run = gpu_check.runs.pytest_run("sample group", ["test_sample.py"], tmp_path / "junit.xml")
    gpu_check.runs.run_side_by_side([run], 120, "sample", cwd=tmp_path)
    assert run.returncode == 1 and not run.timed_out
    run.cases = gpu_check.runs.parse_junit(tmp_path / "junit.xml")
    outcomes = {case.test.split("::")[-1]: case.outcome for case in run.cases}
    assert outcomes == {"test_ok": "passed", "test_bad": "failed", "test_skip": "skipped"}
    assert {c.test.split("::")[-1]: c.outcome for c in gpu_check.runs.parse_verbose(run.output)} == outcomes

    tables = "### Decode: bf16\n\n| batch | context | ours us |\n|---|---|---|\n| 1 | 1024 | 12.0 |"
    bench = gpu_check.runs.Run("benchmark", [sys.executable, "-m", "benchmarks.attention", "--quick"], 0, 42.0, tables)
    killed = gpu_check.runs.Run("slow group", [sys.executable, "-m", "pytest", "x.py"], None, 180.0, "collecting ...")
    env = [("torch", "2.11.0"), ("device", "NVIDIA H200, capability sm_90, 132 SMs, 140 GiB")]
    report = gpu_check.report.render_report("make gpu-check", env, ["test tools: all present"], [run, killed], bench)
    assert "- tests: 1 passed, 1 failed, 1 skipped; incomplete: slow group" in report
    assert "| device | NVIDIA H200, capability sm_90, 132 SMs, 140 GiB |" in report
    assert "one is not two" in report and "needs a CUDA GPU" in report
    for name, outcome in outcomes.items():
        assert any(name in line and f"| {outcome} |" in line for line in report.splitlines())
    assert "killed at the deadline (180 s)" in report and "collecting ..." in report
    assert tables in report and "- benchmark: ok" in report


def test_a_run_past_the_deadline_is_killed(gpu_check, monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check.runs, "WORK", tmp_path)
    run = gpu_check.runs.Run("sleeper", [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"])
    gpu_check.runs.run_side_by_side([run], 3, "sleep", cwd=tmp_path)
    assert run.timed_out and run.seconds < 30 and "started" in run.output
