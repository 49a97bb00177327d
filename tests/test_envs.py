import pytest

from accel_plugin import envs


@pytest.mark.parametrize("raw,expected", [(None, None), ("", None), ("flash", "flash"), ("PAGED", "paged"), (" auto ", "auto")])
def test_attention_backend_values(raw, expected):
    environ = {} if raw is None else {envs.ACCEL_ATTENTION_BACKEND: raw}
    assert envs.attention_backend(environ) == expected


def test_attention_backend_bad_value_names_valid_ones():
    with pytest.raises(envs.EnvVarError) as info:
        envs.attention_backend({envs.ACCEL_ATTENTION_BACKEND: "bogus"})
    message = str(info.value)
    assert "ACCEL_ATTENTION_BACKEND" in message and "'bogus'" in message
    for valid in envs.ATTENTION_BACKEND_CHOICES:
        assert valid in message


def test_plugin_allowlist():
    assert envs.plugin_allowlist({}) is None
    assert envs.plugin_allowlist({envs.ACCEL_PLUGINS: ""}) == frozenset()
    assert envs.plugin_allowlist({envs.ACCEL_PLUGINS: "a, b"}) == {"a", "b"}
    with pytest.raises(envs.EnvVarError, match="without empty items"):
        envs.plugin_allowlist({envs.ACCEL_PLUGINS: "a,,b"})


@pytest.mark.parametrize("raw,expected", [("1", True), ("off", False), ("", False)])
def test_trace(raw, expected):
    assert envs.trace_enabled({envs.ACCEL_TRACE: raw}) is expected


def test_trace_bad_value():
    with pytest.raises(envs.EnvVarError, match="true/false"):
        envs.trace_enabled({envs.ACCEL_TRACE: "maybe"})


def test_check_all_collects_every_error():
    errors = envs.check_all({envs.ACCEL_ATTENTION_BACKEND: "x", envs.ACCEL_TRACE: "y"})
    assert {e.name for e in errors} == {envs.ACCEL_ATTENTION_BACKEND, envs.ACCEL_TRACE}


def test_models_dir():
    assert envs.models_dir({}) is None
    assert envs.models_dir({envs.ACCEL_MODELS_DIR: "  "}) is None
    assert envs.models_dir({envs.ACCEL_MODELS_DIR: " /data/models "}) == "/data/models"


@pytest.mark.parametrize("raw,expected", [(None, True), ("", True), ("0", False), ("off", False), ("YES", True)])
def test_metrics_enabled(raw, expected):
    environ = {} if raw is None else {envs.ACCEL_METRICS: raw}
    assert envs.metrics_enabled(environ) is expected


def test_metrics_bad_values_name_valid_ones():
    with pytest.raises(envs.EnvVarError, match="ACCEL_METRICS='maybe'.*on/off"):
        envs.metrics_enabled({envs.ACCEL_METRICS: "maybe"})
    for raw in ("-1", "soon", "nan", "inf"):
        with pytest.raises(envs.EnvVarError, match="seconds >= 0"):
            envs.metrics_log_interval({envs.ACCEL_METRICS_LOG_INTERVAL: raw})


def test_metrics_log_interval_and_dir():
    assert envs.metrics_log_interval({}) == envs.DEFAULT_METRICS_LOG_INTERVAL == 10.0
    assert envs.metrics_log_interval({envs.ACCEL_METRICS_LOG_INTERVAL: "0"}) == 0.0
    assert envs.metrics_log_interval({envs.ACCEL_METRICS_LOG_INTERVAL: " 2.5 "}) == 2.5
    assert envs.metrics_dir({}) is None
    assert envs.metrics_dir({envs.ACCEL_METRICS_DIR: " /tmp/m "}) == "/tmp/m"


@pytest.mark.parametrize("getter, name", [(envs.models_dir, envs.ACCEL_MODELS_DIR),
                                          (envs.metrics_dir, envs.ACCEL_METRICS_DIR)])
