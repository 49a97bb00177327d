"""accel_plugin.speculative.draft_config.schema: the draft YAML, every start-up error, with key and line."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from accel_plugin.speculative.draft_config import DEFAULT_DOMAIN, DraftConfigError, check_against_target, load_draft_config, parse_draft_config


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A target, a compatible draft, and drafts that must be refused."""
    from accel_plugin.testing.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("config-models")
    target = build_tiny_model("gqa-d32", root)
    draft = build_tiny_model("draft-d32", root)
    # another vocabulary size: a tokenizer trained to 320 tokens
    small_vocab = build_tiny_model("draft-d32", root, vocab_size=320)
    # same size, different ids: two tokens swapped in tokenizer.json
    swapped = root / "swapped"
    shutil.copytree(draft, swapped)
    tok = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[100], list(vocab)[101]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(tok))
    # weights as pytorch_model.bin only
    pickled = root / "pickled"
    shutil.copytree(draft, pickled)
    for f in pickled.glob("*.safetensors"):
        f.rename(pickled / "pytorch_model.bin")
    # custom code
    remote = root / "remote"
    shutil.copytree(draft, remote)
    cfg = json.loads((remote / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (remote / "config.json").write_text(json.dumps(cfg))
    # an architecture the draft engine does not run
    gpt2 = root / "gpt2"
    shutil.copytree(draft, gpt2)
    cfg = json.loads((gpt2 / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (gpt2 / "config.json").write_text(json.dumps(cfg))
    return {"target": target, "draft": draft, "small_vocab": small_vocab, "swapped": swapped,
            "pickled": pickled, "remote": remote, "gpt2": gpt2, "root": root}


def write(tmp_path, text: str):
    path = tmp_path / "drafts.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def errors_of(path) -> list:
    with pytest.raises(DraftConfigError) as info:
        load_draft_config(path)
    return info.value.issues


def test_full_example_loads_and_resolves_relative_paths(tmp_path, models):
    (tmp_path / "drafts").mkdir()
    shutil.copytree(models["draft"], tmp_path / "drafts" / "support")
    path = write(tmp_path, f"""
        num_speculative_tokens: 5
        domains:
          support:
            draft: ./drafts/support
            match:
              keywords: [refund, order, delivery]
              regex: ['(?i)ticket #\\d+']
          code:
            draft: {models['draft']}
            match: {{regex: ['^\\s*(def|class|import)\\b']}}
            num_speculative_tokens: 2
        default:
          draft: null
        controller:
          adaptive: true
          min_acceptance: 0.5
    """)
    config = load_draft_config(path)
    assert config.num_speculative_tokens == 5
    assert config.domains["support"].draft == str((tmp_path / "drafts" / "support").resolve())
    assert config.domains["support"].match.regex == [r"(?i)ticket #\d+"]
    assert config.default.draft is None
    assert config.controller.min_acceptance == 0.5
    assert config.trust_remote_code is False
    assert config.k_max("code") == 2 and config.k_max("support") == 5 and config.k_max(DEFAULT_DOMAIN) == 5
    assert list(config.drafts()) == ["support", "code", DEFAULT_DOMAIN]


def test_minimal_file_has_defaults(tmp_path):
    config = load_draft_config(write(tmp_path, "num_speculative_tokens: 3\n"))
    assert config.domains == {} and config.default.draft is None
    assert config.controller.adaptive is True


@pytest.mark.parametrize(
    ("yaml_text", "key", "line", "fragment"),
    [
        ("num_speculative_tokens: 3\nspeculate: yes\n", "speculate", 2, "unknown key; valid keys here: num_speculative_tokens"),
        ("num_speculative_tokens: 3\ncontroller:\n  adaptiv: true\n", "controller.adaptiv", 3, "unknown key"),
        ("num_speculative_tokens: '3'\n", "num_speculative_tokens", 1, "valid integer"),
        ("num_speculative_tokens: 0\n", "num_speculative_tokens", 1, "greater than or equal to 1"),
        ("domains: {}\n", "num_speculative_tokens", None, "required key is missing"),
        ("num_speculative_tokens: 3\ncontroller:\n  adaptive: 1\n", "controller.adaptive", 3, "valid boolean"),
        ("num_speculative_tokens: 3\ncontroller:\n  min_acceptance: 1.5\n", "controller.min_acceptance", 3, "less than or equal to 1"),
        ("num_speculative_tokens: 3\ntrust_remote_code: 'no'\n", "trust_remote_code", 2, "valid boolean"),
        ("num_speculative_tokens: 3\ndtype: fp8\n", "dtype", 2, "'auto', 'float32'"),
        ("num_speculative_tokens: 3\ndomains:\n  a:\n    draft: x\n    match: {regex: ['(']}\n",
         "domains.a.match.regex.0", 5, "regex '(' cannot be used: missing )"),
        ("num_speculative_tokens: 3\ndomains:\n  a:\n    draft: x\n    match: {}\n", "domains.a", 3, "at least one keyword or regex"),
        ("num_speculative_tokens: 3\ndomains:\n  a:\n    match: {keywords: [x]}\n", "domains.a", 3, "needs a draft (a draft model directory), a lookup"),
        ("num_speculative_tokens: 3\ndomains:\n  a:\n    draft: 5\n    match: {keywords: [x]}\n", "domains.a.draft", 4, "valid string"),
        ("num_speculative_tokens: 3\ndomains:\n  a:\n    draft: x\n    match: {keywords: [x], words: [y]}\n",
         "domains.a.match.words", 5, "valid keys here: keywords, regex"),
        ("num_speculative_tokens: 3\ndomains:\n  default:\n    draft: x\n    match: {keywords: [x]}\n", "domains", 2, "reserved"),
        ("num_speculative_tokens: 3\ndomains: [a, b]\n", "domains", 2, "valid dictionary"),
        ("num_speculative_tokens: 3\ndefault:\n  draft: x\n  extra: 1\n", "default.extra", 4, "unknown key"),
        ("num_speculative_tokens: 3\ncontroller:\n  window: 10\n  min_samples: 20\n", "controller", 2,
         "min_samples (20) must not exceed window (10)"),
        ("num_speculative_tokens: 3\ncontroller:\n  min_speedup: 0.5\n", "controller.min_speedup", 3,
         "greater than or equal to 1"),
        ("num_speculative_tokens: 3\ncontroller:\n  probe_k: 4\n", None, None,
         "controller.probe_k (4) must not exceed num_speculative_tokens (3)"),
        ("num_speculative_tokens: 3\ndomains:\n  a:\n    draft: x\n    num_speculative_tokens: 5\n"
         "    match: {keywords: [x]}\n", None, None,
         "domains.a.num_speculative_tokens (5) must not exceed num_speculative_tokens (3)"),
    ],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and len(v) < 30 else None,
)
def test_schema_errors_name_key_file_and_line(tmp_path, yaml_text, key, line, fragment):
    path = write(tmp_path, yaml_text)
    issues = errors_of(path)
    issue = next((i for i in issues if i.key == key or (key is None and fragment in i.message)), None)
    assert issue is not None, [str(i) for i in issues]
    assert fragment in issue.message
    assert issue.file == str(path)
    if line is not None:
        assert issue.line == line
        assert f"{path}:{line}: {key}: " in str(DraftConfigError(issues))


def test_all_problems_reported_at_once(tmp_path):
    path = write(tmp_path, "num_speculative_tokens: -1\ncontroller:\n  window: 0\n  adaptive: maybe\n")
    assert {i.key for i in errors_of(path)} == {"num_speculative_tokens", "controller.window", "controller.adaptive"}


def test_yaml_syntax_error_has_line(tmp_path):
    path = write(tmp_path, "num_speculative_tokens: 3\ndomains:\n  a: [unclosed\n")
    (issue,) = errors_of(path)
    assert "not valid YAML" in issue.message and issue.line is not None


def test_not_a_mapping_and_missing_file(tmp_path):
    assert "YAML mapping" in errors_of(write(tmp_path, "- 1\n- 2\n"))[0].message
    (issue,) = errors_of(tmp_path / "nope.yaml")
    assert "cannot read" in issue.message and "nope.yaml" in str(issue)


@pytest.mark.parametrize(
    ("which", "fragment"),
    [
        ("missing", "does not exist"),
        ("pickled", "no *.safetensors weights; found pytorch_model.bin"),
        ("remote", "set trust_remote_code: true"),
        ("gpt2", "architecture GPT2LMHeadModel"),
        ("no_config", "has no config.json"),
    ],
)
def test_model_dir_errors(tmp_path, models, which, fragment):
    if which == "missing":
        draft = tmp_path / "does-not-exist"
    elif which == "no_config":
        draft = tmp_path / "empty"
        draft.mkdir()
    else:
        draft = models[which]
    path = write(tmp_path, f"""
        num_speculative_tokens: 3
        domains:
          support:
            match: {{keywords: [refund]}}
            draft: {draft}
    """)
    (issue,) = errors_of(path)
    assert issue.key == "domains.support.draft" and issue.line == 5
    assert fragment in issue.message


def test_trust_remote_code_allows_auto_map_but_architecture_still_checked(tmp_path, models):
    path = write(tmp_path, f"num_speculative_tokens: 3\ntrust_remote_code: true\ndefault:\n  draft: {models['remote']}\n")
    assert load_draft_config(path).trust_remote_code is True


def test_default_draft_dir_error_names_default_key(tmp_path):
    path = write(tmp_path, "num_speculative_tokens: 3\ndefault:\n  draft: ./nowhere\n")
    (issue,) = errors_of(path)
    assert issue.key == "default.draft" and issue.line == 3 and str(tmp_path / "nowhere") in issue.message


@pytest.mark.parametrize(("which", "fragment"), [("small_vocab", "vocab_size"), ("swapped", "tokenizer differs")])
def test_vocabulary_mismatch_with_target(tmp_path, models, which, fragment):
    path = write(tmp_path, f"""
        num_speculative_tokens: 3
        domains:
          code:
            draft: {models[which]}
            match: {{keywords: [def]}}
    """)
    config = load_draft_config(path)
    with pytest.raises(DraftConfigError) as info:
        check_against_target(config, models["target"])
    (issue,) = info.value.issues
    assert issue.key == "domains.code.draft" and issue.line == 4 and issue.file == str(path)
    assert fragment in issue.message


def test_compatible_draft_and_k_max_against_framework(tmp_path, models):
    path = write(tmp_path, f"num_speculative_tokens: 4\ndefault:\n  draft: {models['draft']}\n")
    config = load_draft_config(path)
    check_against_target(config, models["target"], framework_k=4)
    with pytest.raises(DraftConfigError) as info:
        check_against_target(config, models["target"], framework_k=3)
    (issue,) = info.value.issues
    assert issue.key == "num_speculative_tokens" and issue.line == 1
    assert "exceeds the framework's num_speculative_tokens=3" in issue.message


def test_parse_without_path_checks():
    config = parse_draft_config("num_speculative_tokens: 2\ndefault: {draft: /x}\n", check_paths=False)
    assert config.default.draft == "/x"


# ------------------------------------------------------------ regexes (RE2 only)


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        (r"(a)\1", "invalid escape sequence: \\1"),
        (r"(?P<x>a)(?P=x)", "invalid perl operator: (?P"),
        (r"foo(?=bar)", "invalid perl operator: (?="),
        (r"(?<!x)y", "invalid perl operator: (?<"),
        (r"a++", "bad repetition operator: ++"),
        (r"(?x) a", "invalid perl operator: (?x"),
        (r"end\Z", "invalid escape sequence: \\Z"),
    ],
)
def test_regex_re2_cannot_run_is_refused_with_pattern_line_and_syntax(tmp_path, pattern, fragment):
    path = write(tmp_path, f"""
        num_speculative_tokens: 3
        domains:
          a:
            draft: x
            match:
              regex:
                - 'fine \\d+'
                - '{pattern}'
    """)
    (issue,) = errors_of(path)
    assert issue.key == "domains.a.match.regex.1" and issue.line == 8
    assert f"regex {pattern!r} cannot be used" in issue.message and fragment in issue.message
    assert "RE2" in issue.message and "no backreferences" in issue.message


def test_regex_length_is_capped(tmp_path):
    from accel_plugin.speculative.draft_config import MAX_REGEX_CHARS

    long = "a" * (MAX_REGEX_CHARS + 1)
    path = write(tmp_path, f"num_speculative_tokens: 3\ndomains:\n  a:\n    draft: x\n    match: {{regex: ['{long}']}}\n")
    (issue,) = errors_of(path)
    assert issue.key == "domains.a.match.regex.0" and f"at most {MAX_REGEX_CHARS}" in issue.message
    assert long not in str(issue)  # the message does not repeat a kilobyte of pattern
    ok = write(tmp_path, f"num_speculative_tokens: 3\ndomains:\n  a:\n    draft: x\n    match: {{regex: ['{long[1:]}']}}\n")
    parse_draft_config(ok.read_text(), check_paths=False)


def test_inline_flags_and_unicode_classes_are_accepted():
    config = parse_draft_config(
        "num_speculative_tokens: 3\ndomains:\n  a:\n    draft: x\n"
        "    match: {regex: ['(?i)ticket #\\d+', '(?m)^def ', '(?s)a.b', '(?U)x+', '\\pL+ \\p{Greek}', '(?P<n>q)']}\n",
        check_paths=False,
    )
    assert len(config.domains["a"].match.regex) == 6


# ----------------------------------------------------- keys another setting ignores


@pytest.mark.parametrize(
    ("yaml_text", "key", "line", "fragment"),
    [
        ("num_speculative_tokens: 3\ndefault: {draft: D}\ncontroller:\n  adaptive: false\n  min_acceptance: 0.5\n",
         "controller.min_acceptance", 5, "has no effect with controller.adaptive: false"),
        ("num_speculative_tokens: 3\ndefault: {draft: D}\ncontroller:\n  adaptive: false\n  probe_k: 2\n",
         "controller.probe_k", 5, "remove it, or set adaptive: true"),
        (("num_speculative_tokens: 3\ndefault: {draft: D}\ncontroller:\n  verify_overhead: 0.1\n"
          "  calibration_interval: 16\n"), "controller.calibration_interval", 5, "remove one of the two"),
        (("num_speculative_tokens: 3\ndomains:\n  a:\n    draft: D\n    match: {keywords: [x]}\n"
          "default:\n  draft: null\n  num_speculative_tokens: 2\n"),
         "default.num_speculative_tokens", 8, "has no effect with default.draft: null"),
        ("num_speculative_tokens: 3\ndefault:\n  num_speculative_tokens: 2\n",
         "default.num_speculative_tokens", 3, "give default a draft"),
    ],
)
def test_keys_that_would_be_ignored_are_errors(tmp_path, models, yaml_text, key, line, fragment):
    path = write(tmp_path, yaml_text.replace("D", str(models["draft"])))
    issues = errors_of(path)
    assert [i.key for i in issues] == [key]
    assert issues[0].line == line and fragment in issues[0].message
    # the same check without paths (accel bench, the router)
    with pytest.raises(DraftConfigError):
        parse_draft_config(path.read_text(), check_paths=False)


def test_keys_that_still_apply_without_adaptive_are_accepted(tmp_path, models):
    path = write(tmp_path, f"""
        num_speculative_tokens: 3
        default: {{draft: {models['draft']}}}
        controller: {{adaptive: false, window: 64, log_interval_s: 0}}
        dtype: float32
    """)
    assert load_draft_config(path).controller.window == 64


def _repo_yaml_examples() -> list[tuple[str, str]]:
    """(where, text) of every draft YAML shipped in the repo: files, and docs' yaml blocks."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = [(str(f), f.read_text()) for d in ("demo_models", "examples", "demo") for f in sorted((root / d).rglob("*.y*ml"))]
    for doc in sorted((root / "docs").glob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.DOTALL)):
            out.append((f"{doc.name} block {i}", block))
    return [(where, text) for where, text in out if "num_speculative_tokens:" in text]


def test_every_example_yaml_in_the_repo_still_loads():
    examples = _repo_yaml_examples()
    assert len(examples) >= 4
    for where, text in examples:
        parse_draft_config(text, file=where, check_paths=False)


# --------------------------------------------------------------------- draft paths


def test_relative_draft_is_relative_to_the_yaml_folder_not_the_cwd(tmp_path, models, monkeypatch):
    conf_dir, cwd = tmp_path / "conf", tmp_path / "cwd"
    (cwd / "drafts").mkdir(parents=True)
    conf_dir.mkdir()
    shutil.copytree(models["draft"], cwd / "drafts" / "d")
    monkeypatch.chdir(cwd)
    path = conf_dir / "drafts.yaml"
    path.write_text("num_speculative_tokens: 3\ndefault:\n  draft: drafts/d\n")
    (issue,) = errors_of(path)
    assert issue.key == "default.draft" and issue.line == 3
    assert f"tried {conf_dir / 'drafts' / 'd'}" in issue.message
    assert f"resolved against the YAML file's folder {conf_dir}" in issue.message
    assert f"not the current directory (where {cwd / 'drafts' / 'd'} exists)" in issue.message
    shutil.copytree(models["draft"], conf_dir / "drafts" / "d")
    assert load_draft_config(path).default.draft == str(conf_dir / "drafts" / "d")


def test_tilde_symlink_and_dotdot_are_resolved_once(tmp_path, models, monkeypatch):
    home = tmp_path / "home"
    (home / "m").mkdir(parents=True)
    shutil.copytree(models["draft"], home / "m" / "real")
    (home / "m" / "link").symlink_to(home / "m" / "real")
    monkeypatch.setenv("HOME", str(home))
    path = home / "conf" / "drafts.yaml"
    path.parent.mkdir()
    path.write_text(
        "num_speculative_tokens: 3\n"
        "domains:\n"
        "  a: {draft: ~/m/link, match: {keywords: [x]}}\n"
        "  b: {draft: ../m/./link/../real, match: {keywords: [y]}}\n"
    )
    config = load_draft_config(path)
    real = str((home / "m" / "real").resolve())
    assert config.domains["a"].draft == real and config.domains["b"].draft == real


def test_missing_absolute_draft_names_what_was_tried(tmp_path, models):
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    path = write(tmp_path, f"num_speculative_tokens: 3\ndefault:\n  draft: {tmp_path / 'link'}\n")
    (issue,) = errors_of(path)
    assert f"tried {tmp_path / 'gone'} (resolved from {tmp_path / 'link'})" in issue.message
    assert "YAML file's folder" not in issue.message  # an absolute path is taken as written


# ------------------------------------------------------- trust_remote_code, per side


@pytest.mark.parametrize(("yaml_trust", "target_trust"), [(True, False), (False, True), (False, False)])
def test_trust_remote_code_of_the_yaml_applies_to_drafts_only(tmp_path, models, monkeypatch, yaml_trust, target_trust):
    from accel_plugin.models import dirs as model_dirs

    calls = []
    real = model_dirs.read_vocab

    def recording(model_dir, *, trust_remote_code=False):
        calls.append((str(model_dir), trust_remote_code))
        return real(model_dir, trust_remote_code=trust_remote_code)

    monkeypatch.setattr(model_dirs, "read_vocab", recording)
    path = write(tmp_path, f"num_speculative_tokens: 3\ntrust_remote_code: {str(yaml_trust).lower()}\n"
                           f"default:\n  draft: {models['draft']}\n")
    check_against_target(load_draft_config(path), models["target"], target_trust_remote_code=target_trust)
    assert calls == [(str(models["target"]), target_trust), (str(models["draft"].resolve()), yaml_trust)]


def test_target_trust_defaults_to_no_remote_code(tmp_path, models, monkeypatch):
    from accel_plugin.models import dirs as model_dirs

    flags = []
    monkeypatch.setattr(model_dirs, "read_vocab", lambda d, *, trust_remote_code=False: flags.append(trust_remote_code))
    path = write(tmp_path, f"num_speculative_tokens: 3\ntrust_remote_code: true\ndefault:\n  draft: {models['draft']}\n")
    check_against_target(load_draft_config(path), models["target"])
    assert flags[0] is False


# ------------------------------------------------------------------ prompt lookup

_LOOKUP_DOMAIN = "num_speculative_tokens: 4\ndomains:\n  repeat:\n    {body}\n    match: {{keywords: [rewrite]}}\n"


def test_a_domain_may_use_lookup_without_a_draft(tmp_path):
    config = parse_draft_config(_LOOKUP_DOMAIN.format(body="lookup: {min: 1, max: 3}")
                                + "default:\n  lookup: {}\n", file=tmp_path / "d.yaml")
    assert config.drafts() == {"repeat": None, DEFAULT_DOMAIN: None}
    lookups = config.lookups()
    assert (lookups["repeat"].min, lookups["repeat"].max, lookups["repeat"].occurrence) == (1, 3, "earliest")
    assert (lookups[DEFAULT_DOMAIN].min, lookups[DEFAULT_DOMAIN].max) == (2, 5)
    assert config.describe() == "repeat->lookup(1-3), default->lookup(2-5)"
    assert lookups["repeat"].spec_factor is None  # k drafts whatever the match, as vLLM's n-gram
    config = parse_draft_config(_LOOKUP_DOMAIN.format(body="lookup: {min: 1, max: 8, occurrence: latest, "
                                                           "spec_factor: 1.5}"), file=tmp_path / "d.yaml")
    assert config.lookups()["repeat"].spec_factor == 1.5
    assert config.describe() == "repeat->lookup(1-8 latest x1.5), default->none"


@pytest.mark.parametrize("body, key, message", [
    ("num_speculative_tokens: 2", "domains.repeat", "needs a draft (a draft model directory), a lookup"),
    ("lookup: {min: 4, max: 3}", "domains.repeat.lookup", "min (4) must not exceed max (3)"),
    ("lookup: {min: 0}", "domains.repeat.lookup.min", "greater than or equal to 1; got 0"),
    ("lookup: {max: 99}", "domains.repeat.lookup.max", "less than or equal to 32; got 99"),
    ("lookup: {min: 2, maximum: 5}", "domains.repeat.lookup.maximum", "valid keys here: min, max, occurrence, spec_factor"),
    ("lookup: {occurrence: first}", "domains.repeat.lookup.occurrence", "'earliest' or 'latest'"),
    ("lookup: 3", "domains.repeat.lookup", "valid dictionary"),
    ("lookup: {spec_factor: 0}", "domains.repeat.lookup.spec_factor", "greater than 0"),
    ("lookup: {spec_factor: 64}", "domains.repeat.lookup.spec_factor", "less than or equal to 32"),
    ("lookup: {spec_factor: many}", "domains.repeat.lookup.spec_factor", "valid number"),
])
def test_bad_lookup_values_name_the_valid_ones(body, key, message):
    with pytest.raises(DraftConfigError) as info:
        parse_draft_config(_LOOKUP_DOMAIN.format(body=body), check_paths=False)
    issues = {i.key: i.message for i in info.value.issues}
    assert key in issues and message in issues[key], issues


def test_lookup_entry_names_are_reserved():
    text = "num_speculative_tokens: 2\ndomains:\n  a/lookup:\n    lookup: {}\n    match: {keywords: [x]}\n"
    with pytest.raises(DraftConfigError, match="reserved for the prompt-lookup entries"):
        parse_draft_config(text, check_paths=False)
