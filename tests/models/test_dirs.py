"""accel_plugin.models.dirs: model-directory and vocabulary checks, with messages that
name the directory, what is missing and the valid values."""

from __future__ import annotations

import json

import pytest

from accel_plugin.models.dirs import (
    TOKENIZER_FILES,
    ModelDirError,
    TargetVocabulary,
    check_draft_dir,
    check_model_dir,
    linear_shapes,
    read_vocab,
    vocab_size,
)


def model_dir(root, name, *, config=None, weights="model.safetensors", vocab=None):
    """A directory that looks like a model: config.json, an (empty) weights file and,
    with ``vocab``, a word-level tokenizer.json."""
    path = root / name
    path.mkdir()
    if config is not False:
        (path / "config.json").write_text(json.dumps(config or {"architectures": ["LlamaForCausalLM"],
                                                                 "vocab_size": 4}))
    if weights:
        (path / weights).write_bytes(b"")
    if vocab is not None:
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel

        Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(path / "tokenizer.json"))
    return path


@pytest.mark.parametrize("case, needle", [
    ("missing", "model directory '{path}' does not exist"),
    ("no-config", "'{path}' has no config.json; expected a Hugging Face model directory"),
    ("pickled", "'{path}' has no *.safetensors weights; found pytorch_model.bin; only safetensors are loaded"),
    ("no-tokenizer", "'{path}' has no tokenizer files (" + ", ".join(TOKENIZER_FILES) + ")"),
])
def test_model_dir_problems_name_the_directory_and_what_is_missing(tmp_path, case, needle):
    path = tmp_path / case
    if case == "no-config":
        model_dir(tmp_path, case, config=False)
    elif case == "pickled":
        model_dir(tmp_path, case, weights="pytorch_model.bin")
    elif case == "no-tokenizer":
        model_dir(tmp_path, case)
    with pytest.raises(ModelDirError) as exc:
        check_model_dir(path, need_tokenizer=True)
    assert needle.format(path=path) in str(exc.value)


def test_draft_dirs_need_a_supported_architecture_and_trust_for_custom_code(tmp_path):
    assert check_draft_dir(model_dir(tmp_path, "llama")) == tmp_path / "llama"
    gpt2 = model_dir(tmp_path, "gpt2", config={"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ModelDirError, match=r"architecture GPT2LMHeadModel .*\(supported: LlamaForCausalLM"):
        check_draft_dir(gpt2)
    remote = model_dir(tmp_path, "remote", config={"architectures": ["LlamaForCausalLM"], "auto_map": {"a": "b"}})
    with pytest.raises(ModelDirError, match="set trust_remote_code: true"):
        check_draft_dir(remote)
    assert check_draft_dir(remote, trust_remote_code=True) == remote


def test_vocabulary_mismatch(tmp_path):
    words = {"<unk>": 0, "a": 1, "b": 2, "c": 3}
    target = model_dir(tmp_path, "target", vocab=words)
    same = model_dir(tmp_path, "same", vocab=dict(words))
    swapped = model_dir(tmp_path, "swapped", vocab={**words, "a": 2, "b": 1})
    bigger = model_dir(tmp_path, "bigger", config={"vocab_size": 8})
    assert (vocab_size(target), read_vocab(target)) == (4, words) and read_vocab(bigger) is None
    vocab = TargetVocabulary(target)
    assert vocab.mismatch(same) is None
    assert "2 tokens map to other ids" in vocab.mismatch(swapped)
    assert "the draft's vocab_size 8 differs from the target's 4" in vocab.mismatch(bigger)
    # nothing known about the target (no config.json, no tokenizer): nothing compared
    assert TargetVocabulary(tmp_path).mismatch(bigger) is None


def test_the_target_tokenizer_is_read_only_when_the_sizes_agree(tmp_path):
    target = model_dir(tmp_path, "target")
    (target / "tokenizer_config.json").write_text("{}")  # not loadable: reading it would raise
    other = model_dir(tmp_path, "other", config={"vocab_size": 8})
    assert "vocab_size 8 differs" in TargetVocabulary(target).mismatch(other)


def test_linear_shapes_of_smollm2_and_of_a_config_without_the_optional_keys():
    smollm2 = {  # SmolLM2-135M's config.json, the keys read
        "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "num_hidden_layers": 30, "vocab_size": 49152}
    layers, head = linear_shapes(smollm2)
    assert layers[:4] == [(960, 576), (576, 576), (3072, 576), (576, 1536)] and len(layers) == 4 * 30
    assert head == (49152, 576)
    # no num_key_value_heads (or null) and no head_dim: multi-head attention, hidden / heads per head
    plain = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": None,
             "num_hidden_layers": 1, "vocab_size": 100}
    assert linear_shapes(plain) == ([(192, 64), (64, 64), (256, 64), (64, 128)], (100, 64))