def test_directory_settings_refuse_a_file_and_take_a_missing_directory(tmp_path, getter, name):
    a_file = tmp_path / "f"
    a_file.write_text("")
    with pytest.raises(envs.EnvVarError, match="valid values: a directory path .*this one is a file"):
        getter({name: str(a_file)})
    assert getter({name: str(tmp_path / "not-yet")}) == str(tmp_path / "not-yet")
    assert getter({name: str(tmp_path)}) == str(tmp_path) and getter({name: " "}) is None


@pytest.mark.parametrize("name, bad", [(envs.ACCEL_ATTENTION_BACKEND, "bogus"), (envs.ACCEL_PLUGINS, "a,,b"),
                                       (envs.ACCEL_TRACE, "maybe"), (envs.ACCEL_METRICS, "maybe"),
                                       (envs.ACCEL_TGI_PREPACK, "sometimes"), (envs.ACCEL_VLLM_PREPACK, "no!"),
                                       (envs.ACCEL_METRICS_LOG_INTERVAL, "-1")])
def test_the_table_drives_the_errors_and_check_all(name, bad):
    """ENV_VARS is the one list: its getter reads the variable, its valid values are the
    error's, and check_all goes through every row."""
    var = next(v for v in envs.ENV_VARS if v.name == name)
    with pytest.raises(envs.EnvVarError) as info:
        var.getter({name: bad})
    assert info.value.name == name and info.value.valid == var.valid
    assert [e.name for e in envs.check_all({name: bad})] == [name]


def test_the_table_names_each_variable_once():
    names = [v.name for v in envs.ENV_VARS]
    assert len(set(names)) == len(names)
    assert set(names) == {n for n in envs.__all__ if n.startswith("ACCEL_")}


def _environ_reads_outside_envs():
    """{file: [(line, name)]} of every read of an ENV_VARS variable in the package outside
    accel_plugin/envs.py: ``.get``/``getenv``/a subscript with its name as a literal (on
    any mapping) or as an ``envs.`` constant on something called ``*environ*``. Writes
    (``environ[name] = ...``), removals from a child's environment and the TGI ``.pth``
    line (a string of code) are not reads here."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    names = {v.name for v in envs.ENV_VARS}

    def receiver(node) -> str:
        return ast.unparse(node)

    def read_key(node):
        """(receiver, key) when ``node`` reads a mapping or getenv by a key, else None."""
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            return receiver(node.value), node.slice
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "getenv"):
                return receiver(func.value), node.args[0]
            if isinstance(func, ast.Name) and func.id == "getenv":
                return "os", node.args[0]
        return None

    found: dict[str, list[tuple[int, str]]] = {}
    for folder in ("accel_plugin", "adapters", "kernels"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == root / "accel_plugin" / "envs.py" or "__pycache__" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                read = read_key(node)
                if read is None:
                    continue
                what, key = read
                if isinstance(key, ast.Constant) and key.value in names:
                    name = key.value
                elif isinstance(key, ast.Attribute) and key.attr in names and "environ" in what:
                    name = key.attr
                else:
                    continue
                found.setdefault(str(path.relative_to(root)), []).append((node.lineno, name))
    return found


#: the reads outside envs.py that docs/configuration.md describes, and why none is a setting's value
NOT_VALUE_READS = {
    "adapters/vllm/__init__.py": "register() acts only when an ACCEL_* setting asks it to: whether one is set",
    # ACCEL_METRICS_DIR as the package itself set it for its workers: its undo compares and restores it
    "accel_plugin/observability/metrics_files.py": "unexport_dir() removes the directory it exported, if unchanged",
    "adapters/vllm/_process_state.py": "the patch ledger's snapshot of ACCEL_METRICS_DIR, restored on undo",
}


def test_values_are_read_only_through_envs():
    """docs/configuration.md: each variable's value is read in accel_plugin/envs.py; the rest of
    the package calls its getters, only looks whether a variable is set, or undoes a variable it set
    itself (NOT_VALUE_READS)."""
    reads = _environ_reads_outside_envs()
    unexpected = {f: lines for f, lines in reads.items() if f not in NOT_VALUE_READS}
    assert not unexpected, ("read these through accel_plugin.envs' getters (or, for a check that a variable "
                            f"is set or an undo, add the file to NOT_VALUE_READS and say so in docs/configuration.md): {unexpected}")
